#!/usr/bin/env bash
# `make demo`: the default recipe end to end on the local broker.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(scripts/bootstrap.sh | tail -n 1)
export PATH="$VENV/bin:$PATH"
exec astraflow run "${1:-recipes/arithmetic.yaml}"
