#!/usr/bin/env bash
# Runs the env-hub tests (tests/integrations/hubs: the OpenEnv server) in their own virtual environment.
#
# openenv 0.10 depends on gradio, which pins pillow < 13, and brings some 80 packages the server never
# imports; the main environment keeps its own pillow, so the hubs live in a second venv:
#   ${TWICE_SIDE_VENVS:-$HOME/.cache/twice_envs/venvs}/hubs
# It is created once and reused while its requirements are unchanged (keyed by a hash of the base
# dependencies, the extras it installs, the requirement line below and the Python version). Each run then
# installs this checkout into it (editable, no dependencies: seconds) and runs tests/integrations/hubs
# with pytest, whose summary line is the last thing printed. No torch: the served envs need none.
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-python3}
REQUIREMENTS=(".[openenv,webshop,dev]")  # webshop: the search index SearchQA and WebShop need (twice bench serve)
source tests/sidecar/venv.sh
side_venv hubs "hubs venv" "openenv|webshop|dev" -- "${REQUIREMENTS[@]}"

exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/integrations/hubs "$@"
