"""A userspace TCP link proxy that makes a fast local path behave like a slow wide-area link:
one-way delay, jitter and loss-like stalls on every byte that crosses it, with byte counters.

It sits on a region's path to the Kafka broker and to the trainers' weight servers
(`astraflow.net.regions` runs one inside each simulated region). This machine's kernel has no
netem qdisc, so delay cannot come from `tc`; rate limiting does (`tbf` on the region's veth).

How each effect is made, and how it differs from a real link:

- **Delay and jitter.** Each chunk read from one side is written to the other side no earlier
  than `delay + U(0, jitter)` after it arrived, and never before the chunk ahead of it (TCP does
  not reorder what it delivers). A new connection's first bytes wait one extra round trip, the
  cost of the SYN/SYN-ACK handshake the proxy hides by accepting locally.
- **Loss.** TCP never shows loss to applications; they see the retransmission stall. So each
  1448-byte segment of a chunk is "lost" with probability `loss`, and a chunk with a lost segment
  (and everything behind it) is held back by one retransmission: max(200 ms, one round trip),
  Linux's minimum RTO or a fast retransmit. Connections are never dropped for loss.
- **Partitions** are made below the proxy, on the region's veth (`regions.Region.partition`), so
  the proxy's real kernel TCP connections see real retransmission backoff.

Counters (connections, bytes each way, stalls) go to a JSON stats file, rewritten twice a second
and on exit, which tests read to prove that a region's traffic crossed the link.

    python -m astraflow.net.linkproxy --route 127.0.0.1:9092=10.0.0.1:9092 --delay-ms 150 \\
        --jitter-ms 20 --loss 0.005 --stats /tmp/link.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

SEGMENT = 1448  # bytes of TCP payload in one 1500-byte Ethernet frame
MIN_RTO_S = 0.2  # Linux's TCP_RTO_MIN
CHUNK = 64 << 10
WINDOW = 8 << 20  # bytes one direction may hold in flight: the proxy's "receive window"


@dataclass(frozen=True)
class Link:
    """What one direction of the link does to the bytes crossing it."""

    delay_ms: float = 0.0
    """One-way delay."""
    jitter_ms: float = 0.0
    """Extra one-way delay, uniform in [0, jitter_ms], without reordering."""
    loss: float = 0.0
    """Probability that a segment is lost, simulated as a retransmission stall."""

    def stall_s(self) -> float:
        return max(MIN_RTO_S, 2 * self.delay_ms / 1000)


@dataclass(frozen=True)
class Route:
    listen: tuple[str, int]
    target: tuple[str, int]

    @classmethod
    def parse(cls, text: str) -> Route:
        """`LISTEN_HOST:PORT=TARGET_HOST:PORT`."""
        listen, _, target = text.partition("=")
        if not target:
            raise ValueError(f"route {text!r}: expected LISTEN_HOST:PORT=TARGET_HOST:PORT")
        return cls(_hostport(listen), _hostport(target))

    @property
    def name(self) -> str:
        return f"{self.listen[0]}:{self.listen[1]}"


def _hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{text!r}: expected HOST:PORT")
    return host, int(port)


@dataclass
class RouteStats:
    target: str
    connections: int = 0
    open: int = 0
    bytes_up: int = 0
    """Client to target (from the region to the broker or weight server)."""
    bytes_down: int = 0
    """Target to client (into the region)."""
    stalls: int = 0
    """Chunks held back by a simulated lost segment."""
    connect_errors: int = 0


@dataclass
class ProxyStats:
    link: dict[str, float]
    routes: dict[str, RouteStats] = field(default_factory=dict)
    started: float = field(default_factory=time.time)

    def write(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "link": self.link,
                    "started": self.started,
                    "time": time.time(),
                    "routes": {k: asdict(v) for k, v in self.routes.items()},
                },
                indent=1,
            )
        )
        tmp.replace(path)


def lost_segments(nbytes: int, loss: float, rng: random.Random) -> bool:
    """Whether any of the segments carrying `nbytes` is lost."""
    if loss <= 0:
        return False
    segments = max(1, math.ceil(nbytes / SEGMENT))
    return rng.random() < 1 - (1 - loss) ** segments


class _Pipe:
    """One direction of one connection: reads chunks, delivers each at its due time, in order."""

    def __init__(
        self, link: Link, rng: random.Random, counter: RouteStats, up: bool, ready_at: float
    ) -> None:
        self.link = link
        self.rng = rng
        self.counter = counter
        self.up = up
        self.queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        self.held = 0
        self.room = asyncio.Event()
        self.room.set()
        self.ready_at = ready_at  # nothing is sent before the (simulated) handshake is over
        self.last_due = 0.0

    def due(self, nbytes: int) -> float:
        link = self.link
        due = (
            max(time.monotonic(), self.ready_at)
            + (link.delay_ms + self.rng.uniform(0, link.jitter_ms)) / 1000
        )
        if lost_segments(nbytes, link.loss, self.rng):
            self.counter.stalls += 1
            due += link.stall_s()
        self.last_due = max(self.last_due, due)
        return self.last_due

    async def read(self, reader: asyncio.StreamReader) -> None:
        try:
            while data := await reader.read(CHUNK):
                await self.room.wait()
                self.held += len(data)
                if self.held >= WINDOW:
                    self.room.clear()
                self.queue.put_nowait((self.due(len(data)), data))
        except (ConnectionError, OSError):
            pass
        finally:
            self.queue.put_nowait(None)

    async def write(self, writer: asyncio.StreamWriter) -> None:
        try:
            while (item := await self.queue.get()) is not None:
                due, data = item
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
                self.held -= len(data)
                if self.held < WINDOW:
                    self.room.set()
                if self.up:
                    self.counter.bytes_up += len(data)
                else:
                    self.counter.bytes_down += len(data)
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            pass


class LinkProxy:
    def __init__(
        self, routes: list[Route], link: Link, stats_path: Path | None = None, seed: int | None = None
    ) -> None:
        self.routes = routes
        self.link = link
        self.stats_path = stats_path
        self.rng = random.Random(seed)
        self.stats = ProxyStats(link=asdict(link))
        self.servers: list[asyncio.Server] = []

    async def start(self) -> None:
        for route in self.routes:
            counter = self.stats.routes.setdefault(
                route.name, RouteStats(target=f"{route.target[0]}:{route.target[1]}")
            )

            async def handle(
                reader: asyncio.StreamReader,
                writer: asyncio.StreamWriter,
                route: Route = route,
                counter: RouteStats = counter,
            ) -> None:
                await self._connection(route, counter, reader, writer)

            self.servers.append(
                await asyncio.start_server(handle, route.listen[0], route.listen[1], reuse_address=True)
            )

    async def _connection(
        self,
        route: Route,
        counter: RouteStats,
        c_reader: asyncio.StreamReader,
        c_writer: asyncio.StreamWriter,
    ) -> None:
        counter.connections += 1
        counter.open += 1
        # the handshake a real link would cost: the client's first bytes arrive one round trip later
        accepted = time.monotonic()
        try:
            t_reader, t_writer = await asyncio.open_connection(*route.target)
        except OSError:
            counter.connect_errors += 1
            counter.open -= 1
            c_writer.close()
            return
        up = _Pipe(self.link, self.rng, counter, True, accepted + 2 * self.link.delay_ms / 1000)
        down = _Pipe(self.link, self.rng, counter, False, accepted)
        try:
            await asyncio.gather(
                up.read(c_reader), up.write(t_writer), down.read(t_reader), down.write(c_writer)
            )
        finally:
            counter.open -= 1
            for w in (c_writer, t_writer):
                with contextlib.suppress(Exception):
                    w.close()

    async def serve(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            while not stop.is_set():
                self.write_stats()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
        finally:
            for server in self.servers:
                server.close()
            self.write_stats()

    def write_stats(self) -> None:
        if self.stats_path is not None:
            self.stats.write(self.stats_path)


def read_stats(path: Path) -> dict[str, RouteStats]:
    """The counters a proxy last wrote, by route (`listen host:port`)."""
    data = json.loads(path.read_text())
    return {name: RouteStats(**v) for name, v in data["routes"].items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m astraflow.net.linkproxy", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--route",
        action="append",
        required=True,
        type=Route.parse,
        help="LISTEN_HOST:PORT=TARGET_HOST:PORT (repeatable)",
    )
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay")
    parser.add_argument(
        "--jitter-ms", type=float, default=0.0, help="extra one-way delay, uniform in [0, this]"
    )
    parser.add_argument(
        "--loss", type=float, default=0.0, help="segment loss probability (simulated as stalls)"
    )
    parser.add_argument("--stats", type=Path, default=None, help="JSON file the counters are written to")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    if not 0 <= args.loss < 1:
        parser.error("--loss must be in [0, 1)")
    proxy = LinkProxy(args.route, Link(args.delay_ms, args.jitter_ms, args.loss), args.stats, args.seed)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await proxy.serve(stop)

    print(
        f"linkproxy {os.getpid()}: "
        f"{', '.join(f'{r.name} -> {r.target[0]}:{r.target[1]}' for r in args.route)}",
        flush=True,
    )
    asyncio.run(run())


if __name__ == "__main__":
    main()
