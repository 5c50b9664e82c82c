#!/usr/bin/env bash
# Installs what AstraFlow needs, once per machine, and reuses it afterwards:
#   - a Python 3.11 virtual environment outside the clone ($ASTRAFLOW_VENV, default
#     ~/.cache/astraflow/venv), rebuilt only when pyproject.toml or constraints.txt change;
#   - Java 17+, Maven, kcat and bubblewrap (the code sandbox's namespaces) from Debian's packages
#     when missing (as root);
#   - the Apache Kafka jars from Maven Central into ~/.cache/astraflow/kafka (and ~/.m2).
# Prints the venv's path on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${ASTRAFLOW_VENV:-$HOME/.cache/astraflow/venv}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3

say() { echo "[bootstrap] $*" >&2; }

need_apt=()
command -v java >/dev/null 2>&1 || [ -n "${JAVA_HOME:-}" ] || need_apt+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
command -v kcat >/dev/null 2>&1 || need_apt+=(kcat)
command -v bwrap >/dev/null 2>&1 || need_apt+=(bubblewrap)
# Compose v1 validates docker-compose.yml against the compose schema offline (no Docker engine here).
command -v docker-compose >/dev/null 2>&1 || need_apt+=(docker-compose)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing ${need_apt[*]} from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "${need_apt[@]}" >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q "${need_apt[@]}" >/dev/null; }
  else
    say "missing ${need_apt[*]}: install them (e.g. apt-get install ${need_apt[*]})"
  fi
fi

stamp=$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip setuptools wheel
fi
if [ "$(cat "$VENV/.astraflow-stamp" 2>/dev/null)" != "$stamp" ]; then
  say "installing dependencies into $VENV (torch is a few GB the first time)"
  "$VENV/bin/pip" install -q -c constraints.txt -e ".[dev]" >"$VENV/.astraflow-pip.log" 2>&1 || {
    tail -n 30 "$VENV/.astraflow-pip.log" >&2; say "pip failed; full log: $VENV/.astraflow-pip.log"; exit 1; }
  echo "$stamp" > "$VENV/.astraflow-stamp"
  echo "$ROOT" > "$VENV/.astraflow-src"
elif [ "$(cat "$VENV/.astraflow-src" 2>/dev/null)" != "$ROOT" ]; then
  say "pointing $VENV at this clone"
  "$VENV/bin/pip" install -q --no-deps -e . >"$VENV/.astraflow-pip.log" 2>&1 || {
    tail -n 30 "$VENV/.astraflow-pip.log" >&2; exit 1; }
  echo "$ROOT" > "$VENV/.astraflow-src"
fi
"$VENV/bin/astraflow" broker fetch >/dev/null
echo "$VENV"
