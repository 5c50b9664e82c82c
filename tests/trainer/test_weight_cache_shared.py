"""Workers of one host share a weight cache (`<run dir>/cache/weights`): several fetching the same
file over HTTP at once all get it (before, they appended to one `.part` file and all but the first
to rename it failed with FileNotFoundError; seen with two workers of a simulated region)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from astraflow.weights import transport

BODY = os.urandom(256 << 10)


class SlowFile(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        start = int(self.headers.get("Range", "bytes=0-")[6:].split("-")[0] or 0)
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(BODY) - start))
        self.end_headers()
        for i in range(start, len(BODY), 32 << 10):
            self.wfile.write(BODY[i : i + (32 << 10)])
            time.sleep(0.02)

    def log_message(self, *args: object) -> None:
        pass


def test_workers_sharing_a_cache_all_get_a_file_fetched_at_once(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowFile)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri = f"http://127.0.0.1:{server.server_address[1]}/w.bin"
        sha = hashlib.sha256(BODY).hexdigest()
        with ThreadPoolExecutor(4) as pool:
            got = list(
                pool.map(lambda _: transport.read_verified(uri, sha, tmp_path, size=len(BODY)), range(4))
            )
    finally:
        server.shutdown()
        server.server_close()
    assert all(g == BODY for g in got)
    assert (tmp_path / sha).read_bytes() == BODY and not (tmp_path / f"{sha}.part").exists()
