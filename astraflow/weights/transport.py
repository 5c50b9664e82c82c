"""Reading weight files by URI: local paths, file:// and http(s):// with resumable ranged GETs.

Every read is checked against the sha256 its caller expects (from a WeightVersion event or from
the hash chain of deltas); a mismatch is a WeightIntegrityError naming the URI. Over HTTP a
transfer that breaks off resumes where it stopped (`Range: bytes=N-`), into `<cache_dir>/<sha>.part`
when a cache directory is given (so even a restarted process resumes), else in memory.
Content-addressed names make the cache safe to share: a file is only ever stored under its sha256.

Reads are bounded, because the URI comes from an event anyone who can write to `weights` may forge:
only regular files are opened (a FIFO or `/dev/zero` would block or never end), nothing is read
past the size the event names (`size`) or a ceiling (`limit`), an HTTP body is read in chunks and
abandoned as soon as it runs past that size, and the sha256 is computed while the bytes arrive.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import io
import logging
import os
import ssl
import stat
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from astraflow.errors import AstraFlowError

log = logging.getLogger(__name__)

#: Optional bearer token sent to (and required by) the trainer's weight server.
TOKEN_ENV = "ASTRAFLOW_WEIGHTS_TOKEN"  # noqa: S105 - the name of the variable
#: CA bundle that https:// weight servers are checked against (default: the system's).
CA_ENV = "ASTRAFLOW_WEIGHTS_CA"
CHUNK = 1 << 20
#: The most bytes read for a file whose size no event names (an older delta of a chain).
MAX_UNSIZED_BYTES = 64 << 30


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


def read_verified(
    uri: str, sha256: str, cache_dir: Path | None = None, *, size: int | None = None, limit: int | None = None
) -> bytes:
    """The bytes of `uri`, checked against `sha256`. `size`: the exact size the event names (a file
    of another size is refused); `limit`: the most bytes to read when the size is not known."""
    cap = size if size is not None else (limit if limit is not None else MAX_UNSIZED_BYTES)
    data, digest = _read_http(uri, sha256, cache_dir, cap) if is_http(uri) else _read_local(uri, cap)
    if size is not None and len(data) != size:
        raise WeightIntegrityError(uri, f"{len(data)} bytes, the event names {size}")
    if digest != sha256:
        raise WeightIntegrityError(uri, f"sha256 is {digest}, expected {sha256} ({len(data)} bytes read)")
    return data


def _read_local(uri: str, cap: int) -> tuple[bytes, str]:
    """Read a regular file in chunks, never more than `cap` bytes; (bytes, their sha256)."""
    path = local_path(uri)
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise WeightNotFoundError(f"{uri}: no such file") from None
    except OSError as exc:
        raise WeightStoreError(f"{uri}: cannot read: {exc}") from None
    with os.fdopen(fd, "rb", buffering=0) as fh:
        mode = os.fstat(fd).st_mode  # of what was opened, not of what the name pointed to before
        if not stat.S_ISREG(mode):
            raise WeightIntegrityError(uri, f"not a regular file (mode {stat.filemode(mode)}); refused")
        buf, hasher = bytearray(), hashlib.sha256()
        while len(buf) <= cap:
            chunk = fh.read(min(CHUNK, cap + 1 - len(buf)))
            if not chunk:
                break
            buf += chunk
            hasher.update(chunk)
    if len(buf) > cap:
        raise WeightIntegrityError(uri, f"longer than the {cap} bytes expected; refused")
    return bytes(buf), hasher.hexdigest()


def _read_http(
    uri: str, sha256: str, cache_dir: Path | None, cap: int, attempts: int = 6, timeout: float = 60.0
) -> tuple[bytes, str]:
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        final = cache_dir / sha256
        if final.exists():
            data = final.read_bytes()
            if sha256_of(data) == sha256:
                return data, sha256
            final.unlink()  # a damaged cache entry is not the server's fault: fetch again
        part = cache_dir / f"{sha256}.part"
        with _locked(part) as fh:
            if final.exists() and sha256_of(data := final.read_bytes()) == sha256:
                part.unlink()  # another worker fetched it while this one waited
                return data, sha256
            try:
                digest = _download(uri, fh, attempts, timeout, cap)
                fh.seek(0)
                data = fh.read()
            except WeightIntegrityError:
                part.unlink(missing_ok=True)  # an oversized body is not worth resuming
                raise
            if digest != sha256:
                part.unlink(missing_ok=True)  # the caller raises the integrity error
            else:
                os.replace(part, final)
            return data, digest
    buf = io.BytesIO()
    digest = _download(uri, buf, attempts, timeout, cap)
    return buf.getvalue(), digest


@contextlib.contextmanager
def _locked(part: Path) -> Iterator[BinaryIO]:
    """`part` opened for appending and locked. Workers of one host share a cache (`<run dir>/cache/
    weights`): one downloads a file while the others wait, instead of all appending to one `.part`
    and racing to rename it (seen with two workers of a simulated region). The file is reopened if
    the holder before renamed or removed it while this one waited."""
    while True:
        fh = open(part, "ab+")  # noqa: SIM115 - closed below or by the caller's with
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            current = os.stat(part).st_ino == os.fstat(fh.fileno()).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        fh.close()
    with fh:
        yield fh


def _download(uri: str, fh: BinaryIO, attempts: int, timeout: float, cap: int = MAX_UNSIZED_BYTES) -> str:
    """Append the rest of `uri` to `fh` (which may already hold a prefix), resuming after breaks.
    Returns the sha256 of everything in `fh`, computed as the bytes arrive. A body (or a promised
    Content-Length) that runs past `cap` bytes is refused at once: an endless body is never read."""
    fh.seek(0)
    hasher = hashlib.sha256(fh.read())
    have = fh.tell()
    if have > cap:
        raise WeightIntegrityError(uri, f"cached prefix of {have} bytes exceeds the {cap} expected")
    token = os.environ.get(TOKEN_ENV)
    last: Exception | None = None
    for attempt in range(attempts):
        if attempt:
            time.sleep(min(0.2 * 2**attempt, 5.0))
        headers = {"Range": f"bytes={have}-"} if have else {}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            # only http(s) URIs come here (`read_verified` reads file URIs itself)
            request = urllib.request.Request(uri, headers=headers)  # noqa: S310
            with urllib.request.urlopen(request, timeout=timeout, context=_tls_context(uri)) as resp:  # noqa: S310
                expected = _body_length(resp, have)
                if resp.status == 200 and have:  # the server ignored the range: start over
                    fh.seek(0)
                    fh.truncate()
                    have, hasher = 0, hashlib.sha256()
                if expected is not None and have + expected > cap:
                    raise WeightIntegrityError(
                        uri,
                        f"the server promises {have + expected} bytes, more than the {cap} expected; refused",
                    )
                got = 0
                while True:
                    chunk = resp.read(min(CHUNK, cap + 1 - have))
                    if not chunk:
                        break
                    fh.write(chunk)
                    hasher.update(chunk)
                    got += len(chunk)
                    have += len(chunk)
                    if have > cap:
                        raise WeightIntegrityError(
                            uri, f"the body runs past the {cap} bytes expected; refused"
                        )
                if expected is not None and got < expected:
                    raise http.client.IncompleteRead(b"", expected - got)
                fh.flush()
                return hasher.hexdigest()
        except urllib.error.HTTPError as exc:
            if exc.code == 416 and have:
                return hasher.hexdigest()  # nothing left to read: the prefix we hold is the whole file
            if exc.code == 404:
                raise WeightNotFoundError(f"{uri}: not found on the server (HTTP 404)") from None
            if exc.code in (401, 403):
                raise WeightStoreError(
                    f"{uri}: HTTP {exc.code}; set {TOKEN_ENV} to the server's token"
                ) from None
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
