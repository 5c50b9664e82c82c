"""What a simulated region's link measures like from inside the region: TCP round-trip time of
small requests and bulk throughput, through the link proxy and, for the rate limit alone, straight
over the veth. Used by bench/wan.py; a probe server runs in the host namespace and a probe client
(this module's `client`) in the region.

Protocol: the client's first byte is `e` (echo 100-byte messages until EOF) or `b` followed by an
8-byte length (the server sends that many bytes and closes).
"""

from __future__ import annotations

import json
import socket
import statistics
import sys
import threading
import time
from typing import Any


def serve(host: str) -> tuple[socket.socket, int]:
    """Start the probe server on `host` (daemon threads); returns its socket and port."""
    listener = socket.create_server((host, 0))

    def handle(conn: socket.socket) -> None:
        with conn:
            kind = conn.recv(1)
            if kind == b"e":
                while data := conn.recv(1 << 16):
                    conn.sendall(data)
            elif kind == b"b":
                want = int.from_bytes(_recv_exactly(conn, 8), "big")
                block = b"x" * (1 << 20)
                while want > 0:
                    conn.sendall(block[:want])
                    want -= min(want, len(block))

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener, int(listener.getsockname()[1])


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed early")
        buf += chunk
    return buf


def probe(host: str, port: int, pings: int = 30, bulk_bytes: int = 16 << 20) -> dict[str, Any]:
    """Round trips of 100-byte messages on one connection, then a bulk download."""
    t0 = time.monotonic()
    conn = socket.create_connection((host, port), timeout=60)
    conn.sendall(b"e" + b"p" * 100)
    _recv_exactly(conn, 100)
    first = time.monotonic() - t0
    rtts = []
    for _ in range(pings):
        t = time.monotonic()
        conn.sendall(b"p" * 100)
        _recv_exactly(conn, 100)
        rtts.append(time.monotonic() - t)
    conn.close()
    bulk = socket.create_connection((host, port), timeout=120)
    t = time.monotonic()
    bulk.sendall(b"b" + bulk_bytes.to_bytes(8, "big"))
    got = 0
    while chunk := bulk.recv(1 << 20):
        got += len(chunk)
    secs = time.monotonic() - t
    bulk.close()
    rtts.sort()
    return {
        "connect_and_first_reply_ms": round(first * 1000, 1),
        "rtt_ms_median": round(statistics.median(rtts) * 1000, 2),
        "rtt_ms_p90": round(rtts[int(0.9 * (len(rtts) - 1))] * 1000, 2),
        "rtt_ms_max": round(rtts[-1] * 1000, 1),
        "bulk_mbit_s": round(got * 8 / secs / 1e6, 2),
        "bulk_bytes": got,
    }


if __name__ == "__main__":  # the client, run inside a region: host port [host port ...] -> JSON lines
    args = sys.argv[1:]
    for i in range(0, len(args), 2):
        print(
            json.dumps({"target": f"{args[i]}:{args[i + 1]}", **probe(args[i], int(args[i + 1]))}), flush=True
        )
