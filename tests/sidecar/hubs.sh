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
root=${TWICE_SIDE_VENVS:-$HOME/.cache/twice_envs/venvs}
venv="$root/hubs"
mkdir -p "$root"

# The key covers what the venv's packages depend on: the base dependencies and the extras named above
# (not the rest of pyproject.toml, so unrelated edits do not rebuild it).
requirement_lines() {
    sed -n '/^dependencies = \[/,/^\]/p' pyproject.toml
    grep -E '^(openenv|webshop|dev) = ' pyproject.toml
}
key=$({ requirement_lines; printf '%s\n' "${REQUIREMENTS[@]}"; "$PYTHON" -V; } | sha256sum | cut -c1-16)

exec 9>"$root/hubs.lock"
flock 9  # two runs never build the same venv at once
# installing the checkout (also non-editable, when the venv is created) leaves setuptools' scratch folder
had_build=$([[ -d build ]] && echo 1 || echo 0)
if [[ ! -f "$venv/.requirements-$key" ]]; then
    echo "hubs venv: creating $venv (requirements $key)"
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    "$venv/bin/pip" install -q "${REQUIREMENTS[@]}"
    touch "$venv/.requirements-$key"  # written last: a half-built venv is rebuilt next time
else
    echo "hubs venv: reusing $venv (requirements $key)"
fi
"$venv/bin/pip" install -q --no-deps -e . >/dev/null
[[ $had_build == 1 ]] || rm -rf build  # setuptools' scratch folder, not part of the checkout
flock -u 9

exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/integrations/hubs "$@"
