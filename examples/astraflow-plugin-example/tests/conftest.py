"""Puts the plug-in on sys.path, so that its tests run from a checkout of AstraFlow without
installing it (the repository's test run collects them: pyproject.toml's testpaths). In your own
package, `pip install -e .` into the environment that has astraflow makes this file unnecessary."""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
