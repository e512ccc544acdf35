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
# torch first, in the same pip command: a plain torch requirement would pull a CUDA build.
REQUIREMENTS=(torch==2.13.0 ".[verl,trl,hf,search,dev]")
root=${TWICE_SIDE_VENVS:-$HOME/.cache/twice_envs/venvs}
venv="$root/integrations"
mkdir -p "$root"

# The key covers what the venv's packages depend on: the base dependencies and the extras
# named above (not the rest of pyproject.toml, so unrelated edits do not rebuild it).
requirement_lines() {
    sed -n '/^dependencies = \[/,/^\]/p' pyproject.toml
    grep -E '^(verl|trl|hf|search|dev) = ' pyproject.toml
}
key=$({ requirement_lines; printf '%s\n' "${REQUIREMENTS[@]}"; "$PYTHON" -V; } | sha256sum | cut -c1-16)

exec 9>"$root/integrations.lock"
flock 9  # two runs never build the same venv at once
# installing the checkout (also non-editable, when the venv is created) leaves setuptools' scratch folder
had_build=$([[ -d build ]] && echo 1 || echo 0)
if [[ ! -f "$venv/.requirements-$key" ]]; then
    echo "integrations venv: creating $venv (requirements $key)"
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    "$venv/bin/pip" install -q "${REQUIREMENTS[@]}"
    touch "$venv/.requirements-$key"  # written last: a half-built venv is rebuilt next time
else
    echo "integrations venv: reusing $venv (requirements $key)"
fi
"$venv/bin/pip" install -q --no-deps -e . >/dev/null
[[ $had_build == 1 ]] || rm -rf build  # setuptools' scratch folder, not part of the checkout
flock -u 9

export TRL_EXPERIMENTAL_SILENCE=1
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider -o asyncio_default_fixture_loop_scope=function \
    tests/integrations "$@"
