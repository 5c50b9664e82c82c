"""Reading weight files by URI: local paths, file:// and http(s):// with resumable ranged GETs.

Every read is checked against the sha256 its caller expects (from a WeightVersion event or from
the hash chain of deltas); a mismatch is a WeightIntegrityError naming the URI. Over HTTP a
transfer that breaks off resumes where it stopped (`Range: bytes=N-`), into `<cache_dir>/<sha>.part`
when a cache directory is given (so even a restarted process resumes), else in memory.
Content-addressed names make the cache safe to share: a file is only ever stored under its sha256.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import logging
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import BinaryIO

from astraflow.errors import AstraFlowError

log = logging.getLogger(__name__)

#: Optional bearer token sent to (and required by) the trainer's weight server.
TOKEN_ENV = "ASTRAFLOW_WEIGHTS_TOKEN"
#: CA bundle that https:// weight servers are checked against (default: the system's).
CA_ENV = "ASTRAFLOW_WEIGHTS_CA"
CHUNK = 1 << 20


class WeightStoreError(AstraFlowError):
    """The weight store could not be read or written."""


class WeightIntegrityError(WeightStoreError):
    """A weight file does not match its sha256, or its content is malformed. `uri` names the file."""

    def __init__(self, uri: str, reason: str) -> None:
        self.uri = uri
        super().__init__(f"{uri}: {reason}")


class WeightNotFoundError(WeightStoreError):
    """A weight file is not (or no longer) in the store."""


def is_http(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def local_path(uri: str) -> Path:
    if uri.startswith("file://"):
        parsed = urllib.parse.urlparse(uri)
        return Path(urllib.parse.unquote(parsed.path))
    return Path(uri)


def resolve(uri: str, name: str) -> str:
    """The URI of file `name` in the same directory as `uri`."""
    if "://" in uri:
        return urllib.parse.urljoin(uri, urllib.parse.quote(name))
    return str(Path(uri).parent / name)


def sha256_of(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def read_verified(uri: str, sha256: str, cache_dir: Path | None = None) -> bytes:
    """The bytes of `uri`, checked against `sha256`."""
    if is_http(uri):
        return _read_http(uri, sha256, cache_dir)
    path = local_path(uri)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise WeightNotFoundError(f"{uri}: no such file") from None
    except OSError as exc:
        raise WeightStoreError(f"{uri}: cannot read: {exc}") from None
    _check(uri, data, sha256)
    return data


def _check(uri: str, data: bytes, sha256: str) -> None:
    got = sha256_of(data)
    if got != sha256:
        raise WeightIntegrityError(uri, f"sha256 is {got}, expected {sha256} ({len(data)} bytes read)")


def _read_http(uri: str, sha256: str, cache_dir: Path | None, attempts: int = 6,
               timeout: float = 60.0) -> bytes:
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        final = cache_dir / sha256
        if final.exists():
            data = final.read_bytes()
            if sha256_of(data) == sha256:
                return data
            final.unlink()  # a damaged cache entry is not the server's fault: fetch again
        part = cache_dir / f"{sha256}.part"
        with open(part, "ab+") as fh:
            _download(uri, fh, attempts, timeout)
            fh.seek(0)
            data = fh.read()
        if sha256_of(data) != sha256:
            part.unlink(missing_ok=True)
            _check(uri, data, sha256)
        os.replace(part, final)
        return data
    buf = io.BytesIO()
    _download(uri, buf, attempts, timeout)
    data = buf.getvalue()
    _check(uri, data, sha256)
    return data


def _download(uri: str, fh: BinaryIO, attempts: int, timeout: float) -> None:
    """Append the rest of `uri` to `fh` (which may already hold a prefix), resuming after breaks."""
    fh.seek(0, os.SEEK_END)
    have = fh.tell()
    token = os.environ.get(TOKEN_ENV)
    last: Exception | None = None
    for attempt in range(attempts):
        if attempt:
            time.sleep(min(0.2 * 2**attempt, 5.0))
        headers = {"Range": f"bytes={have}-"} if have else {}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            with urllib.request.urlopen(urllib.request.Request(uri, headers=headers), timeout=timeout,
                                        context=_tls_context(uri)) as resp:
                expected = _body_length(resp, have)
                if resp.status == 200 and have:  # the server ignored the range: start over
                    fh.seek(0)
                    fh.truncate()
                    have = 0
                got = 0
                while True:
                    chunk = resp.read(CHUNK)
                    if not chunk:
                        break
                    fh.write(chunk)
                    got += len(chunk)
                    have += len(chunk)
                if expected is not None and got < expected:
                    raise http.client.IncompleteRead(b"", expected - got)
                fh.flush()
                return
        except urllib.error.HTTPError as exc:
            if exc.code == 416 and have:
                return  # nothing left to read: the prefix we hold is the whole file
            if exc.code == 404:
                raise WeightNotFoundError(f"{uri}: not found on the server (HTTP 404)") from None
            if exc.code in (401, 403):
                raise WeightStoreError(f"{uri}: HTTP {exc.code}; set {TOKEN_ENV} to the server's token") from None
            last = exc
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            last = exc
        fh.flush()
        log.info("weight download of %s broke off at %d bytes (%s); resuming", uri, have, last)
    raise WeightStoreError(f"{uri}: download failed after {attempts} attempts: {last}")


def _tls_context(uri: str) -> ssl.SSLContext | None:
    """For https://: certificate and host name checked against ASTRAFLOW_WEIGHTS_CA (or the system's CAs)."""
    if not uri.startswith("https://"):
        return None
    return ssl.create_default_context(cafile=os.environ.get(CA_ENV) or None)


def _body_length(resp: http.client.HTTPResponse, have: int) -> int | None:
    """Bytes this response promises, after checking that a 206 starts where we asked."""
    if resp.status == 206:
        content_range = resp.headers.get("Content-Range", "")
        try:
            start = int(content_range.split()[1].split("-")[0])
        except (IndexError, ValueError):
            raise WeightStoreError(f"bad Content-Range {content_range!r}") from None
        if start != have:
            raise WeightStoreError(f"asked for bytes from {have}, got a range from {start}")
    length = resp.headers.get("Content-Length")
    return int(length) if length is not None and length.isdigit() else None
