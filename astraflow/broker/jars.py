"""Kafka on this machine without Docker: Java 17+ found, the broker's jars resolved from Maven
Central once per machine into a cache outside the clone (`$ASTRAFLOW_HOME`, default
`~/.cache/astraflow`), the Kafka version kept in one place (the pom). Used by the launcher
(one broker) and the cluster (several)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

from astraflow.errors import BrokerError

HERE = Path(__file__).resolve().parent
POM = HERE / "pom.xml"
LOG4J = HERE / "log4j2.properties"
MIN_JAVA = 17


def kafka_version() -> str:
    """The Kafka version, kept in one place: the pom's `kafka.version` property."""
    match = re.search(r"<kafka.version>([^<]+)</kafka.version>", POM.read_text())
    if not match:
        raise BrokerError(f"{POM}: no <kafka.version> property")
    return match.group(1)


def cache_home() -> Path:
    return Path(os.environ.get("ASTRAFLOW_HOME") or Path.home() / ".cache" / "astraflow").expanduser()


def find_java() -> str:
    """Path of a Java 17+ executable (JAVA_HOME first, then PATH), or a BrokerError saying what to do."""
    candidates = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(str(Path(os.environ["JAVA_HOME"]) / "bin" / "java"))
    if shutil.which("java"):
        candidates.append(shutil.which("java") or "java")
    for java in candidates:
        if not os.access(java, os.X_OK):
            continue
        out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
        match = re.search(r'version "(\d+)', out)
        if match and int(match.group(1)) >= MIN_JAVA:
            return java
        if match:
            raise BrokerError(
                f"{java} is Java {match.group(1)}; Kafka {kafka_version()} needs Java {MIN_JAVA}+. "
                f"Install a newer JDK or point JAVA_HOME at one."
            )
    raise BrokerError(
        f"Java {MIN_JAVA}+ was not found (looked at JAVA_HOME and PATH). Install one, e.g. "
        f"`apt-get install openjdk-17-jre-headless`, or set JAVA_HOME."
    )


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def jars_dir(version: str | None = None) -> Path:
    return cache_home() / "kafka" / (version or kafka_version()) / "libs"


def ensure_jars(progress: Callable[[str], None] = lambda _: None) -> Path:
    """Resolve the Kafka jars once per machine; later calls return the cached directory at once."""
    libs = jars_dir()
    marker = libs / ".complete"
    if marker.exists():
        return libs
    with file_lock(libs.parent / ".lock"):
        if marker.exists():
            return libs
        mvn = shutil.which("mvn")
        if mvn is None:
            raise BrokerError(
                "Maven (mvn) was not found; it resolves the Kafka jars from Maven Central "
                "once. Install it, e.g. `apt-get install maven`."
            )
        progress(f"resolving Apache Kafka {kafka_version()} jars with Maven into {libs} (once per machine)")
        tmp = libs.with_name("libs.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(POM),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={tmp}",
        ]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            tail = (result.stdout + result.stderr).strip().splitlines()[-20:]
            raise BrokerError("Maven could not resolve the Kafka jars:\n" + "\n".join(tail))
        shutil.rmtree(libs, ignore_errors=True)
        tmp.rename(libs)
        marker.write_text(kafka_version())
    return libs
