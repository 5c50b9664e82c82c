"""HTTP access to a weight store: the trainer serves its store directory so that workers in other
regions (without the shared filesystem) fetch snapshots and deltas with resumable ranged GETs.

Read-only, files under the root only (no listings, no `..`), single byte ranges (`bytes=a-b`,
`bytes=a-`, `bytes=-n`) answered with 206 and Content-Range. Integrity does not depend on the
transport: readers check every file against the sha256 carried by the (authenticated) Kafka
event. Confidentiality does: a bearer token keeps casual readers out. The token is the one the
readers send, ASTRAFLOW_WEIGHTS_TOKEN, unless given explicitly; `astraflow run --secure` sets it
for the trainers and workers only. With a certificate (`tls_cert`, or ASTRAFLOW_WEIGHTS_TLS_CERT: one
PEM holding the key and the chain) it serves https://, so the token and the weights do not cross the
network in the clear; readers check it against ASTRAFLOW_WEIGHTS_CA. `astraflow run --secure` makes
such a certificate with the broker's CA.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import ssl
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO

from astraflow.weights.transport import TOKEN_ENV

log = logging.getLogger(__name__)
TLS_CERT_ENV = "ASTRAFLOW_WEIGHTS_TLS_CERT"
RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s %s", self.address_string(), format % args)

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        token = self.server.token
        if token and not hmac.compare_digest(self.headers.get("Authorization", ""), f"Bearer {token}"):
            self._error(401, "missing or wrong bearer token")
            return
        path = self._resolve()
        if path is None:
            self._error(404, "not found")
            return
        size = path.stat().st_size
        start, end = 0, size - 1
        status = 200
        header = self.headers.get("Range")
        if header:
            m = RANGE_RE.match(header.strip())
            if not m or (not m.group(1) and not m.group(2)):
                self._error(416, "only single byte ranges are supported", size)
                return
            if m.group(1):
                start = int(m.group(1))
                end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            else:  # suffix range: the last n bytes
                start = max(size - int(m.group(2)), 0)
            if start >= size or start > end:
                self._error(416, "range not satisfiable", size)
                return
            status = 206
            self.server.count(ranged=1)
        length = end - start + 1 if size else 0
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(length))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if body and length:
            with open(path, "rb") as fh:
                fh.seek(start)
                self._copy(fh, length)

    def _copy(self, fh: BinaryIO, length: int) -> None:
        limit = self.server.cut_after  # test hook: break the connection mid-body once
        if limit is not None and length > limit:
            self.server.cut_after = None
            self.server.count(sent=limit)
            self.wfile.write(fh.read(limit))
            self.wfile.flush()
            self.close_connection = True
            return
        remaining = length
        while remaining:
            chunk = fh.read(min(remaining, 1 << 20))
            if not chunk:
                break
            self.server.count(sent=len(chunk))  # counted before the client can see it
            self.wfile.write(chunk)
            remaining -= len(chunk)

    def _resolve(self) -> Path | None:
        rel = urllib.parse.unquote(urllib.parse.urlparse(self.path).path).lstrip("/")
        if not rel or any(part in ("", ".", "..") for part in rel.split("/")):
            return None
        path = (self.server.root / rel).resolve()
        if not path.is_relative_to(self.server.root) or not path.is_file() or path.name.startswith("."):
            return None
        return path

    def _error(self, code: int, message: str, size: int | None = None) -> None:
        body = (message + "\n").encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        if size is not None:
            self.send_header("Content-Range", f"bytes */{size}")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    root: Path
    token: str | None
    cut_after: int | None
    ranged = sent = 0
    lock = threading.Lock()

    def count(self, ranged: int = 0, sent: int = 0) -> None:
        with self.lock:
            self.ranged += ranged
            self.sent += sent


class _TLSServer(_Server):
    tls: ssl.SSLContext

    def finish_request(self, request: Any, client_address: Any) -> None:
        # the handshake runs here, in the request's own thread, so a slow client never stalls accept()
        with self.tls.wrap_socket(request, server_side=True) as conn:
            super().finish_request(conn, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.info("weight server: connection from %s failed: %s", client_address, sys.exc_info()[1])


class WeightServer:
    """Serves a store root over HTTP(S) in a background thread. `url` is what events advertise."""

    def __init__(self, root: str | Path, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 advertise_host: str | None = None, tls_cert: str | Path | None = None) -> None:
        tls_cert = tls_cert or os.environ.get(TLS_CERT_ENV) or None
        self._server: _Server
        if tls_cert:
            tls = _TLSServer((host, port), _Handler)
            tls.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            tls.tls.load_cert_chain(str(tls_cert))
            self._server = tls
        else:
            self._server = _Server((host, port), _Handler)
        self._server.root = Path(root).resolve()
        # the same variable the readers send (transport.TOKEN_ENV), so a run sets one secret for both
        self._server.token = token if token is not None else (os.environ.get(TOKEN_ENV) or None)
        self._server.cut_after = None
        self.port = self._server.server_address[1]
        self.url = f"{'https' if tls_cert else 'http'}://{advertise_host or host}:{self.port}/"
        self._thread = threading.Thread(target=self._server.serve_forever, name="weight-server", daemon=True)

    def start(self) -> WeightServer:
        self._thread.start()
        return self

    def break_next_transfer(self, after_bytes: int) -> None:
        """Fault injection for tests: the next body longer than `after_bytes` stops after them."""
        self._server.cut_after = after_bytes

    @property
    def ranged_requests(self) -> int:
        """Requests answered with a byte range so far."""
        return self._server.ranged

    @property
    def bytes_sent(self) -> int:
        """Body bytes sent so far."""
        return self._server.sent

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> WeightServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
