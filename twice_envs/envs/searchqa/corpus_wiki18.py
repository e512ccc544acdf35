"""A wiki-18-scale generated corpus, streamed: every entity's name and facts computed from its index alone.

Search-R1's wiki-18 corpus has about 21 million passages; this one has as many (or any other
number), about 100 words each, generated a chunk at a time with a fixed, platform-independent
hash of ``(seed, index)`` (splitmix64), so no chunk depends on another and the bytes are the
same on every machine. :func:`iter_wiki18_corpus` yields the passages and
:func:`wiki18_hop_queries` draws queries with the passage that answers them.
"""

from __future__ import annotations

import numpy as np

from twice_envs.envs.searchqa.corpus_words import (
    _ADJ,
    _CODAS,
    _FEATURES,
    _NOUN,
    _OCCUPATIONS,
    _ONSETS,
    _ORG_FORMS,
    _ORG_TYPES,
    _SETTLEMENTS,
    _TRAITS,
    _VOWELS,
    _WORK_TYPES,
)


#: Bump when the streamed wiki-18-format text changes.
WIKI18_GENERATOR_VERSION = "1"
#: Passages in the Search-R1 wiki-18 corpus.
WIKI18_PASSAGES = 21_015_324
#: Entity kind of passage ``i`` is ``_WIKI18_KINDS[i % 5]``.
_WIKI18_KINDS = ("person", "person", "place", "org", "work")
_KIND_OFFSET = {"person": 0, "place": 2, "org": 3, "work": 4}
_M64 = (1 << 64) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic): a fixed, platform-independent hash."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _draws(seed: int, idx: np.ndarray, fields: int) -> np.ndarray:
    """``fields`` independent 64-bit draws per entity index: shape (len(idx), fields)."""
    base = np.uint64((int(seed) * 0x9E3779B97F4A7C15) & _M64)
    with np.errstate(over="ignore"):
        x = (idx.astype(np.uint64)[:, None] * np.uint64(0x100000001B3)
             + np.arange(fields, dtype=np.uint64)[None, :] * np.uint64(0xD1B54A32D192ED03) + base)
    return _mix(_mix(x))


def _word(h: int, syllables: int) -> str:
    s = []
    for _ in range(syllables):
        s.append(_ONSETS[h % len(_ONSETS)] + _VOWELS[(h >> 5) % len(_VOWELS)])
        h >>= 9
    return ("".join(s) + _CODAS[h % len(_CODAS)]).capitalize()


class Wiki18Names:
    """Names and facts of the entities of a streamed wiki-18-scale corpus, computed from their index alone.

    Entity ``i`` (passage ``i``) is of kind ``_WIKI18_KINDS[i % 5]``; everything about it
    comes from a hash of ``(seed, i)``, so any passage can name any other without the
    generator remembering anything. Names are not guaranteed unique (collisions are rare).
    """

    FIELDS = 12

    def __init__(self, passages: int, seed: int = 0) -> None:
        if passages < 5:
            raise ValueError("a wiki-18-scale corpus needs at least 5 passages")
        self.n, self.seed = int(passages), int(seed)

    def count(self, kind: str) -> int:
        off = _KIND_OFFSET[kind]
        return (self.n - off + 4) // 5 if kind != "person" else (self.n + 4) // 5 + (self.n + 3) // 5

    def pick(self, kind: str, h: np.ndarray) -> np.ndarray:
        """Entity indices of ``kind``, one per 64-bit draw in ``h``."""
        if kind == "person":  # positions 5r and 5r + 1
            r = (h % np.uint64(self.count("person"))).astype(np.int64)
            return (r // 2) * 5 + (r % 2)
        return (h % np.uint64(self.count(kind))).astype(np.int64) * 5 + _KIND_OFFSET[kind]

    def names(self, idx: np.ndarray) -> list[str]:
        d = _draws(self.seed, idx, 2)
        out = []
        for i, (h0, h1) in zip(idx.tolist(), d.tolist()):
            kind = _WIKI18_KINDS[i % 5]
            if kind == "person":
                out.append(f"{_word(h0 >> 4, 1 + (h0 & 1))} {_word(h1 >> 4, 2 + (h1 & 1))}")
            elif kind == "place":
                out.append(_word(h0 >> 4, 2 + (h0 & 1)))
            elif kind == "org":
                out.append(_ORG_FORMS[h1 % len(_ORG_FORMS)].format(x=_word(h0 >> 4, 2)))
            elif h1 & 1:
                out.append(f"The {_ADJ[(h0 >> 8) % len(_ADJ)]} {_NOUN[(h0 >> 16) % len(_NOUN)]}")
            else:
                out.append(f"The {_NOUN[(h0 >> 8) % len(_NOUN)]} of {_word(h0 >> 20, 2)}")
        return out

    def birth_year(self, idx: np.ndarray) -> np.ndarray:
        """Birth year of persons (field 2), as the passages state it."""
        return 1720 + (_draws(self.seed, idx, 3)[:, 2] % np.uint64(241)).astype(np.int64)


def _wiki18_chunk(names: Wiki18Names, start: int, stop: int) -> list[str]:
    """The ``contents`` of passages ``start..stop-1`` (about 100 words each)."""
    idx = np.arange(start, stop, dtype=np.int64)
    d = _draws(names.seed, idx, Wiki18Names.FIELDS)
    own = names.names(idx)
    refs = {kind: [names.names(names.pick(kind, d[:, f])) for f in fields]
            for kind, fields in (("person", (3, 4, 5)), ("place", (6, 7, 8)), ("org", (9, 10)))}
    col = d.tolist()
    births = names.birth_year(idx).tolist()
    out = []
    for j, i in enumerate(range(start, stop)):
        h = col[j]
        kind, name = _WIKI18_KINDS[i % 5], own[j]
        p = [refs["person"][f][j] for f in range(3)]
        pl = [refs["place"][f][j] for f in range(3)]
        og = [refs["org"][f][j] for f in range(2)]
        y = births[j]
        t1, f1 = h[11] % 10, (h[11] >> 16) % 10
        trait, trait2 = _TRAITS[t1], _TRAITS[(t1 + 1 + (h[11] >> 8) % 9) % 10]
        feat, feat2 = _FEATURES[f1], _FEATURES[(f1 + 1 + (h[11] >> 24) % 9) % 10]
        if kind == "person":
            short = name.split()[-1]
            occ = _OCCUPATIONS[h[0] % len(_OCCUPATIONS)]
            text = (f"{name} was {'an' if occ[0] in 'aeiou' else 'a'} {occ} born in {pl[0]} in {y}. {short} spent most of a long "
                    f"career at {og[0]}, and later taught at {og[1]}. {short} is remembered for {trait}, and for {trait2}. "
                    f"{short} studied under {p[0]} and corresponded for many years with {p[1]} about the history of "
                    f"{pl[1]}. A collection of letters and notebooks is kept in {pl[2]}, where {short} spent the last "
                    f"years of a long life. {short} died in {y + 40 + h[1] % 45}, and a street in {pl[0]} was named "
                    f"after {short} by {p[2]}.")
        elif kind == "place":
            settle = _SETTLEMENTS[h[0] % len(_SETTLEMENTS)]
            text = (f"{name} is a {settle} founded in {900 + h[1] % 951}. It has a population of {(10 + h[2] % 19991) * 100:,}. "
                    f"The area is known for {feat} and {feat2}. Notable people born there include {p[0]}, {p[1]} and "
                    f"{p[2]}. {name} lies near {pl[0]}, and the old road to {pl[1]} passes through it. Its largest "
                    f"employer is {og[0]}, which has been based there since {1750 + h[1] % 200}; {og[1]} opened an office "
                    f"there later. Visitors often continue to {pl[2]}.")
        elif kind == "org":
            otype = _ORG_TYPES[h[0] % len(_ORG_TYPES)]
            text = (f"{name} is {'an' if otype[0] in 'aeiou' else 'a'} {otype} founded in {1750 + h[1] % 230} by {p[0]}. Its "
                    f"headquarters are in {pl[0]}. Its members have included {p[1]} and {p[2]}, and it once shared a "
                    f"building with {og[0]}. In {1800 + h[2] % 200} it opened a branch in {pl[1]}, and it later "
                    f"worked with {og[1]} on projects in {pl[2]}. It is known for {trait} and for {feat}.")
        else:
            wtype = _WORK_TYPES[h[0] % len(_WORK_TYPES)]
            text = (f"{name} is {'an' if wtype[0] in 'aeiou' else 'a'} {wtype} by {p[0]}, first released in {1760 + h[1] % 250}. "
                    f"It was published by {og[0]}. The {wtype} is set in {pl[0]} and follows {p[1]} through "
                    f"{feat}. A later edition appeared with a preface by {p[2]}, printed by {og[1]} in {pl[1]}. "
                    f"Critics praised its portrayal of {feat2} and of {trait}. A copy of the first edition is kept in "
                    f"{pl[2]}.")
        out.append(f'"{name}"\n{text}')
    return out


def iter_wiki18_corpus(passages: int, seed: int = 0, chunk: int = 20_000):
    """Yield ``(id, contents)`` for the passages of a streamed wiki-18-scale corpus, one chunk in memory at a time."""
    names = Wiki18Names(passages, seed)
    for start in range(0, names.n, chunk):
        stop = min(names.n, start + chunk)
        for i, text in zip(range(start, stop), _wiki18_chunk(names, start, stop)):
            yield str(i), text


def wiki18_hop_queries(passages: int, n: int, seed: int = 0) -> list[tuple[str, int]]:
    """``n`` queries ``"<name> <relation words>"`` for random entities, with the entity's passage position."""
    names = Wiki18Names(passages, seed)
    idx = (_draws(seed + 1, np.arange(n, dtype=np.int64), 1)[:, 0] % np.uint64(names.n)).astype(np.int64)
    words = {"person": ("born", "worked for", "occupation"), "place": ("population", "founded", "known for"),
             "org": ("founded by", "headquarters", "founded"), "work": ("published by", "released", "created by")}
    out = []
    for j, (i, name) in enumerate(zip(idx.tolist(), names.names(idx))):
        rel = words[_WIKI18_KINDS[i % 5]][j % 3]
        out.append((f"{name} {rel}", i))
    return out
