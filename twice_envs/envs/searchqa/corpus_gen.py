"""A deterministic generator of a fictional encyclopedia and multi-hop questions about it.

Everything here is invented (people, towns, organisations, works, countries), so a
model cannot answer from memory: it has to search. Each entity gets one
Wikipedia-style passage holding several facts; a share of entities get a
near-duplicate twin (one letter changed, same surname, another adjective) with
different facts, so careless queries and careless reading are punished.

Questions are single-hop, 2-hop and 3-hop compositional ("the population of the
birthplace of the creator of X") and comparisons ("who was born earlier, A or B").
Each question records its program (start entity and relations), which the scripted
agents read passages with.

Randomness comes only from the PCG64 bit stream (fixed by its algorithm, not by the
numpy version) through :class:`Rng`, never from ``hash()`` or set order, so a seed
gives byte-identical files on every machine.

Generated files are a cache (:mod:`twice_envs._cache`): a folder generated aside and
renamed into place, with a manifest recording each file's size and digest, checked on
every use. A damaged, missing or foreign file is named in a ``RuntimeWarning`` and the
folder is generated again (the same bytes).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from twice_envs._cache import MANIFEST, cached, read_manifest, write_manifest
from twice_envs.envs.searchqa.corpus_wiki18 import (
    WIKI18_GENERATOR_VERSION,
    WIKI18_PASSAGES,
    Wiki18Names,
    _draws,
    iter_wiki18_corpus,
    wiki18_hop_queries,
)
from twice_envs.envs.searchqa.corpus_words import (
    _ADJ,
    _AN_RE,
    _CODAS,
    _COMPARE,
    _COUNTRY_ENDS,
    _FEATURES,
    _NOUN,
    _NOUN_PHRASE,
    _OCCUPATIONS,
    _ONSETS,
    _ORG_FORMS,
    _ORG_TYPES,
    _QUESTION,
    _SETTLEMENTS,
    _TRAITS,
    _VOWELS,
    _WORK_TYPES,
    RELATION_WORDS,
    RELATIONS,
    TEMPLATES,
    Entity,
    _fmt_value,
    answer_forms,
    extract_fact,
    short_name,
)
from twice_envs.errors import DataFormatError

__all__ = [
    "GENERATED_FORMAT",
    "GENERATOR_VERSION",
    "RELATIONS",
    "RELATION_WORDS",
    "TEMPLATES",
    "WIKI18_FORMAT",
    "WIKI18_GENERATOR_VERSION",
    "WIKI18_PASSAGES",
    "Entity",
    "GeneratorConfig",
    "Rng",
    "Wiki18Names",
    "answer_forms",
    "config_for_passages",
    "extract_fact",
    "generate",
    "iter_wiki18_corpus",
    "short_name",
    "wiki18_hop_queries",
    "write_generated",
    "write_wiki18",
]

#: Bump when the generated text changes (part of the cache key and the corpus version).
GENERATOR_VERSION = "1"


@dataclass(frozen=True)
class GeneratorConfig:
    """Size and seed of a generated encyclopedia.

    Attributes:
        seed: the generator seed (same seed, same bytes).
        num_entities: base entities (40% people, 20% towns, 20% organisations, 20% works);
            near-duplicates come on top.
        distractor_rate: probability that an entity gets a near-duplicate twin.
        num_countries: fictional countries towns belong to.
        num_train: questions in the train split.
        num_dev: questions in the dev split.
        num_test: questions in the test split.
        mix: shares of single-hop, 2-hop, 3-hop and comparison questions.
    """

    seed: int = 0
    num_entities: int = 2000
    distractor_rate: float = 0.5
    num_countries: int = 12
    num_train: int = 4000
    num_dev: int = 500
    num_test: int = 500
    mix: tuple[float, float, float, float] = (0.3, 0.3, 0.2, 0.2)

    @classmethod
    def from_kwargs(cls, kwargs: Optional[dict]) -> "GeneratorConfig":
        kwargs = dict(kwargs or {})
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"unknown generator options {unknown}; accepted: {sorted(known)}")
        if "mix" in kwargs:
            kwargs["mix"] = tuple(float(x) for x in kwargs["mix"])
        cfg = cls(**kwargs)
        if cfg.num_entities < 20:
            raise ValueError("num_entities must be at least 20")
        if len(cfg.mix) != 4 or min(cfg.mix) < 0 or sum(cfg.mix) <= 0:
            raise ValueError("mix must be four non-negative shares (single, 2-hop, 3-hop, comparison)")
        return cfg

    def digest(self) -> str:
        payload = json.dumps([GENERATOR_VERSION, asdict(self)], sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()


def config_for_passages(passages: int, **kwargs: Any) -> GeneratorConfig:
    """A config whose corpus has about ``passages`` passages."""
    rate = float(kwargs.pop("distractor_rate", 0.5))
    return GeneratorConfig.from_kwargs({"num_entities": max(20, int(round(passages / (1 + rate)))), "distractor_rate": rate, **kwargs})


class Rng:
    """Platform-independent draws from the raw PCG64 stream."""

    def __init__(self, seed: int, block: int = 4096) -> None:
        self._bg = np.random.PCG64(int(seed))
        self._buf: list[int] = []
        self._block = int(block)

    def raw(self) -> int:
        if not self._buf:
            self._buf = self._bg.random_raw(self._block).tolist()[::-1]
        return self._buf.pop()

    def below(self, n: int) -> int:
        """Uniform int in ``[0, n)``."""
        return (self.raw() * n) >> 64

    def between(self, lo: int, hi: int) -> int:
        """Uniform int in ``[lo, hi]``."""
        return lo + self.below(hi - lo + 1)

    def random(self) -> float:
        return (self.raw() >> 11) * (1.0 / (1 << 53))

    def choice(self, seq: Sequence[Any]) -> Any:
        return seq[self.below(len(seq))]

    def shuffle(self, items: list) -> None:
        for i in range(len(items) - 1, 0, -1):
            j = self.below(i + 1)
            items[i], items[j] = items[j], items[i]


# ----------------------------------------------------------------------------- the generator
class _Names:
    def __init__(self, rng: Rng) -> None:
        self.rng = rng
        self.used: dict[str, bool] = {}

    def word(self, syllables: int) -> str:
        r = self.rng
        s = "".join(r.choice(_ONSETS) + r.choice(_VOWELS) for _ in range(syllables)) + r.choice(_CODAS)
        return s.capitalize()

    def unique(self, make) -> str:
        for _ in range(1000):
            n = make()
            if n not in self.used:
                self.used[n] = True
                return n
        raise RuntimeError(f"name space exhausted after {len(self.used):,} distinct names: the generator cannot "
                           "name this many entities; use fewer (the wiki-18-format corpus, write_wiki18, has no "
                           "such limit)")

    def claim(self, name: str) -> bool:
        if name in self.used:
            return False
        self.used[name] = True
        return True


def _mutate(rng: Rng, word: str) -> str:
    """One letter changed (never the first), as near-duplicate names have."""
    letters = list(word)
    i = 1 + rng.below(max(1, len(letters) - 1))
    i = min(i, len(letters) - 1)
    choices = [c for c in "aeiourlnstkm" if c != letters[i].lower()]
    letters[i] = rng.choice(choices)
    return "".join(letters)


def _near_duplicate(rng: Rng, names: _Names, e: Entity) -> Optional[str]:
    for _ in range(20):
        if e.kind == "person":
            first, last = e.name.split(" ", 1)
            cand = f"{names.word(1 + rng.below(2))} {last}" if rng.random() < 0.5 else f"{first} {_mutate(rng, last)}"
        elif e.kind == "place":
            cand = _mutate(rng, e.name) if rng.random() < 0.6 else f"{rng.choice(('New', 'Upper', 'Lower', 'Old'))} {e.name}"
        elif e.kind == "org":
            base = e.facts["_root"]
            form = rng.choice(_ORG_FORMS)
            cand = form.format(x=base) if rng.random() < 0.5 else e.name.replace(base, _mutate(rng, base))
        else:
            words = e.name.split()
            if words[2] == "of":
                words[3] = _mutate(rng, words[3]) if rng.random() < 0.5 else words[3]
                words[1] = words[1] if words[3] != e.name.split()[3] else rng.choice(_NOUN)
            elif rng.random() < 0.5:
                words[1] = rng.choice(_ADJ)
            else:
                words[2] = rng.choice(_NOUN)
            cand = " ".join(words)
        if names.claim(cand):
            return cand
    return None


def _passage(e: Entity, rng: Rng) -> str:
    values = {"N": e.name, "S": e.short}
    values.update({k: _fmt_value(k, v) for k, v in e.facts.items() if not k.startswith("_")})
    sentences = [_AN_RE.sub(r"\1n ", rng.choice(group).format(**values)) for group in TEMPLATES[e.kind]]
    return f'"{e.name}"\n' + " ".join(sentences)


def generate(cfg: GeneratorConfig) -> tuple[list[dict], dict[str, list[dict]]]:
    """The corpus rows (``{"id", "contents"}``) and the question rows per split."""
    rng = Rng(cfg.seed)
    names = _Names(rng)
    n = cfg.num_entities
    counts = {"person": int(n * 0.4), "place": int(n * 0.2), "org": int(n * 0.2)}
    counts["work"] = n - sum(counts.values())

    countries = [names.unique(lambda: names.word(2) + rng.choice(_COUNTRY_ENDS)) for _ in range(cfg.num_countries)]
    ents: dict[str, list[Entity]] = {k: [] for k in ("place", "org", "person", "work")}
    for _ in range(counts["place"]):
        nm = names.unique(lambda: names.word(2 + rng.below(2)))
        ents["place"].append(Entity("place", nm, nm))
    for _ in range(counts["org"]):
        root = names.word(2)
        nm = names.unique(lambda: rng.choice(_ORG_FORMS).format(x=root))
        ents["org"].append(Entity("org", nm, nm, {"_root": root}))
    for _ in range(counts["person"]):
        nm = names.unique(lambda: f"{names.word(1 + rng.below(2))} {names.word(2 + rng.below(2))}")
        ents["person"].append(Entity("person", nm, nm.split()[-1]))
    for _ in range(counts["work"]):
        nm = names.unique(
            lambda: f"The {rng.choice(_ADJ)} {rng.choice(_NOUN)}" if rng.random() < 0.4
            else f"The {rng.choice(_NOUN)} of {names.word(2)}"
        )
        ents["work"].append(Entity("work", nm, nm))
    # near-duplicates
    for kind in ("place", "org", "person", "work"):
        for e in list(ents[kind]):
            if rng.random() < cfg.distractor_rate:
                nm = _near_duplicate(rng, names, e)
                if nm is not None:
                    facts = {"_root": e.facts["_root"]} if kind == "org" else {}
                    ents[kind].append(Entity(kind, nm, short_name(kind, nm), facts))
    # facts
    for p in ents["place"]:
        p.facts.update(country=rng.choice(countries), founded=rng.between(900, 1850),
                       population=rng.between(10, 20000) * 100, settlement=rng.choice(_SETTLEMENTS),
                       feature=rng.choice(_FEATURES))
    for pe in ents["person"]:
        pe.facts.update(birth_year=rng.between(1720, 1960), birthplace=rng.choice(ents["place"]).name,
                        occupation=rng.choice(_OCCUPATIONS), trait=rng.choice(_TRAITS))
    by_name = {e.name: e for k in ents for e in ents[k]}
    for o in ents["org"]:
        founder = rng.choice(ents["person"])
        o.facts.update(org_type=rng.choice(_ORG_TYPES), founder=founder.name,
                       founded=founder.facts["birth_year"] + rng.between(22, 60),
                       headquarters=rng.choice(ents["place"]).name)
    for pe in ents["person"]:
        pe.facts["employer"] = rng.choice(ents["org"]).name
    for w in ents["work"]:
        creator = rng.choice(ents["person"])
        w.facts.update(work_type=rng.choice(_WORK_TYPES), creator=creator.name,
                       year=creator.facts["birth_year"] + rng.between(18, 70),
                       publisher=rng.choice(ents["org"]).name)

    everything = [e for k in ("place", "org", "person", "work") for e in ents[k]]
    rng.shuffle(everything)
    corpus = [{"id": str(i), "contents": _passage(e, rng)} for i, e in enumerate(everything)]

    questions = _questions(cfg, rng, ents, by_name)
    return corpus, questions


def _fact_value(e: Entity, relation: str) -> Any:
    return e.facts[relation]


def _questions(cfg: GeneratorConfig, rng: Rng, ents: dict[str, list[Entity]], by_name: dict[str, Entity]) -> dict[str, list[dict]]:
    total = cfg.num_train + cfg.num_dev + cfg.num_test
    kinds = ("single", "compose2", "compose3", "compare")
    cum, acc = [], 0.0
    for s in cfg.mix:
        acc += s / sum(cfg.mix)
        cum.append(acc)
    all_entities = [e for k in ("place", "org", "person", "work") for e in ents[k]]
    seen: dict[str, bool] = {}
    rows: list[dict] = []
    attempts = 0
    while len(rows) < total and attempts < total * 50:
        attempts += 1
        u = rng.random()
        qtype = kinds[next(i for i, c in enumerate(cum) if u <= c or i == 3)]
        q = _compare_question(rng, ents) if qtype == "compare" else _compose_question(rng, all_entities, by_name, {"single": 1, "compose2": 2, "compose3": 3}[qtype])
        if q is None or q["question"] in seen:
            continue
        seen[q["question"]] = True
        q["metadata"]["type"] = qtype
        rows.append(q)
    rng.shuffle(rows)
    splits = {"train": rows[: cfg.num_train], "dev": rows[cfg.num_train : cfg.num_train + cfg.num_dev],
              "test": rows[cfg.num_train + cfg.num_dev :]}
    out: dict[str, list[dict]] = {}
    for split, qs in splits.items():
        out[split] = [{"id": f"gen_{split}_{i}", **q} for i, q in enumerate(qs)]
    return out


def _compose_question(rng: Rng, all_entities: list[Entity], by_name: dict[str, Entity], hops: int) -> Optional[dict]:
    start = rng.choice(all_entities)
    chain, e = [], start
    steps = []
    for h in range(hops):
        rels = [r for (k, r), target in RELATIONS.items() if k == e.kind and (h == hops - 1 or target is not None)]
        if not rels:
            return None
        rel = rng.choice(rels)
        value = _fact_value(e, rel)
        steps.append({"title": e.name, "kind": e.kind, "relation": rel, "query": f"{e.name} {RELATION_WORDS[rel]}"})
        chain.append(rel)
        if h < hops - 1:
            e = by_name[value]
    phrase = start.name
    for rel in chain[:-1]:
        phrase = _NOUN_PHRASE[rel].format(X=phrase)
    question = _QUESTION[chain[-1]].format(X=phrase)
    return {
        "question": question,
        "golden_answers": answer_forms(chain[-1], value),
        "metadata": {"program": {"op": "compose", "start": start.name, "start_kind": start.kind, "relations": chain},
                     "hops": steps},
    }


def _compare_question(rng: Rng, ents: dict[str, list[Entity]]) -> Optional[dict]:
    (kind, rel), (template, pick) = rng.choice(list(_COMPARE.items()))
    pool = ents[kind]
    a, b = rng.choice(pool), rng.choice(pool)
    va, vb = _fact_value(a, rel), _fact_value(b, rel)
    if a is b or va == vb:
        return None
    winner = a if (va < vb) == (pick == "min") else b
    return {
        "question": template.format(A=a.name, B=b.name),
        "golden_answers": [winner.name],
        "metadata": {"program": {"op": "compare", "kind": kind, "relation": rel, "pick": pick, "entities": [a.name, b.name]},
                     "hops": [{"title": x.name, "kind": kind, "relation": rel, "query": f"{x.name} {RELATION_WORDS[rel]}"} for x in (a, b)]},
    }


# ----------------------------------------------------------------------------- files
def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=True, separators=(", ", ": ")) + "\n" for r in rows).encode("ascii")


#: What the manifests of generated folders name (version 2: checked on every use).
GENERATED_FORMAT = "searchqa.generated/2"
WIKI18_FORMAT = "searchqa.wiki18/2"


def _generated_folder(directory: Path, fmt: str, names: Sequence[str], want: dict, build, what: str) -> dict[str, Path]:
    """The ``<name>.jsonl`` paths of a generated folder, checked against its manifest (sizes and
    digests, and the settings ``want`` in its metadata), generated by ``build(tmp)`` when missing
    or damaged."""
    files = [f"{name}.jsonl" for name in names]

    def check(d: Path) -> dict[str, Path]:
        meta = read_manifest(d, fmt, files)
        if meta.get("settings") != want:
            raise DataFormatError(d / MANIFEST, None, f"generated with {meta.get('settings')}, not {want}")
        return {name: d / f"{name}.jsonl" for name in names}

    return cached(Path(directory), check, build, what)


def write_generated(cfg: GeneratorConfig, directory: Path) -> dict[str, Path]:
    """Generate into ``directory`` unless it holds these files already, checked against its manifest.

    The folder is generated aside and renamed into place; its manifest records each
    file's size and digest and is checked on every call (a damaged file is named in a
    ``RuntimeWarning`` and the folder generated again). Returns the paths of ``corpus``,
    ``train``, ``dev`` and ``test``.
    """
    names = ("corpus", "train", "dev", "test")
    want = json.loads(json.dumps({"generator_version": GENERATOR_VERSION, "config": asdict(cfg)}))

    def build(tmp: Path) -> None:
        corpus, questions = generate(cfg)
        blobs = {"corpus": _jsonl(corpus), **{s: _jsonl(q) for s, q in questions.items()}}
        for name in names:
            (tmp / f"{name}.jsonl").write_bytes(blobs[name])
        write_manifest(tmp, GENERATED_FORMAT, [f"{name}.jsonl" for name in names], {
            "settings": want, "sha256": {k: hashlib.sha256(v).hexdigest() for k, v in blobs.items()},
            "passages": len(corpus), "questions": {s: len(q) for s, q in questions.items()}})

    return _generated_folder(directory, GENERATED_FORMAT, names, want, build, "generated SearchQA data")


# ----------------------------------------------------------------------------- wiki-18 scale, written
def write_wiki18(directory: str | Path, passages: int = WIKI18_PASSAGES, seed: int = 0, *, questions: int = 500,
                 progress=None) -> dict[str, Path]:
    """Stream a generated corpus in the wiki-18 file format into ``directory`` unless present.

    ``corpus.jsonl`` holds one ``{"id", "contents": '"Title"\\ntext'}`` line per passage
    (about 100 words each, like wiki-18's passages), written a chunk at a time;
    ``dev.jsonl`` holds FlashRAG questions (the
    birth years of persons). The folder is generated aside and renamed into place, its
    manifest (sizes, and digests: sampled for the large corpus) checked on every call as
    :func:`write_generated`'s. ``progress(passages_done)`` is called after each chunk.
    Returns the paths of ``corpus`` and ``dev``.
    """
    want = {"generator": f"wiki18/{WIKI18_GENERATOR_VERSION}", "passages": passages, "seed": seed,
            "questions": questions}

    def build(tmp: Path) -> None:
        sha = hashlib.sha256()
        with open(tmp / "corpus.jsonl", "wb") as fh:
            buf, done = [], 0
            for pid, text in iter_wiki18_corpus(passages, seed):
                buf.append(json.dumps({"id": pid, "contents": text}, ensure_ascii=True, separators=(", ", ": ")) + "\n")
                if len(buf) == 20_000:
                    blob = "".join(buf).encode("ascii")
                    sha.update(blob)
                    fh.write(blob)
                    done += len(buf)
                    buf = []
                    if progress is not None:
                        progress(done)
            blob = "".join(buf).encode("ascii")
            sha.update(blob)
            fh.write(blob)
        names = Wiki18Names(passages, seed)
        persons = names.pick("person", _draws(seed + 2, np.arange(questions, dtype=np.int64), 1)[:, 0])
        rows = [{"id": f"wiki18_dev_{j}", "question": f"In which year was {name} born?", "golden_answers": [str(year)]}
                for j, (name, year) in enumerate(zip(names.names(persons), names.birth_year(persons).tolist()))]
        (tmp / "dev.jsonl").write_text("".join(json.dumps(r, ensure_ascii=True) + "\n" for r in rows), encoding="ascii")
        write_manifest(tmp, WIKI18_FORMAT, ["corpus.jsonl", "dev.jsonl"],
                       {"settings": want, "sha256": {"corpus": sha.hexdigest()}})

    return _generated_folder(directory, WIKI18_FORMAT, ("corpus", "dev"), want, build, "generated wiki-18 corpus")
