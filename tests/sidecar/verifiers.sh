#!/usr/bin/env bash
# Runs the verifiers tests (tests/integrations/test_verifiers_env.py) in their own virtual environment.
#
# verifiers 0.4 pins mcp 2.0 while openenv 0.10 needs mcp < 2, so verifiers cannot share the hubs venv,
# and it brings some 200 packages (openai, anthropic, mcp, ...) the main environment does
# not need. It lives in a third venv:
#   ${TWICE_SIDE_VENVS:-$HOME/.cache/twice_envs/venvs}/verifiers
# It is created once and reused while its requirements are unchanged (keyed by a hash of the base
# dependencies, the extras it installs, the requirement line below and the Python version). Each run then
# installs this checkout into it (editable, no dependencies: seconds) and runs the verifiers tests with
# pytest, whose summary line is the last thing printed. No torch: the envs played need none.
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-python3}
REQUIREMENTS=(".[verifiers,dev]")
source tests/sidecar/venv.sh
side_venv verifiers "verifiers venv" "verifiers|dev" -- "${REQUIREMENTS[@]}"

exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/integrations/test_verifiers_env.py "$@"
