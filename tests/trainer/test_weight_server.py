"""The trainer's HTTP weight server and the reader's ranged, resumable, verified downloads."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from astraflow.errors import AstraFlowError
from astraflow.weights import WeightIntegrityError, WeightServer, WeightStore, fetch_weights, transport
from tests.trainer.helpers import assert_bit_identical, nudge, published, tiny_model


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_ranges_are_served_and_nothing_outside_the_root(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "f.bin").write_bytes(bytes(range(100)))
    (tmp_path / "secret").write_text("no")
    with WeightServer(tmp_path / "root") as server:
        assert _get(server.url + "f.bin")[2] == bytes(range(100))
        status, headers, body = _get(server.url + "f.bin", {"Range": "bytes=10-19"})
        assert (status, headers["Content-Range"], body) == (206, "bytes 10-19/100", bytes(range(10, 20)))
        assert _get(server.url + "f.bin", {"Range": "bytes=95-"})[2] == bytes(range(95, 100))
        assert _get(server.url + "f.bin", {"Range": "bytes=-3"})[2] == bytes([97, 98, 99])
        status, headers, _ = _get(server.url + "f.bin", {"Range": "bytes=100-"})
        assert status == 416 and headers["Content-Range"] == "bytes */100"
        assert _get(server.url + "f.bin", {"Range": "bytes=1-2,5-6"})[0] == 416
        for bad in ("../secret", "%2e%2e/secret", "", "nope.bin"):
            assert _get(server.url + bad)[0] == 404


def test_head_gives_the_length_and_dot_files_are_not_served(tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(bytes(100))
    (tmp_path / ".f.bin.123.tmp").write_bytes(b"partial")  # how the store writes a file before its rename
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "g.bin").write_bytes(b"g")
    with WeightServer(tmp_path) as server:
        head = urllib.request.Request(server.url + "f.bin", method="HEAD")
        with urllib.request.urlopen(head, timeout=10) as resp:
            assert (resp.status, resp.headers["Content-Length"], resp.read()) == (200, "100", b"")
        for bad in (".f.bin.123.tmp", "%2ef.bin.123.tmp", ".hidden/g.bin"):
            assert _get(server.url + bad)[0] == 404
        assert server.bytes_sent == 0  # neither a HEAD nor an error carries a file body


def test_a_token_guards_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "f.bin").write_bytes(b"weights")
    sha = transport.sha256_of(b"weights")
    with WeightServer(tmp_path, token="s3cret") as server:
        assert _get(server.url + "f.bin")[0] == 401
        with pytest.raises(AstraFlowError, match=transport.TOKEN_ENV):
            transport.read_verified(server.url + "f.bin", sha)
        monkeypatch.setenv(transport.TOKEN_ENV, "s3cret")
        assert transport.read_verified(server.url + "f.bin", sha) == b"weights"


def test_the_server_requires_the_token_the_readers_are_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `astraflow run --secure` hands one ASTRAFLOW_WEIGHTS_TOKEN to trainers (server) and workers (readers)
    (tmp_path / "f.bin").write_bytes(b"weights")
    sha = transport.sha256_of(b"weights")
    monkeypatch.setenv(transport.TOKEN_ENV, "run-secret")
    with WeightServer(tmp_path) as server:
        assert _get(server.url + "f.bin")[0] == 401
        assert _get(server.url + "f.bin", {"Authorization": "Bearer guess"})[0] == 401
        assert transport.read_verified(server.url + "f.bin", sha) == b"weights"
        monkeypatch.delenv(transport.TOKEN_ENV)
        with pytest.raises(AstraFlowError, match="HTTP 401"):
            transport.read_verified(server.url + "f.bin", sha)


def test_https_with_a_certificate_of_the_run_ca(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from astraflow.broker import secure

    secure.make_certificates(tmp_path / "secure")  # what `astraflow run --secure` makes
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "f.bin").write_bytes(b"weights")
    sha = transport.sha256_of(b"weights")
    monkeypatch.setenv("ASTRAFLOW_WEIGHTS_TLS_CERT", str(tmp_path / "secure" / "weights.pem"))
    with WeightServer(tmp_path / "root", token="t") as server:
        assert server.url.startswith("https://127.0.0.1:")
        monkeypatch.setenv(transport.TOKEN_ENV, "t")
        # without the run's CA the server's certificate is not trusted
        with pytest.raises(AstraFlowError, match="CERTIFICATE_VERIFY_FAILED"):
            transport.read_verified(server.url + "f.bin", sha)
        monkeypatch.setenv(transport.CA_ENV, str(tmp_path / "secure" / "ca.pem"))
        assert transport.read_verified(server.url + "f.bin", sha) == b"weights"
        # plain http to the TLS port gets no weights
        with pytest.raises(AstraFlowError, match="download failed"):
            transport.read_verified(server.url.replace("https://", "http://") + "f.bin", sha)


@pytest.mark.parametrize("cache", [False, True])
def test_weights_over_http_resume_broken_transfers(tmp_path: Path, cache: bool) -> None:
    model, gen = tiny_model(), torch.Generator().manual_seed(6)
    with WeightServer(tmp_path / "store") as server:
        store = WeightStore(tmp_path / "store", "p", snapshot_every=2, base_uri=server.url)
        for v in range(4):
            if v:
                nudge(model, gen)
            event = store.publish(model.state_dict(), v)
        assert event.snapshot_uri.startswith(server.url) and event.delta_uri.startswith(server.url)
        server.break_next_transfer(after_bytes=1000)  # the snapshot download breaks off at 1000 bytes
        cache_dir = tmp_path / "cache" if cache else None
        held = fetch_weights(event, None, cache_dir=cache_dir)
        assert_bit_identical(held.state, published(model))
        assert server.ranged_requests >= 1  # the rest came with `Range: bytes=1000-`
        if cache:
            assert (cache_dir / event.snapshot_sha256).exists()
            assert not list(cache_dir.glob("*.part"))


def test_a_cached_partial_download_resumes_after_a_restart(tmp_path: Path) -> None:
    data = bytes(range(256)) * 40
    (tmp_path / "f.bin").write_bytes(data)
    sha = transport.sha256_of(data)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / f"{sha}.part").write_bytes(data[:3000])  # what a killed process left behind
    with WeightServer(tmp_path) as server:
        assert transport.read_verified(server.url + "f.bin", sha, cache) == data
        assert server.ranged_requests == 1 and server.bytes_sent == len(data) - 3000


def test_a_wrong_file_over_http_is_an_integrity_error(tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(b"tampered")
    cache = tmp_path / "cache"
    with WeightServer(tmp_path) as server, pytest.raises(WeightIntegrityError, match="f.bin"):
        transport.read_verified(server.url + "f.bin", transport.sha256_of(b"original"), cache)
    assert not list(cache.iterdir())  # nothing bad is left in the cache
