"""HTTP access to a weight store: the trainer serves its store directory so that workers in other
regions (without the shared filesystem) fetch snapshots and deltas with resumable ranged GETs.

An aiohttp application on its own event loop in a daemon thread (the trainer that owns it is
synchronous). `web.FileResponse` answers GET and HEAD, single byte ranges (`bytes=a-b`, `bytes=a-`,
`bytes=-n`) with 206 and Content-Range, and anything else in a Range header (several ranges, a range
past the end) with 416 and `Content-Range: bytes */SIZE`. Read-only, regular files under the root
only: no listings, no `..`, no dot-files (the store's temp files); 404 otherwise.

Integrity does not depend on the transport: readers check every file against the sha256 carried by
the (authenticated) Kafka event. Confidentiality does: a bearer token keeps casual readers out. The
token is the one the readers send, ASTRAFLOW_WEIGHTS_TOKEN, unless given explicitly; `astraflow run
--secure` sets it for the trainers and workers only. With a certificate (`tls_cert`, or
ASTRAFLOW_WEIGHTS_TLS_CERT: one PEM holding the key and the chain) it serves https://, so the token
and the weights do not cross the network in the clear; readers check it against
ASTRAFLOW_WEIGHTS_CA. `astraflow run --secure` makes such a certificate with the broker's CA.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import socket
import ssl
import threading
from pathlib import Path
from typing import IO, Any

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

from astraflow.weights.transport import TOKEN_ENV

log = logging.getLogger(__name__)
TLS_CERT_ENV = "ASTRAFLOW_WEIGHTS_TLS_CERT"
#: How long close() lets transfers in flight finish before cutting them (it returns within about twice
#: this): a slow reader must not hold up the trainer's exit.
SHUTDOWN_GRACE_S = 0.5


class _File(web.FileResponse):
    """A file body that the test hook (`break_next_transfer`) may cut short after `cut` bytes."""

    cut: int | None = None

    async def _sendfile(
        self, request: web.BaseRequest, fobj: IO[Any], offset: int, count: int
    ) -> AbstractStreamWriter:
        # aiohttp's one path for a non-empty GET body (sendfile or chunks); were it renamed, the hook's
        # test would see no broken transfer and fail. Preparing here sends the headers and runs
        # WeightServer._count, which sets `cut`; the prepare() inside _sendfile then returns the same writer.
        await web.StreamResponse.prepare(self, request)
        if self.cut is None:
            return await super()._sendfile(request, fobj, offset, count)
        writer = await super()._sendfile(request, fobj, offset, self.cut)
        if (
            request.transport is not None
        ):  # the headers promised `count` bytes: the reader sees a broken transfer
            request.transport.close()
        return writer


class WeightServer:
    """Serves a store root over HTTP(S) in a background thread. `url` is what events advertise."""

    def __init__(
        self,
        root: str | Path,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        advertise_host: str | None = None,
        tls_cert: str | Path | None = None,
    ) -> None:
        tls_cert = tls_cert or os.environ.get(TLS_CERT_ENV) or None
        self._tls: ssl.SSLContext | None = None
        if tls_cert:
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(str(tls_cert))
        self._root = Path(root).resolve()
        # the same variable the readers send (transport.TOKEN_ENV), so a run sets one secret for both
        self._token = token if token is not None else (os.environ.get(TOKEN_ENV) or None)
        # counted on the loop's thread alone (the caller only arms _cut_after), so they need no lock
        self._cut_after: int | None = None
        self._ranged = self._sent = 0
        # bound here rather than in start(): the trainer advertises `url` right after constructing
        self._sock = socket.create_server((host, port))
        self.port: int = self._sock.getsockname()[1]
        self.url = f"{'https' if tls_cert else 'http'}://{advertise_host or host}:{self.port}/"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="weight-server", daemon=True)
        self._runner: web.AppRunner | None = None

    def start(self) -> WeightServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result()
        return self

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_get("/{path:.*}", self._get)  # HEAD too
        app.on_response_prepare.append(self._count)
        # access_log=None: _count logs each request at DEBUG rather than aiohttp's line at INFO
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock, ssl_context=self._tls).start()

    async def _get(self, request: web.Request) -> web.StreamResponse:
        # compared as bytes: compare_digest raises TypeError on a non-ASCII str, which must get 401 too
        given = request.headers.get("Authorization", "").encode(errors="surrogateescape")
        if self._token and not hmac.compare_digest(given, f"Bearer {self._token}".encode()):
            raise web.HTTPUnauthorized(text="missing or wrong bearer token\n")
        path = self._resolve(request.match_info["path"])
        if path is None:
            raise web.HTTPNotFound(text="not found\n")
        return _File(path, headers={"Content-Type": "application/octet-stream"})

    def _resolve(self, rel: str) -> Path | None:
        if not rel or any(not part or part.startswith(".") for part in rel.split("/")):
            return None
        path = (self._root / rel).resolve()
        if not path.is_relative_to(self._root) or not path.is_file() or path.name.startswith("."):
            return None  # a link that leaves the root, a directory or a dot-file
        return path

    async def _count(self, request: web.BaseRequest, response: web.StreamResponse) -> None:
        # on_response_prepare runs before the headers go out, so the counts lead what the client sees
        log.debug("%s %s %s %d", request.remote, request.method, request.path_qs, response.status)
        if response.status == 206:
            self._ranged += 1
        if not isinstance(response, _File) or request.method != "GET" or response.status not in (200, 206):
            return  # no file body: HEAD, 304, 416, errors
        length = response.content_length or 0
        if self._cut_after is not None and length > self._cut_after:
            response.cut = length = self._cut_after
            self._cut_after = None
        self._sent += length

    def break_next_transfer(self, after_bytes: int) -> None:
        """Fault injection for tests: the next body longer than `after_bytes` stops after them."""
        self._cut_after = after_bytes

    @property
    def ranged_requests(self) -> int:
        """Requests answered with a byte range so far."""
        return self._ranged

    @property
    def bytes_sent(self) -> int:
        """Body bytes sent so far."""
        return self._sent

    def close(self) -> None:
        if self._thread.is_alive():
            if self._runner is not None:
                asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        if not self._loop.is_closed():
            self._loop.close()
        self._sock.close()  # never started: nothing else closes it

    def __enter__(self) -> WeightServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
