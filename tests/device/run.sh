#!/usr/bin/env bash
# GPU checks of the keyed sampler and the model build (tests/device/gpu_check.py), in one run of
# at most 10 minutes on a machine with CUDA, such as a lent GPU machine:
#
#   bash tests/device/run.sh            sections a-d; the report goes to $OUT (else runs/gpu_check_report)
#   bash tests/device/run.sh --cpu      the same sections at tiny sizes on the CPU
#   bash tests/device/run.sh --stage    only keep the SmolLM2 weight parts this call carried
#
# Other arguments go to gpu_check.py (--sections ab, --budgets b=200, ...). What the GPU machine
# lacks (gymnasium, the ALFWorld engine, SmolLM2's tokenizer and weights, the build's
# transcripts) comes from runs/gpu_check*, written beforehand by tests/device/prepare.sh.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
PREP="$ROOT/runs/gpu_check"
WORK="${GPU_CHECK_WORK:-/tmp/twice_gpu_check}"
PY="${PYTHON:-python3}"
LIMIT="${GPU_CHECK_TIMEOUT:-570}"
mkdir -p "$WORK/parts"

# Weight parts: kept outside the checkout, since a later call need not carry them again.
for part in "$ROOT"/runs/gpu_check*/weights.part*; do
  [ -f "$part" ] || continue
  cp -f "$part" "$WORK/parts/" && echo "run.sh: kept $(basename "$part") ($(du -h "$part" | cut -f1))"
done
if [ "${1:-}" = "--stage" ]; then
  ls -l "$WORK/parts"
  exit 0
fi

# Packages the machine lacks (prepared on a machine with the project installed).
if [ -f "$PREP/site.tar.gz" ]; then
  rm -rf "$WORK/site" && mkdir -p "$WORK/site" && tar -xzf "$PREP/site.tar.gz" -C "$WORK/site" \
    && export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
fi

# The project itself: installed without dependencies unless this checkout is importable already.
if ! "$PY" -c "import sys, twice_envs.agents; sys.exit(0 if twice_envs.__file__.startswith('$ROOT/') else 1)" 2>/dev/null; then
  if ! "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e "$ROOT" 2>"$WORK/pip.log"; then
    echo "run.sh: editable install failed ($(tail -n 1 "$WORK/pip.log")); installing into $WORK/pkg"
    rm -rf "$WORK/pkg"
    "$PY" -m pip install -q --no-deps --no-build-isolation --no-index --target "$WORK/pkg" "$ROOT" \
      && export PYTHONPATH="$WORK/pkg${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi

REPORT="${OUT:-$ROOT/runs/gpu_check_report}"
mkdir -p "$REPORT"
export PYTHONUNBUFFERED=1
timeout -k 10 "$LIMIT" "$PY" -u "$ROOT/tests/device/gpu_check.py" --out "$REPORT" --work "$WORK" \
  --prepared "$PREP" "$@"
rc=$?
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "run.sh: gpu_check.py stopped after $LIMIT s; the report holds the sections finished before" \
    | tee -a "$REPORT/gpu_check.txt"
fi
exit "$rc"
