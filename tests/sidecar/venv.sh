# Sourced by the side scripts (hubs.sh, integrations.sh, verifiers.sh, nemo_gym.sh): builds a side
# virtual environment once and reuses it while its requirements are unchanged.
#
# side_venv NAME LABEL EXTRAS -- PIP_ARGS...
#   NAME     the venv's folder: ${TWICE_SIDE_VENVS:-$HOME/.cache/twice_envs/venvs}/NAME
#   LABEL    how its lines name it ("hubs venv: reusing ...")
#   EXTRAS   the pyproject extras whose lines key it, separated by | ("" for none)
#   PIP_ARGS what pip installs when the venv is created
# Reads PYTHON (the interpreter the venv is built on) and REQUIREMENTS (an array: the requirement lines
# that key it). The key is a hash of the base dependencies, the EXTRAS lines, REQUIREMENTS and the
# Python version, so unrelated edits of pyproject.toml do not rebuild it; the key file is written
# last, so a half-built venv is built again next time. Every call then installs this checkout into
# the venv (editable, no dependencies: seconds) and sets `venv` to its path. A lock keeps two runs
# from building the same venv at once. Run from the repository root.
side_venv() {
    local name=$1 label=$2 extras=$3
    shift 4  # NAME LABEL EXTRAS --
    local root=${TWICE_SIDE_VENVS:-$HOME/.cache/twice_envs/venvs}
    venv="$root/$name"
    mkdir -p "$root"
    local key
    key=$({ sed -n '/^dependencies = \[/,/^\]/p' pyproject.toml
            if [[ -n $extras ]]; then grep -E "^($extras) = " pyproject.toml; fi
            printf '%s\n' "${REQUIREMENTS[@]}"; "$PYTHON" -V; } | sha256sum | cut -c1-16)
    exec 9>"$root/$name.lock"
    flock 9
    # installing the checkout (also non-editable, when the venv is created) leaves setuptools' scratch folder
    local had_build
    had_build=$([[ -d build ]] && echo 1 || echo 0)
    if [[ ! -f "$venv/.requirements-$key" ]]; then
        echo "$label: creating $venv on $("$PYTHON" -V) (requirements $key)"
        rm -rf "$venv"
        "$PYTHON" -m venv "$venv"
        "$venv/bin/pip" install -q "$@"
        touch "$venv/.requirements-$key"
    else
        echo "$label: reusing $venv (requirements $key)"
    fi
    "$venv/bin/pip" install -q --no-deps -e . >/dev/null
    [[ $had_build == 1 ]] || rm -rf build  # setuptools' scratch folder, not part of the checkout
    flock -u 9
}
