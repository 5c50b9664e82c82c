#!/usr/bin/env bash
# The test command (`make test`): installs what is missing, starts a throw-away Kafka broker on
# free ports, runs the whole suite against it, and stops the broker however the tests end.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(scripts/bootstrap.sh | tail -n 1)
export PATH="$VENV/bin:$PATH"
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
if [ $# -eq 0 ]; then  # the whole suite (CI): the lint first, as `make lint` runs it
  echo "[test] lint: ruff (rules and format) and mypy" >&2
  ruff check astraflow workers streams trainer tests bench examples
  ruff format --check astraflow workers streams trainer tests bench examples
  mypy astraflow
fi
DATA=$(mktemp -d -t astraflow-test-broker.XXXXXX)
cleanup() {
  astraflow broker stop --data-dir "$DATA" >/dev/null 2>&1 || true
  rm -rf "$DATA"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
echo "[test] starting a throw-away Kafka broker" >&2
ASTRAFLOW_TEST_BOOTSTRAP=$(astraflow broker start --port 0 --data-dir "$DATA" 2>/dev/null | tail -n 1) || {
  echo "[test] the broker did not start; its log:" >&2; tail -n 40 "$DATA/logs/kafka.log" >&2 || true; exit 1; }
export ASTRAFLOW_TEST_BOOTSTRAP
echo "[test] broker at $ASTRAFLOW_TEST_BOOTSTRAP" >&2
python -m pytest "$@"
