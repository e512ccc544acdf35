#!/usr/bin/env bash
# Runs the NeMo Gym tests (tests/integrations/test_nemo_gym*.py) against the real nemo-gym package, in a
# virtual environment of their own.
#
# nemo-gym 0.7 declares Requires-Python >= 3.13.14, which no Python this suite targets satisfies (the main
# environment is 3.11). Its code runs on Python 3.13, so this script builds the venv on the newest Python 3.13
# it finds ($PYTHON313, else the newest pyenv 3.13.x, else python3.13 on PATH) and installs nemo-gym with pip's
# --ignore-requires-python. Without a Python 3.13 it says so and stops without failing: the adapter's
# own tests still run in the main suite. The venv lives at
#   ${TWICE_SIDE_VENVS:-$HOME/.cache/twice_envs/venvs}/nemo_gym
# It is created once and reused while its requirements are unchanged (keyed by a hash of the base
# dependencies, the requirement lines below and the Python version). Each run installs this checkout into
# it (editable, no dependencies) and runs the tests with pytest, whose summary line is printed last.
set -euo pipefail
cd "$(dirname "$0")/../.."

is_python313() { [[ -n "$1" ]] && "$1" -c 'import sys; assert sys.version_info[:2] == (3, 13)' >/dev/null 2>&1; }
find_python313() {
    local candidate
    for candidate in "${PYTHON313:-}" \
        $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13*/bin/python 2>/dev/null | sort -rV) \
        "$(command -v python3.13 2>/dev/null || true)"; do
        if is_python313 "$candidate"; then echo "$candidate"; return; fi
    done
}
PYTHON=$(find_python313)
if [[ -z "$PYTHON" ]]; then
    echo "nemo-gym tests not run: no Python 3.13 found (nemo-gym 0.7 needs it; set PYTHON313 to one)"
    exit 0
fi

REQUIREMENTS=("nemo-gym>=0.7,<0.8" "uvicorn" "httpx" "pytest>=8")
source tests/sidecar/venv.sh
side_venv nemo_gym "nemo-gym venv" "" -- --ignore-requires-python "${REQUIREMENTS[@]}" -e .

exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/integrations/test_nemo_gym.py \
    tests/integrations/test_nemo_gym_server.py "$@"
