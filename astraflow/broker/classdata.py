"""A class-data archive (JDK AppCDS) of the broker's classes: the JVM maps Kafka's classes from it,
parsed and verified, instead of loading them from the jars at every start.

Measured on 2 cores (bench/RESULTS.md): a broker's JVM used 3.9 s of CPU to answer without it, 2.1 s
with it; the storage format tool 1.6 s and 0.6 s. `astraflow run` starts its components while its
broker boots, so that CPU came out of their start too.

One archive per JVM and jar set, in the jars' cache. The first broker on a machine records it as it
exits (`-XX:ArchiveClassesAtExit`, into its own data directory); `adopt` then checks that the JVM
maps it with the jars (`-Xshare:on`: a truncated archive crashes a JVM that is told to use it) and
moves it into place. Until then, and whenever it cannot be used, brokers start as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import uuid
from pathlib import Path

RECORDING = "classes.jsa.recording"  # in a broker's data directory, written by its JVM at exit


def archive_path(java: str, libs: Path) -> Path:
    """The archive of this JVM binary and these jars: another JDK or Kafka gets its own."""
    real = os.path.realpath(java)
    st = os.stat(real)
    jars = ",".join(sorted(os.listdir(libs)))
    key = hashlib.sha256(f"{real}:{st.st_size}:{st.st_mtime_ns}:{jars}".encode()).hexdigest()[:16]
    return libs.parent / f"classes-{key}.jsa"


def broker_flags(java: str, libs: Path, data_dir: Path) -> list[str]:
    """Map the archive, or record one at exit when there is none yet."""
    archive = archive_path(java, libs)
    if archive.exists():
        return [f"-XX:SharedArchiveFile={archive}"]
    return [f"-XX:ArchiveClassesAtExit={data_dir / RECORDING}"]


def tool_flags(java: str, libs: Path) -> list[str]:
    """For a short-lived Kafka tool (storage format): the archive if there is one, and the quick
    compiler only (C2's optimised code would arrive after the tool has exited)."""
    archive = archive_path(java, libs)
    return ["-XX:TieredStopAtLevel=1", *([f"-XX:SharedArchiveFile={archive}"] if archive.exists() else [])]


def usable(java: str, libs: Path, archive: Path) -> bool:
    """Whether this JVM maps `archive` with these jars (it refuses one of another JVM or jar set)."""
    try:
        return (
            subprocess.run(
                [java, f"-XX:SharedArchiveFile={archive}", "-Xshare:on", "-cp", f"{libs}/*", "-version"],
                capture_output=True,
                timeout=60,
            ).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False


def adopt(java: str, libs: Path, data_dir: Path) -> bool:
    """After a broker's JVM has exited: move the archive it recorded into place if the JVM can use it;
    drop it otherwise. Returns whether one was adopted."""
    recorded = data_dir / RECORDING
    if not recorded.exists():
        return False
    archive = archive_path(java, libs)
    adopted = False
    try:
        if not archive.exists() and usable(java, libs, recorded):
            staged = archive.with_name(f"{archive.name}.{uuid.uuid4().hex[:8]}")  # same filesystem as archive
            with contextlib.suppress(OSError):
                staged.write_bytes(recorded.read_bytes())
                os.replace(staged, archive)  # atomic: a starting JVM sees no archive or a whole one
                adopted = True
            with contextlib.suppress(FileNotFoundError):
                staged.unlink()
    finally:
        with contextlib.suppress(FileNotFoundError):
            recorded.unlink()
    return adopted
