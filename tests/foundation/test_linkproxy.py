"""The link proxy of simulated regions (astraflow.net.linkproxy), on loopback: bytes arrive intact and
in order through jitter and loss, no earlier than the link's delay, and every byte is counted."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from astraflow.net.linkproxy import SEGMENT, Link, LinkProxy, Route, lost_segments, read_stats


async def _echo_server() -> tuple[asyncio.Server, int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _through_proxy(link: Link, payload: list[bytes], stats: Path) -> tuple[bytes, float, float]:
    """Send `payload` chunk by chunk through a proxy to an echo server; (echoed, first-byte s, total s)."""
    server, port = await _echo_server()
    proxy = LinkProxy([Route(("127.0.0.1", 0), ("127.0.0.1", port))], link, stats, seed=7)
    await proxy.start()
    proxy_port = proxy.servers[0].sockets[0].getsockname()[1]
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
    for chunk in payload:
        writer.write(chunk)
        await writer.drain()
    writer.write_eof()
    first = await reader.readexactly(1)
    first_s = time.monotonic() - started
    rest = await reader.read()
    total_s = time.monotonic() - started
    writer.close()
    await asyncio.sleep(0.05)  # let the proxy count the last write
    proxy.write_stats()
    for s in (*proxy.servers, server):
        s.close()
    return first + rest, first_s, total_s


def test_bytes_arrive_in_order_through_jitter_and_loss_and_are_counted(tmp_path: Path) -> None:
    payload = [i.to_bytes(4, "big") * 500 for i in range(200)]
    link = Link(delay_ms=5, jitter_ms=20, loss=0.05)
    echoed, _, _ = asyncio.run(_through_proxy(link, payload, tmp_path / "stats.json"))
    assert echoed == b"".join(payload)
    (route,) = read_stats(tmp_path / "stats.json").values()
    assert route.bytes_up == route.bytes_down == len(b"".join(payload))
    assert route.connections == 1 and route.open == 0 and route.stalls > 0


def test_a_reply_takes_at_least_the_handshake_and_a_round_trip(tmp_path: Path) -> None:
    link = Link(delay_ms=60)
    _, first_s, _ = asyncio.run(_through_proxy(link, [b"ping"], tmp_path / "stats.json"))
    # the handshake's round trip, then the request's one-way delay and the reply's
    assert first_s >= 4 * 0.060


def test_loss_is_per_segment() -> None:
    rng = random.Random(1)
    assert not any(lost_segments(SEGMENT * 100, 0.0, rng) for _ in range(100))
    one = sum(lost_segments(SEGMENT, 0.01, rng) for _ in range(20_000)) / 20_000
    many = sum(lost_segments(SEGMENT * 50, 0.01, rng) for _ in range(20_000)) / 20_000
    assert one == pytest.approx(0.01, abs=0.004)
    assert many == pytest.approx(1 - 0.99**50, abs=0.02)


def test_routes_parse_and_refuse_nonsense() -> None:
    assert Route.parse("127.0.0.1:9092=10.0.0.1:9093") == Route(("127.0.0.1", 9092), ("10.0.0.1", 9093))
    with pytest.raises(ValueError, match="LISTEN_HOST"):
        Route.parse("127.0.0.1:9092")
    with pytest.raises(ValueError, match="HOST:PORT"):
        Route.parse("127.0.0.1=10.0.0.1:x")
