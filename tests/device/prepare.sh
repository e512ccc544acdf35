#!/usr/bin/env bash
# Writes runs/gpu_check* (what a lent GPU machine lacks for tests/device/run.sh) on a machine
# with the project and its extras installed; prints the device calls that run the checks.
#   bash tests/device/prepare.sh [--episodes N] [--no-weights]
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
exec "$PY" tests/device/prepare.py "$@"
