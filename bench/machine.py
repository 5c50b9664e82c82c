"""One line describing the machine a benchmark ran on, recorded with every result."""

from __future__ import annotations

import os
import platform
import subprocess


def describe() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    return (
        f"{cpu}, {os.cpu_count()} cores, {mem_gib:.0f} GiB, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}, {java[0] if java else 'no java'}"
    )


if __name__ == "__main__":
    print(describe())
