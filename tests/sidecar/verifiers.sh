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
root=${TWICE_SIDE_VENVS:-$HOME/.cache/twice_envs/venvs}
venv="$root/verifiers"
mkdir -p "$root"

# The key covers what the venv's packages depend on: the base dependencies and the extras named above
# (not the rest of pyproject.toml, so unrelated edits do not rebuild it).
requirement_lines() {
    sed -n '/^dependencies = \[/,/^\]/p' pyproject.toml
    grep -E '^(verifiers|dev) = ' pyproject.toml
}
key=$({ requirement_lines; printf '%s\n' "${REQUIREMENTS[@]}"; "$PYTHON" -V; } | sha256sum | cut -c1-16)

exec 9>"$root/verifiers.lock"
flock 9  # two runs never build the same venv at once
# installing the checkout (also non-editable, when the venv is created) leaves setuptools' scratch folder
had_build=$([[ -d build ]] && echo 1 || echo 0)
if [[ ! -f "$venv/.requirements-$key" ]]; then
    echo "verifiers venv: creating $venv (requirements $key)"
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    "$venv/bin/pip" install -q "${REQUIREMENTS[@]}"
    touch "$venv/.requirements-$key"  # written last: a half-built venv is rebuilt next time
else
    echo "verifiers venv: reusing $venv (requirements $key)"
fi
"$venv/bin/pip" install -q --no-deps -e . >/dev/null
[[ $had_build == 1 ]] || rm -rf build  # setuptools' scratch folder, not part of the checkout
flock -u 9

exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/integrations/test_verifiers_env.py "$@"
