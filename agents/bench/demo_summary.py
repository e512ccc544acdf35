"""The demo's summary: a few figures, each with its 95% CI and one plain sentence, in at most 40 lines.

Every figure the summary prints is a :class:`Figure` kept in ``summary.json`` with the same value and
interval, so the printed numbers can be checked against the file (the tests do). The figures:

* the lab's Table 2 contrast: how much less often Twice's one-twin credit has the wrong sign than
  CRR's one independent counterfactual (the same auxiliary cost), from exact advantages;
* the lab's coupling: rho-bar and what it is worth in budget, ``X = 1 / (1 - rho-bar)``;
* learning at each method's own tuned step size on ChoiceLab, where twins are strongly coupled and
  where they are weakly coupled: Twice's area minus GRPO's, paired over seeds;
* the LLM run: dev EM before and after GRPO and Twice, and Twice minus GRPO paired question by question
  (both at one shared step size, said as such).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

MAX_LINES = 40


@dataclass
class Figure:
    """One printed figure: ``value`` with its 95% interval ``[lo, hi]``, printed with ``fmt``."""

    key: str
    value: float
    lo: float
    hi: float
    fmt: str = ".3f"
    significant: Optional[bool] = None
    """Whether the interval excludes the null value (None: not a comparison)."""
    meaning: str = ""
    """What the figure is, in words (kept in the JSON beside it)."""

    def text(self, signed: bool = False) -> str:
        """``value [lo, hi]`` as printed."""
        f = ("+" if signed else "") + self.fmt
        return f"{self.value:{f}} [{self.lo:{f}}, {self.hi:{f}}]"

    def verdict(self) -> str:
        return "significant" if self.significant else "not significant"


def _ci(d: dict) -> tuple[float, float, float]:
    return float(d["value"]), float(d["lo"]), float(d["hi"])


def lab_figures(audit_doc: dict) -> list[Figure]:
    """Table 2's Twice-vs-CRR wrong-sign contrast and the coupling figures of a lab audit's JSON."""
    figs = []
    rows = {r["method"]: r for r in audit_doc["rows"]}
    comp = next((c for c in audit_doc["comparisons"] if c["twice"] == "twice J1" and c["baseline"] == "crr J1"
                 and c["figure"] == "wrong_sign"), None)
    if comp is not None and "twice J1" in rows and "crr J1" in rows:
        figs.append(Figure("lab_twice_wrong_sign", *(100 * x for x in _ci(rows["twice J1"]["wrong_sign"])), fmt=".1f",
                           meaning="wrong-sign % of Twice's one-twin credit against exact A*"))
        figs.append(Figure("lab_crr_wrong_sign", *(100 * x for x in _ci(rows["crr J1"]["wrong_sign"])), fmt=".1f",
                           meaning="wrong-sign % of CRR's one independent counterfactual against exact A*"))
        r = comp.get("ratio")
        if r and r["value"] > 0 and r["lo"] > 0:  # CRR's rate over Twice's: "x times less often"
            figs.append(Figure("lab_wrong_sign_times_less", 1 / r["value"], 1 / r["hi"], 1 / r["lo"], fmt=".2f",
                               significant=bool(comp["significant"]),
                               meaning="CRR's wrong-sign rate over Twice's at the same auxiliary cost"))
    coupling = audit_doc.get("coupling") or {}
    if coupling.get("rho_bar"):
        figs.append(Figure("lab_rho_bar", *_ci(coupling["rho_bar"]), meaning="rho-bar, exact oracle"))
        worth = coupling["worth"]["rho_bar"]
        if worth["determined"]:
            figs.append(Figure("lab_coupling_worth", worth["value"], worth["lo"], worth["hi"], fmt=".2f",
                               meaning="X = 1/(1 - rho-bar): one coupled twin's worth in independent counterfactuals"))
    return figs


def learn_figure(key: str, learn: dict, method: str = "twice") -> Optional[Figure]:
    """``method``'s area minus GRPO's (paired over seeds, each at its tuned step size) from a learn result."""
    row = learn["methods"].get(method, {})
    v = (row.get("vs_grpo") or {}).get("area")
    if not v:
        return None
    return Figure(key, float(v["mean"]), float(v["ci"][0]), float(v["ci"][1]), significant=bool(v["significant"]),
                  meaning=f"{method} area - GRPO area (mean exact V(s0) over the updates), paired over seeds")


@dataclass
class Summary:
    """What the demo ran, its figures, and where the rest is."""

    ran: list = field(default_factory=list)
    """One line per stage: what was run, at what size."""
    figures: dict = field(default_factory=dict)
    """``key -> Figure``."""
    notes: list = field(default_factory=list)
    """Lines that carry no new figure (what was left out, and why)."""
    files: dict = field(default_factory=dict)
    """``label -> path``."""
    settings: dict = field(default_factory=dict)
    """Every other number the summary prints (sizes, step sizes, counts)."""

    def add(self, fig: Optional[Figure]) -> None:
        if fig is not None:
            self.figures[fig.key] = fig

    def as_dict(self) -> dict:
        return {"ran": self.ran, "figures": {k: asdict(f) for k, f in self.figures.items()}, "notes": self.notes,
                "files": self.files, "settings": self.settings}


def lines(s: Summary) -> list[str]:
    """The printed summary (at most :data:`MAX_LINES` lines; a figure missing from ``s`` drops its sentence)."""
    f, st = s.figures, s.settings
    took = f" ({st['seconds']} s)" if "seconds" in st else ""
    out = [f"twice demo{took}: what a coupled twin buys, on the credit lab and on SearchQA", "", "what ran:"]
    out += [f"  {line}" for line in s.ran]
    out += ["", "what it found (95% CIs):"]
    if {"lab_twice_wrong_sign", "lab_crr_wrong_sign"} <= set(f):
        out.append(f"* Credit lab: Twice's one coupled twin gave credit of the wrong sign on "
                   f"{f['lab_twice_wrong_sign'].text()} % of decisions,")
        tail = ""
        if "lab_wrong_sign_times_less" in f:
            g = f["lab_wrong_sign_times_less"]
            tail = f": one twin per decision each, {g.text()} times less often ({g.verdict()})"
        out.append(f"  one independent counterfactual (CRR) on {f['lab_crr_wrong_sign'].text()} %{tail}.")
    if "lab_rho_bar" in f:
        worth = (f", so one coupled twin is worth\n  about {f['lab_coupling_worth'].text()} independent ones "
                 "(X = 1 / (1 - rho-bar))" if "lab_coupling_worth" in f else "")
        out += f"* Coupling there: rho-bar {f['lab_rho_bar'].text()}{worth}.".split("\n")
    learn = [(key, label) for key, label in (("learn_strong", "strongly"), ("learn_weak", "weakly")) if key in f]
    if learn:
        out.append("* Learning on ChoiceLab, each method at its own tuned lr (area under the exact V(s0) curve):")
    for key, label in learn:
        g = f[key]
        out.append(f"  {label} coupled twins (shuffle {st[key + '_shuffle']:g}; lr GRPO {st[key + '_lr_grpo']:g}, "
                   f"Twice {st[key + '_lr_twice']:g}): Twice - GRPO {g.text(signed=True)}, {g.verdict()}")
    if {"em_before", "em_grpo", "em_twice"} <= set(f):
        out.append(f"* SearchQA, tiny model, dev EM: {f['em_before'].text()} before; after GRPO "
                   f"{f['em_grpo'].text()};")
        out.append(f"  after Twice {f['em_twice'].text()}.")
        if "em_twice_minus_grpo" in f:
            g = f["em_twice_minus_grpo"]
            out.append(f"  Twice - GRPO {g.text(signed=True)} over {st['em_questions']} questions, paired: "
                       f"{g.verdict()} (both at one")
            out.append(f"  shared lr {st['llm_lr']:g}, not tuned, so it is no method's win).")
    out += [("* " if i == 0 else "  ") + n for i, n in enumerate(s.notes)]
    out += ["", "where the rest is:"]
    width = max((len(k) for k in s.files), default=0)
    out += [f"  {k:<{width}}  {v}" for k, v in s.files.items()]
    if len(out) > MAX_LINES:
        raise RuntimeError(f"the demo's summary has {len(out)} lines, more than {MAX_LINES}")
    return out
