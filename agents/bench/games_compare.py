"""Paired comparisons of ``twice bench games``: held-out success between every two methods, training
measures on the updates two runs sampled alike, and several runs' results merged into one comparison."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from twice_envs.agents.stats import paired_change, paired_mean


def method_pairs(methods: dict) -> dict:
    """Paired success differences between every two methods, ``{"twice - grpo": paired_change(...)}`` (the
    spaces keep the two names apart: method names such as ``grpo-2x`` hold hyphens).

    Every method is evaluated on the same held-out tasks with the same sampling noise per seed, so
    their episodes pair up one to one (same task, same luck) and the difference's interval is that of
    the per-episode differences, narrower than that of two independent rates when outcomes agree."""
    names = [m for m, x in methods.items() if x.get("outcomes")]
    return {f"{a} - {b}": paired_change(methods[a]["outcomes"], methods[b]["outcomes"])
            for i, a in enumerate(names) for b in names[i + 1:]}


def training_pairs(methods: dict) -> dict:
    """Paired differences of the training measure between every two methods, ``{"twice - grpo": ...}``:
    the mean over the updates (of every seed) on which the two runs sampled the same tasks with the
    same luck (the same ``batch`` digest in their metrics), with a Student t interval over those
    updates (:func:`~twice_envs.agents.stats.paired_mean`).

    The first update is left out: both runs play it with the start model, so it differs by nothing.
    A method that samples more episodes per task (GRPO (2x)) shares no batch with the others, nor do
    two runs on an update where their dynamic sampling drew different batches; a pair with fewer than
    two shared updates is absent."""
    names = [m for m, x in methods.items() if x.get("train_curves")]
    out = {}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            diffs, updates = [], []
            for ca, cb in zip(methods[a]["train_curves"], methods[b]["train_curves"]):
                by_update = {u: (v, batch) for u, v, batch in cb}
                for u, v, batch in ca:
                    w, other = by_update.get(u, (None, None))
                    if u > 1 and batch is not None and batch == other and v is not None and w is not None:
                        diffs.append(v - w)
                        updates.append(u)
            if len(diffs) >= 2:
                out[f"{a} - {b}"] = {**paired_mean(diffs), "updates": [min(updates), max(updates)],
                                     "measure": methods[a].get("train_measure")}
    return out


#: Settings that may differ between runs joined by :func:`merge_results`: they do not change what a
#: method is trained on or how its final evaluation is drawn.
MERGE_FREE = ("methods", "out", "eval_every", "resume", "jobs")


def _compared_settings(results: dict) -> dict:
    return {k: v for k, v in results["config"].items() if k not in MERGE_FREE}


def merge_results(paths: Sequence[str | Path]) -> dict:
    """One comparison from several runs of ``twice bench games``, each with methods of its own (one
    process per core): their methods side by side and the paired differences between every two.

    Pairing needs the same held-out episodes and noise: the runs must agree on every setting but
    :data:`MERGE_FREE` and on the start model's held-out outcomes, episode by episode; a run that
    differs, or a method found in two runs, raises :class:`ValueError` naming the files and what
    differs. A path is a run's output folder or its ``results.json``."""
    files = [Path(p) / "results.json" if Path(p).is_dir() else Path(p) for p in paths]
    if len(files) < 2:
        raise ValueError("merging needs the results of two runs or more")
    runs = []
    for f in files:
        try:
            runs.append(json.loads(f.read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{f}: not a readable results.json of twice bench games ({exc})") from None
        if not isinstance(runs[-1].get("config"), dict) or not isinstance(runs[-1].get("envs"), dict):
            raise ValueError(f"{f}: not a results.json of twice bench games (no 'config' and 'envs')")
    first, base = files[0], _compared_settings(runs[0])
    merged: dict = {"config": dict(runs[0]["config"], methods=[], out=None), "merged_from": [str(f) for f in files],
                    "envs": {}}
    owner: dict = {}
    for f, r in zip(files, runs):
        mine = _compared_settings(r)
        differ = sorted(k for k in set(base) | set(mine) if base.get(k) != mine.get(k))
        if differ:
            raise ValueError(f"{f} and {first} were run with different settings ({', '.join(differ)}): their "
                             "methods were not trained or evaluated alike")
        for env_id, e in r["envs"].items():
            try:
                model, outcomes, methods = e["model"], e["before"]["all"]["outcomes"], e["methods"]
            except (KeyError, TypeError):
                raise ValueError(f"{f}: {env_id} lacks the start model's held-out outcomes or the methods "
                                 "(not a results.json of twice bench games?)") from None
            into = merged["envs"].setdefault(env_id, {"model": model, "before": e["before"], "methods": {}})
            if model != into["model"]:
                raise ValueError(f"{f} and {first} start {env_id} from different models ({model} and "
                                 f"{into['model']})")
            if outcomes != into["before"]["all"]["outcomes"]:
                raise ValueError(f"{f} and {first}: the start model's held-out episodes of {env_id} differ "
                                 "(other held-out noise, tasks or env data), so the methods' episodes do not pair up")
            for method, x in methods.items():
                if (env_id, method) in owner:
                    raise ValueError(f"{method} on {env_id} is in both {owner[env_id, method]} and {f}: merge "
                                     "runs of different methods")
                owner[env_id, method] = f
                into["methods"][method] = x
                if method not in merged["config"]["methods"]:
                    merged["config"]["methods"].append(method)
    for e in merged["envs"].values():
        e["pairs"] = method_pairs(e["methods"])
        e["train_pairs"] = training_pairs(e["methods"])
    return merged
