"""The other engines ``twice bench searchqa`` times beside the project's BM25, on the same passages,
tokens and queries: tantivy (optional, in this process), Lucene (pyserini, in a process of its own
environment), bm25s (optional) and rank_bm25.

Each writes its figures into the bench's ``fig`` dict; the module docstring of
:mod:`.bench` says what each comparison holds fixed and where the engines differ by design.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from twice_envs._deps import available, require
from twice_envs.envs.searchqa import lucene_server
from twice_envs.envs.searchqa.bench_measure import qps


class TantivyBaseline:
    """A tantivy index of the passages in a temporary folder under ``parent`` (tokenised by ``tok``, split on
    whitespace by tantivy, one writer thread) and its top-``k`` search; build figures go into ``fig``.

    :meth:`start` gives None where tantivy is not installed (it is an optional baseline, not a dependency).
    """

    def __init__(self, tantivy, texts, tok: Callable[[str], list], k: int, parent: Path, fig: dict) -> None:
        self.tantivy, self.tok, self.k = tantivy, tok, k
        self.folder = tempfile.TemporaryDirectory(prefix="tantivy-", dir=str(parent))
        t0 = time.perf_counter()
        sb = tantivy.SchemaBuilder()
        sb.add_text_field("body", stored=False, tokenizer_name="whitespace", index_option="freq")
        sb.add_integer_field("pid", stored=False, indexed=False, fast=True)
        self.schema = sb.build()
        index = tantivy.Index(self.schema, path=self.folder.name)
        writer = index.writer(heap_size=256_000_000, num_threads=1)
        for i, text in enumerate(texts):
            writer.add_document(tantivy.Document(body=" ".join(tok(text)), pid=i))
        writer.commit()
        writer.wait_merging_threads()
        index.reload()
        fig["tantivy_build_s"] = time.perf_counter() - t0
        fig["tantivy_version"] = str(getattr(tantivy, "__version__", "")).split(",")[0]
        fig["tantivy_disk_bytes"] = sum(f.stat().st_size for f in Path(self.folder.name).rglob("*") if f.is_file())
        self.searcher = index.searcher()
        fig["tantivy_segments"] = self.searcher.num_segments

    @classmethod
    def start(cls, texts, tok: Callable[[str], list], k: int, parent: Path, fig: dict) -> Optional["TantivyBaseline"]:
        """The baseline, or None where tantivy is not importable."""
        if not available("tantivy"):
            return None
        import tantivy  # an optional baseline: imported only where it is installed

        return cls(tantivy, texts, tok, k, parent, fig)

    def search(self, q: str) -> list:
        """The top-k passage positions of ``q``."""
        tv, should = self.tantivy, self.tantivy.Occur.Should
        query = tv.Query.boolean_query(
            [(should, tv.Query.term_query(self.schema, "body", t, index_option="freq")) for t in self.tok(q)])
        hits = self.searcher.search(query, self.k, count=False).hits
        return self.searcher.fast_field_values("pid", [a for _, a in hits]) if hits else []

    def close(self) -> None:
        """Let go of the index and remove its folder."""
        del self.searcher
        self.folder.cleanup()


# ----------------------------------------------------------------------------- Lucene
#: The server file, run by path with the Lucene environment's python (``-I``: nothing of this
#: checkout or of the caller's ``PYTHON*`` variables on its path).
LUCENE_SERVER = Path(lucene_server.__file__)


class LuceneServer:
    """The bench's side of :mod:`.lucene_server`: start it, wait for its hello, send requests, read replies.

    ``cmd`` starts the server; its stderr (Java's and pyserini's logging included) goes to
    ``log``, whose last lines are quoted when the server fails.
    """

    def __init__(self, cmd: Sequence[str], log: Path, env: dict | None = None) -> None:
        self._proto = lucene_server
        self._log_path = Path(log)
        self._log = open(self._log_path, "w", encoding="utf-8")
        t0 = time.perf_counter()
        try:
            self.proc = subprocess.Popen(list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                         text=True, encoding="utf-8", env=env)
        except OSError as exc:
            self._log.close()
            raise SystemExit(f"the Lucene server could not be started with {cmd[0]!r} ({exc}); give the python of a "
                             "pyserini environment (bash tests/sidecar/pyserini.sh --setup-only builds one)") from None
        try:
            self.hello = self._read()
        except SystemExit:
            self.close()
            raise
        self.startup_wall_s = time.perf_counter() - t0

    def _fail(self, what: str) -> SystemExit:
        try:
            tail = self._log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-15:]
        except OSError:
            tail = []
        lines = "".join(f"\n    {t}" for t in tail)
        log = f"; the end of its log ({self._log_path}):{lines}" if tail else ""
        return SystemExit(f"the Lucene server {what}{log}")

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait()
                raise self._fail(f"exited (status {self.proc.returncode}) without a reply")
            try:
                reply = self._proto.decode(line)
            except self._proto.ProtocolError as exc:
                raise self._fail(str(exc)) from None
            if reply is None:  # not a reply line
                continue
            if not reply["ok"]:
                raise self._fail(f"failed: {reply.get('error', 'no reason given')}")
            return reply

    def request(self, op: str, **fields) -> dict:
        """Send one request and return its (successful) reply."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise self._fail("closed its input") from None
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.request("quit")
            except SystemExit:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()
        self._log.close()


def lucene_export(texts, tok, path: Path) -> int:
    """Write the passages as pretokenised JSONL for the Lucene server: zero-padded docids, tokens joined by spaces."""
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for i, text in enumerate(texts):
            fh.write(json.dumps({"id": lucene_server.docid(i), "contents": " ".join(tok(text))}) + "\n")
            n += 1
    return n


def lucene_start(python: str, corpus, tok, params, work: Path, fig: dict) -> LuceneServer:
    """Export the passages, start the server, build and open its index; the figures go into ``fig``."""
    docs = work / "docs"
    docs.mkdir()
    t0 = time.perf_counter()
    lucene_export(corpus.iter_contents(), tok, docs / "passages.jsonl")
    fig["lucene_export_s"] = time.perf_counter() - t0
    server = LuceneServer([python, "-I", str(LUCENE_SERVER)], work / "server.log")
    try:
        versions = server.hello.get("versions", {})
        fig["lucene_version"] = versions.get("lucene", "")
        fig["lucene_pyserini_version"] = versions.get("pyserini", "")
        fig["lucene_java_version"] = versions.get("java", "")
        fig["lucene_startup_s"] = server.startup_wall_s
        built = server.request("build", input=str(docs), index=str(work / "index"))
        fig["lucene_build_s"], fig["lucene_disk_bytes"] = built["build_s"], built["index_bytes"]
        fig["lucene_segments"], fig["lucene_docs"] = built["segments"], built["docs"]
        (docs / "passages.jsonl").unlink()
        opened = server.request("open", index=str(work / "index"), k1=params.k1, b=params.b)
        fig["lucene_open_s"] = opened["open_s"]
    except BaseException:
        server.close()
        raise
    return server

class LuceneBaseline:
    """The Lucene server with the passages indexed in a temporary folder under ``parent``, ready to time
    the bench's queries (pretokenised like the passages) in both modes; its figures go into ``fig``.

    The JVM compiles the hot paths while it runs: one untimed pass of each mode is made first (its time
    is reported as ``lucene_warmup_s``).
    """

    MODES = ("single", "batched")

    def __init__(self, python: str, corpus, tok, params, queries: Sequence[str], k: int, parent: Path,
                 fig: dict) -> None:
        self.folder = tempfile.TemporaryDirectory(prefix="lucene-", dir=str(parent))
        self.server = lucene_start(python, corpus, tok, params, Path(self.folder.name), fig)
        self.queries, self.k = [" ".join(tok(q)) for q in queries], k
        fig["lucene_warmup_s"] = sum(r["seconds"] for r in self.search_round().values())

    @classmethod
    def start(cls, python: Optional[str], skip: bool, corpus, tok, params, queries: Sequence[str], k: int,
              parent: Path, fig: dict) -> tuple[Optional["LuceneBaseline"], str]:
        """``(baseline, "")``, or ``(None, why it is skipped)``; ``python`` defaults to ``$TWICE_LUCENE_PYTHON``."""
        python = python or os.environ.get("TWICE_LUCENE_PYTHON", "")
        if skip:
            return None, "Lucene: skipped (--skip-lucene)"
        if not python:
            return None, ("Lucene: skipped (no pyserini environment: pass --lucene-python PATH or set "
                          "TWICE_LUCENE_PYTHON; `bash tests/sidecar/pyserini.sh --setup-only` builds one)")
        return cls(python, corpus, tok, params, queries, k, parent, fig), ""

    def search_round(self) -> dict:
        """One timed pass over the queries per mode: ``{mode: reply}`` (``seconds`` timed by the server, ``hits``)."""
        return {m: self.server.request("search", mode=m, k=self.k, queries=self.queries) for m in self.MODES}

    def close(self) -> None:
        """Stop the server and remove the index."""
        self.server.close()
        self.folder.cleanup()


# ----------------------------------------------------------------------------- in-memory baselines
def time_bm25s(corpus, tok, params, queries: Sequence[str], k: int, fig: dict) -> None:
    """bm25s (numpy backend, Lucene's BM25 variant, the same k1 and b) on the same tokens, where installed."""
    if not available("bm25s"):
        return
    import bm25s  # an optional baseline: imported only where it is installed

    tokens = [tok(t) for t in corpus.iter_contents()]
    ref = bm25s.BM25(k1=params.k1, b=params.b, method="lucene")
    t0 = time.perf_counter()
    ref.index(tokens, show_progress=False)
    fig["bm25s_build_s"] = time.perf_counter() - t0
    del tokens
    qtok = [[t for t in tok(q) if t in ref.vocab_dict] for q in queries]

    def run() -> None:
        for toks in qtok:
            if toks:
                s = ref.get_scores(toks)
                np.argpartition(-s, min(k, len(s)) - 1)[:k]

    fig["bm25s_qps"] = qps(run, len(queries))
    fig["pruned_over_bm25s"] = fig["pruned_single_qps"] / fig["bm25s_qps"]


def time_rank_bm25(corpus, tok, params, queries: Sequence[str], k: int, fig: dict) -> None:
    """rank_bm25's ``BM25Okapi`` (the ``bench`` extra) on the same tokens; it is slow, so few queries."""
    rank_bm25 = require("rank_bm25", "bench", "the rank_bm25 baseline")
    texts = [tok(t) for t in corpus.iter_contents()]
    t0 = time.perf_counter()
    baseline = rank_bm25.BM25Okapi(texts, k1=params.k1, b=params.b)
    fig["rank_bm25_build_s"] = time.perf_counter() - t0
    del texts
    t0 = time.perf_counter()
    for q in queries:
        s = baseline.get_scores(tok(q))
        np.argsort(-s, kind="stable")[:k]
    fig["rank_bm25_qps"] = len(queries) / (time.perf_counter() - t0)
    fig["pruned_over_rank_bm25"] = fig["pruned_single_qps"] / fig["rank_bm25_qps"]
