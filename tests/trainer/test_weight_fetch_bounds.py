"""Weight fetches are bounded: an event that points at /dev/zero, a FIFO, an endless HTTP body or a
file of another size than it names is refused fast, with a reason, and the held weights stay."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from astraflow.records import WeightVersion
from astraflow.weights import HeldWeights, WeightIntegrityError, WeightStore, fetch_weights, transport
from tests.trainer.helpers import assert_bit_identical, nudge, tiny_model

#: version 0 as a worker holds it, and the event of version 1 (a delta on it)
TwoVersions = tuple[HeldWeights, WeightVersion]


@pytest.fixture()
def two_versions(tmp_path: Path) -> TwoVersions:
    model, gen = tiny_model(), torch.Generator().manual_seed(3)
    store = WeightStore(tmp_path / "store", "p", snapshot_every=100)
    first = store.publish(model.state_dict(), 0)
    nudge(model, gen)
    second = store.publish(model.state_dict(), 1)
    return fetch_weights(first, None), second


def _refused_fast(event: WeightVersion, held: HeldWeights | None, match: str) -> None:
    before = None if held is None else {k: v.clone() for k, v in held.state.items()}
    t0 = time.monotonic()
    with pytest.raises(WeightIntegrityError, match=match):
        fetch_weights(event, held)
    assert time.monotonic() - t0 < 5.0
    if held is not None:
        assert held.version == 0
        assert_bit_identical(held.state, before)


def test_an_event_pointing_at_dev_zero_is_refused(two_versions: TwoVersions) -> None:
    held, event = two_versions
    _refused_fast(
        dataclasses.replace(
            event,
            snapshot_uri="/dev/zero",
            delta_uri=None,
            delta_base=None,
            delta_sha256=None,
            delta_bytes=None,
        ),
        held,
        "not a regular file",
    )
    _refused_fast(dataclasses.replace(event, delta_uri="file:///dev/zero"), held, "not a regular file")


def test_an_event_pointing_at_a_fifo_is_refused_without_blocking(
    two_versions: TwoVersions, tmp_path: Path
) -> None:
    held, event = two_versions
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # no writer ever opens it: a plain open() for reading would wait forever
    _refused_fast(dataclasses.replace(event, snapshot_uri=str(fifo)), None, "not a regular file")
    _refused_fast(dataclasses.replace(event, delta_uri=str(fifo)), held, "not a regular file")


def test_a_file_longer_or_shorter_than_the_event_says_is_refused(two_versions: TwoVersions) -> None:
    held, event = two_versions
    assert event.delta_bytes is not None  # version 1 is a delta
    _refused_fast(dataclasses.replace(event, delta_bytes=event.delta_bytes - 10), held, "longer than")
    _refused_fast(
        dataclasses.replace(event, snapshot_bytes=event.snapshot_bytes + 10), None, "the event names"
    )
    _refused_fast(dataclasses.replace(event, snapshot_bytes=0), None, "no snapshot size")
    assert fetch_weights(event, held).version == 1  # the true sizes still load


class _Endless(BaseHTTPRequestHandler):
    """Sends 200 without a Content-Length and then zeros until the client hangs up."""

    sent = 0

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Connection", "close")
        self.end_headers()
        chunk = b"\0" * 65536
        try:
            while True:
                self.wfile.write(chunk)
                type(self).sent += len(chunk)
        except OSError:
            pass


class _Liar(_Endless):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(1 << 40))
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(b"\0" * 1000)


@pytest.fixture(params=[_Endless, _Liar])
def hostile_server(request: pytest.FixtureRequest) -> Iterator[tuple[str, type[_Endless]]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), request.param)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/w.bin", request.param
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("cache", [False, True])
def test_an_endless_http_body_is_refused_at_the_expected_size(
    two_versions: TwoVersions,
    hostile_server: tuple[str, type[_Endless]],
    tmp_path: Path,
    cache: bool,
) -> None:
    held, event = two_versions
    url, handler = hostile_server
    handler.sent = 0
    cache_dir = tmp_path / "cache" if cache else None
    t0 = time.monotonic()
    with pytest.raises(WeightIntegrityError, match="expected; refused"):
        transport.read_verified(url, "0" * 64, cache_dir, size=100_000)
    assert time.monotonic() - t0 < 5.0
    assert handler.sent < 64 << 20  # it hung up long before the server could send much more
    if cache:
        assert not list(cache_dir.iterdir())  # nothing oversized is kept to resume from
    bad = dataclasses.replace(
        event, snapshot_uri=url, delta_uri=None, delta_base=None, delta_sha256=None, delta_bytes=None
    )
    _refused_fast(bad, held, "expected; refused")
