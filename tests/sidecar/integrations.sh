#!/usr/bin/env bash
# Runs the verl and TRL integration tests in their own virtual environment.
#
# verl 0.9.1 pins transformers < 5.11 while the main environment tracks the newest
# transformers, so the integrations live in a second venv:
#   ${TWICE_SIDE_VENVS:-$HOME/.cache/twice_envs/venvs}/integrations
# It is created once and reused while its requirements are unchanged (keyed by a hash
# of the base dependencies, the extras it installs, the requirement line below and the Python version). Each run then
# installs this checkout into it (editable, no dependencies: seconds) and runs
# tests/integrations with pytest, whose summary line is the last thing printed.
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-python3}
REQUIREMENTS=(torch==2.13.0 ".[verl,trl,hf,search,dev]")
source tests/sidecar/venv.sh
side_venv integrations "integrations venv" "verl|trl|hf|search|dev" -- "${REQUIREMENTS[@]}"

export TRL_EXPERIMENTAL_SILENCE=1
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider -o asyncio_default_fixture_loop_scope=function \
    tests/integrations "$@"
