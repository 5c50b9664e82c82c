"""The broker's class-data archive (astraflow/broker/classdata.py): recorded by a broker's JVM as it
exits, adopted only when the JVM can map it, then used by the next broker and the format tool."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow import broker
from astraflow.broker import classdata, launcher
from astraflow.broker.jars import ensure_jars, find_java


def jvm_args(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


@pytest.fixture
def archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where classdata keeps the archive, moved from the user's cache into `tmp_path`."""
    path = tmp_path / "cache" / "classes.jsa"
    path.parent.mkdir()
    monkeypatch.setattr(classdata, "archive_path", lambda *_: path)
    return path


def test_an_unusable_recording_is_dropped_not_adopted(tmp_path: Path, archive: Path) -> None:
    """A recording cut short (its JVM killed while it wrote) would crash every JVM told to map it."""
    java, libs = find_java(), ensure_jars()
    (tmp_path / classdata.RECORDING).write_bytes(b"\x00" * 4096)
    assert not classdata.adopt(java, libs, tmp_path)
    assert not archive.exists() and not (tmp_path / classdata.RECORDING).exists()
    assert classdata.broker_flags(java, libs, tmp_path) == [
        f"-XX:ArchiveClassesAtExit={tmp_path / classdata.RECORDING}"
    ]


def test_archive_path_is_per_jvm_and_jar_set(tmp_path: Path) -> None:
    java = find_java()
    one, two = tmp_path / "a" / "libs", tmp_path / "b" / "libs"
    for libs, jar in ((one, "kafka-4.4.0.jar"), (two, "kafka-4.5.0.jar")):
        libs.mkdir(parents=True)
        (libs / jar).touch()
    assert classdata.archive_path(java, one).parent == one.parent
    assert classdata.archive_path(java, one).name != classdata.archive_path(java, two).name


@pytest.mark.broker
@pytest.mark.slow
def test_first_broker_records_the_archive_and_the_next_maps_it(tmp_path: Path, archive: Path) -> None:
    java, libs = find_java(), ensure_jars()

    first = broker.start(port=0, data_dir=tmp_path / "one")
    try:
        assert f"-XX:ArchiveClassesAtExit={tmp_path / 'one' / classdata.RECORDING}" in jvm_args(first.pid)
    finally:
        broker.stop(tmp_path / "one")
    assert archive.exists() and classdata.usable(java, libs, archive)
    assert not (tmp_path / "one" / classdata.RECORDING).exists()

    second = broker.start(port=0, data_dir=tmp_path / "two")  # formatted and started with the archive
    try:
        assert f"-XX:SharedArchiveFile={archive}" in jvm_args(second.pid)
        assert launcher._ready(second.bootstrap, 30)
    finally:
        broker.stop(tmp_path / "two")
