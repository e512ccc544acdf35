"""The language of the generated encyclopedia: its invented words, its passage templates, and reading facts back.

Every fact sentence of a passage comes from :data:`TEMPLATES` (a few variants each), the
relations between entity kinds are :data:`RELATIONS`, and :func:`extract_fact` reads a fact
back out of a passage with the same templates (as the scripted agents do).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional


# ----------------------------------------------------------------------------- vocabulary
_ONSETS = ("b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "qu", "r", "s",
           "st", "t", "th", "tr", "v", "w", "z", "sh", "ch", "j", "y", "sk")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "i", "o", "ai", "ei", "ou")
_CODAS = ("", "", "", "n", "r", "l", "s", "th", "m", "k", "nd", "rk", "st", "x", "v", "ll")
_COUNTRY_ENDS = ("ia", "land", "mark", "ovia", "enne", "aria")
_OCCUPATIONS = ("cartographer", "violinist", "chemist", "novelist", "architect", "botanist", "painter",
                "engineer", "astronomer", "sculptor", "economist", "glassmaker", "linguist", "surveyor",
                "composer", "physician", "historian", "playwright", "mathematician", "photographer")
_SETTLEMENTS = ("town", "city", "port town", "village", "market town")
_ORG_TYPES = ("university", "publishing house", "trading company", "orchestra", "museum", "shipyard",
              "observatory", "theatre company", "bank", "learned society")
_ORG_FORMS = ("{x} Institute", "{x} Academy", "House of {x}", "{x} Company", "{x} Society", "{x} Guild",
              "{x} Foundation", "{x} Works")
_WORK_TYPES = ("novel", "film", "album", "opera", "poem cycle", "play", "atlas", "symphony")
_ADJ = ("Glass", "Silent", "Amber", "Hollow", "Copper", "Distant", "Salt", "Paper", "Winter", "Crooked",
        "Velvet", "Iron", "Lantern", "Quiet", "Scarlet", "Willow", "Hidden", "Seventh", "Broken", "Golden",
        "Northern", "Idle", "Painted", "Sleeping", "Wandering", "Ashen", "Tidal", "Marble", "Burning", "Pale")
_NOUN = ("Harbour", "Orchard", "Lighthouse", "Ledger", "Compass", "Meridian", "Tapestry", "Bellfry", "Garden",
         "Caravan", "Mirror", "Archive", "Cathedral", "Estuary", "Lantern", "Clocktower", "Observatory",
         "Vineyard", "Chronicle", "Canal", "Furnace", "Pilgrim", "Weaver", "Cartouche", "Menagerie", "Atlas",
         "Sonata", "Reliquary", "Causeway", "Aviary")
_TRAITS = ("meticulous field notes", "an unusual teaching style", "a long correspondence with rivals",
           "a collection of rare maps", "late-night lectures", "a famously short temper",
           "a habit of working outdoors", "generous support of apprentices", "a series of public debates",
           "a lifelong interest in tides")
_FEATURES = ("its stone bridges", "a yearly lantern fair", "salt marshes", "terraced vineyards",
             "an old clock market", "copper mines", "a narrow harbour", "wool weaving", "a hilltop fortress",
             "its painted houses")


# ----------------------------------------------------------------------------- passage templates
# Each fact sentence has variants; the scripted agents read facts back with the same templates.
# Slots: {N} full name/title, {S} short name (surname), and fact names.
TEMPLATES: dict[str, list[list[str]]] = {
    "person": [
        ["{N} was a {occupation} born in {birthplace} in {birth_year}.",
         "{N} (born {birth_year} in {birthplace}) was a {occupation}."],
        ["{S} spent most of a long career at {employer}.",
         "For many years {S} worked for {employer}."],
        ["{S} is remembered for {trait}."],
    ],
    "place": [
        ["{N} is a {settlement} in {country}, founded in {founded}.",
         "Founded in {founded}, {N} is a {settlement} in {country}."],
        ["It has a population of {population}.",
         "The population of {N} is {population}."],
        ["The area is known for {feature}."],
    ],
    "org": [
        ["{N} is a {org_type} founded in {founded} by {founder}.",
         "{founder} founded {N}, a {org_type}, in {founded}."],
        ["Its headquarters are in {headquarters}.",
         "{N} is headquartered in {headquarters}."],
    ],
    "work": [
        ["{N} is a {work_type} by {creator}, first released in {year}.",
         "{creator} created the {work_type} {N} in {year}."],
        ["It was published by {publisher}.",
         "{N} was published by {publisher}."],
    ],
}

#: relation -> (entity kind it applies to, kind of the value or None for a literal)
RELATIONS: dict[tuple[str, str], Optional[str]] = {
    ("person", "birth_year"): None,
    ("person", "birthplace"): "place",
    ("person", "occupation"): None,
    ("person", "employer"): "org",
    ("place", "country"): None,
    ("place", "founded"): None,
    ("place", "population"): None,
    ("org", "founded"): None,
    ("org", "founder"): "person",
    ("org", "headquarters"): "place",
    ("work", "year"): None,
    ("work", "creator"): "person",
    ("work", "publisher"): "org",
}

#: words a good query adds to the entity name for a relation
RELATION_WORDS: dict[str, str] = {
    "birth_year": "born", "birthplace": "born", "occupation": "occupation", "employer": "worked for",
    "country": "country", "founded": "founded", "population": "population", "founder": "founded by",
    "headquarters": "headquarters", "year": "released", "creator": "created by", "publisher": "published by",
}

_QUESTION = {
    "birth_year": "In which year was {X} born?",
    "birthplace": "Where was {X} born?",
    "occupation": "What was the occupation of {X}?",
    "employer": "Which organisation did {X} work for?",
    "country": "In which country is {X}?",
    "founded": "In which year was {X} founded?",
    "population": "What is the population of {X}?",
    "founder": "Who founded {X}?",
    "headquarters": "In which town is {X} headquartered?",
    "year": "In which year was {X} first released?",
    "creator": "Who created {X}?",
    "publisher": "Which organisation published {X}?",
}
_NOUN_PHRASE = {
    "birthplace": "the birthplace of {X}",
    "employer": "the employer of {X}",
    "founder": "the founder of {X}",
    "headquarters": "the town where {X} is headquartered",
    "creator": "the creator of {X}",
    "publisher": "the publisher of {X}",
}
_COMPARE = {
    ("person", "birth_year"): ("Who was born earlier, {A} or {B}?", "min"),
    ("place", "population"): ("Which has the larger population, {A} or {B}?", "max"),
    ("place", "founded"): ("Which was founded earlier, {A} or {B}?", "min"),
    ("org", "founded"): ("Which was founded earlier, {A} or {B}?", "min"),
    ("work", "year"): ("Which was released earlier, {A} or {B}?", "min"),
}


@dataclass
class Entity:
    kind: str
    name: str
    short: str
    facts: dict = field(default_factory=dict)


def _fmt_value(relation: str, value: Any) -> str:
    if relation == "population":
        return f"{int(value):,}"
    return str(value)


def answer_forms(relation: str, value: Any) -> list[str]:
    """Gold answer strings for a fact value."""
    forms = [_fmt_value(relation, value)]
    if relation == "population":
        forms.append(str(int(value)))
    return forms


# ----------------------------------------------------------------------------- reading facts back
_SLOT_RE = re.compile(r"\{(\w+)\}")
_AN_RE = re.compile(r"\b([Aa]) (?=[aeiouAEIOU])")
_A_LITERAL = re.escape(" a ")


def _template_regex(template: str, target: str, subject: str, short: str) -> Optional[re.Pattern]:
    if "{" + target + "}" not in template:
        return None
    parts, pos = [], 0
    for m in _SLOT_RE.finditer(template):
        parts.append(re.escape(template[pos : m.start()]).replace(_A_LITERAL, r" an? "))
        slot = m.group(1)
        if slot == "N":
            parts.append(re.escape(subject))
        elif slot == "S":
            parts.append(re.escape(short))
        elif slot == target:
            parts.append(r"(?P<v>[^.()]+?)")
        else:
            parts.append(r"[^.()]+?")
        pos = m.end()
    parts.append(re.escape(template[pos:]))
    return re.compile("".join(parts))


def short_name(kind: str, name: str) -> str:
    """The short form passages use for an entity (a person's surname)."""
    return name.split()[-1] if kind == "person" else name


def extract_fact(text: str, kind: str, subject: str, relation: str) -> Optional[str]:
    """Read ``relation`` of ``subject`` (an entity of ``kind``) from its passage text, or None."""
    short = short_name(kind, subject)
    for group in TEMPLATES.get(kind, []):
        for t in group:
            rx = _template_regex(t, relation, subject, short)
            if rx is None:
                continue
            m = rx.search(text)
            if m:
                return m.group("v").strip()
    return None
