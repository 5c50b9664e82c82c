"""Run every benchmark in bench/ one after another (`make bench`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Not run here: it needs the optional `bench` extra (TRL) in its own venv; see bench/RESULTS.md.
SEPARATE = {"vs_trl.py"}


def main() -> int:
    failed = []
    for script in sorted(HERE.glob("*_*.py")):
        if script.name == "run_all.py":
            continue
        if script.name in SEPARATE:
            print(f"\n=== bench.{script.stem}: skipped, run it on its own (bench/RESULTS.md)", flush=True)
            continue
        module = f"bench.{script.stem}"
        print(f"\n=== {module}", flush=True)
        if subprocess.run([sys.executable, "-m", module], cwd=HERE.parent).returncode != 0:
            failed.append(module)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
