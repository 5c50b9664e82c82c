"""Extra broker listeners (one per simulated region, astraflow.net.regions): bound where the region's
link arrives, advertised at the address the region's clients use, refused when malformed."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.broker import launcher
from astraflow.errors import BrokerError


def props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def test_a_region_listener_binds_its_link_and_is_advertised_at_the_proxy(tmp_path: Path) -> None:
    p = props(
        launcher.server_properties(
            tmp_path, 9092, 9093, listeners={"REGION_EU": "10.213.0.1:19092=127.0.0.1:19092"}
        )
    )
    assert (
        p["listeners"]
        == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093,REGION_EU://10.213.0.1:19092"
    )
    assert p["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9092,REGION_EU://127.0.0.1:19092"
    assert p["listener.security.protocol.map"].endswith(",REGION_EU:PLAINTEXT")
    assert p["inter.broker.listener.name"] == "PLAINTEXT"
    same = props(launcher.server_properties(tmp_path, 9092, 9093, listeners={"EU": "10.213.0.1:19092"}))
    assert same["advertised.listeners"].endswith(",EU://10.213.0.1:19092")


@pytest.mark.parametrize(
    "name, spec",
    [
        ("eu", "10.0.0.1:1=127.0.0.1:1"),
        ("PLAINTEXT", "10.0.0.1:1"),
        ("EU", "10.0.0.1=127.0.0.1:1"),
        ("EU", "10.0.0.1:1=127.0.0.1"),
    ],
)
def test_malformed_listeners_are_refused(tmp_path: Path, name: str, spec: str) -> None:
    with pytest.raises(BrokerError, match="listener"):
        launcher.server_properties(tmp_path, 9092, 9093, listeners={name: spec})
