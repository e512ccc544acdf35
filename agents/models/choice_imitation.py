"""Choice start models by imitation: a scripted teacher's decisions, taken among the env's listed actions.

The teacher (the env's scripted agent, :mod:`.transcripts`, at full skill) plays each task through the
very rollout a choosing policy runs (:class:`TeacherPolicy`), so its episodes hold the contexts, candidate
lists and token layout the model meets when it plays: where the env lists its actions, the teacher's action
is recorded as the choice of that candidate (a choice record whose ``index`` is the teacher's); elsewhere
(WebShop's search box) as a generated turn. The model then maximises the likelihood of the teacher's
decisions, in the units of the RL loss (:mod:`~twice_envs.agents.training.choice_loss`):

    loss = -(sum of log p(token) over the teacher's generated tokens
             + sum of log softmax(S)[teacher's index] over its chosen turns) / (tokens + chosen turns)

``S`` being the candidates' scores (``sum`` or ``mean`` of their token log-probs) at temperature 1.
:func:`imitate_choices` writes a model folder that plays like its start model (its ``twice_model.json``
is the start model's, with the imitation's settings added), to be used with ``--choose`` /
``--policy choice``.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional

import numpy as np
import torch

import twice_envs
from twice_envs.agents.models.load import load_policy, resolve_model_dir
from twice_envs.agents.models.recipes import _trained_config, play_settings, transcript_env_kwargs
from twice_envs.agents.models.transcripts import _admissible_agent, scripted_agent
from twice_envs.agents.rollout.episodes import Task, rollout
from twice_envs.agents.sampling.choice import DEFAULT_SCORE, SCORES, ChoicePolicy, choice_key
from twice_envs.agents.sampling.policy import Generation, SamplingConfig, torch_threads
from twice_envs.agents.training.choice_loss import choice_logprobs
from twice_envs.agents.training.loss import pack, token_logprobs
from twice_envs.keys import episode_noise_seed


class TeacherPolicy:
    """A policy whose every turn is the scripted teacher's (see the module docstring).

    Each episode of the rollout has a shadow env, made and reset as the rollout resets its own (the same
    task, seed and noise seed) and stepped with the same turns; the teacher reads the shadow. ``tasks`` and
    ``noise_seed`` must be those of the :func:`~twice_envs.agents.rollout.episodes.rollout` call
    (``group_size`` 1). ``unmatched`` counts listed turns whose teacher action was none of the candidates
    (played as generated text)."""

    chooses = True

    def __init__(self, policy, env_id: str, tasks: list[Task], *, noise_seed: int, agent: Callable,
                 agent_options: Optional[dict] = None, env_kwargs: Optional[dict] = None, score: str = DEFAULT_SCORE,
                 seed: int = 0) -> None:
        self.policy = policy
        self.writer = ChoicePolicy(policy, score=score)
        self.score = score
        self.agent, self.options = agent, dict(agent_options or {})
        self.unmatched = 0
        self.shadow: dict[int, tuple] = {}
        for g, task in enumerate(tasks):
            env = twice_envs.make(env_id, **(env_kwargs or {}))
            ep_seed = episode_noise_seed(noise_seed, g, 0)
            env.reset(seed=int(task.seed), options={**task.options, "noise_seed": ep_seed})
            self.shadow[ep_seed] = (env, np.random.default_rng([seed, g, 0x7EAC]))

    def __getattr__(self, name: str):
        if name == "policy":
            raise AttributeError(name)
        return getattr(self.policy, name)

    def generate(self, requests, sampling: SamplingConfig, **_kw) -> list[Generation]:
        out = []
        for r in requests:
            env, rng = self.shadow[int(r.noise_key.episode_seed)]
            action = str(self.agent(env, rng, 1.0, **self.options))
            cands = list(r.candidates) if r.candidates is not None else None
            index = next((j for j, c in enumerate(cands) if c == action), None) if cands else None
            if index is None and cands:
                index = next((j for j, c in enumerate(cands) if c.lower() == action.lower()), None)
            if cands is not None and index is None:
                self.unmatched += 1
            if index is None:
                ids = self.writer.candidate_tokens(action, r.stop)
                gen = Generation(action, ids, [0.0] * len(ids), 0.0, "stop")
            else:
                toks = [self.writer.candidate_tokens(c, r.stop) for c in cands]
                n = len(cands)
                choice = {"candidates": cands, "scores": [0.0] * n, "score": self.score,
                          "token_counts": [len(t) for t in toks], "index": index,
                          "key": [int(v) for v in choice_key(r.noise_key)], "temperature": 1.0, "greedy": False,
                          "logprob": -math.log(n), "entropy": math.log(n)}
                gen = Generation(cands[index], toks[index], [0.0] * len(toks[index]), 0.0, "choice", choice=choice)
            env.step(gen.text)
            out.append(gen)
        return out


@dataclass
class ImitationConfig:
    """Sizes of :func:`imitate_choices`."""

    env: str = "ALFWorld-v0"
    """Env whose scripted teacher is imitated."""
    episodes: int = 200
    """Teacher episodes (training tasks: reset seeds ``seed * 100_003 + i``)."""
    steps: int = 300
    """Optimiser steps."""
    batch_size: int = 4
    """Episodes per step."""
    lr: float = 1e-3
    """AdamW learning rate (constant)."""
    score: str = DEFAULT_SCORE
    """Candidate score the model is trained and played with."""
    seed: int = 0
    """Seed of the tasks, the teacher and the batch order."""
    threads: int = 1
    """torch CPU threads."""

    def __post_init__(self) -> None:
        if self.score not in SCORES:
            raise ValueError(f"score must be one of {sorted(SCORES)}, got {self.score!r}")
        for name in ("episodes", "steps", "batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive number, got {self.lr!r}")


def teacher_episodes(policy, config: ImitationConfig, *, env_kwargs: dict, max_turns: Optional[int],
                     window: Optional[int], agent_options: Optional[dict] = None) -> tuple[list, int]:
    """The teacher's episodes on ``config.episodes`` training tasks, and its unmatched listed turns."""
    tasks = [Task(config.seed * 100_003 + i) for i in range(config.episodes)]
    agent = scripted_agent(config.env) or _admissible_agent
    teacher = TeacherPolicy(policy, config.env, tasks, noise_seed=config.seed, agent=agent,
                            agent_options=agent_options, env_kwargs=env_kwargs, score=config.score, seed=config.seed)
    eps = rollout(teacher, config.env, tasks, group_size=1, sampling=SamplingConfig(max_new_tokens=1),
                  env_kwargs=env_kwargs, noise_seed=config.seed, max_turns=max_turns, window=window)
    return eps, teacher.unmatched


def choice_nll(model, batch, encode, eos) -> float:
    """Mean ``-log softmax(S)[teacher]`` over the chosen turns of a packed batch (nan without any)."""
    if not batch.choices:
        return float("nan")
    with torch.no_grad():
        return float(-choice_logprobs(model, batch.input_ids, batch.choices, encode, eos).mean())


def imitation_loss(model, batch, encode, eos) -> torch.Tensor:
    """``-(token log-likelihood + choice log-likelihood) / units`` of a packed batch."""
    total = (token_logprobs(model, batch) * batch.loss_mask).sum()
    if batch.choices:
        total = total + choice_logprobs(model, batch.input_ids, batch.choices, encode, eos).sum()
    return -total / max(batch.num_units, 1)


def imitate_choices(start: str, out: str, config: ImitationConfig, *, log=print) -> dict:
    """Train ``start`` (a model name or folder) on its env's teacher (module docstring); writes the model to
    ``out`` and returns the figures (teacher episodes, success, unmatched turns, loss before and after)."""
    src = resolve_model_dir(start)
    settings = play_settings(start, src, config.env, None)
    policy = load_policy(start)
    t0 = time.perf_counter()
    with torch_threads(config.threads):
        env_kwargs, agent_options = _teacher_settings(src, config.env, settings["env_kwargs"])
        eps, unmatched = teacher_episodes(policy, config, env_kwargs=env_kwargs, max_turns=settings.get("max_turns"),
                                          window=settings.get("window"), agent_options=agent_options)
        chosen = sum(t.choice is not None for e in eps for t in e.turns)
        success = float(np.mean([e.utility > 0 for e in eps]))
        log(f"teacher: {len(eps)} episodes, success {success:.3f}, {chosen} chosen turns, "
            f"{sum(len(e.turns) for e in eps) - chosen} written, {unmatched} listed turns off the list "
            f"({time.perf_counter() - t0:.0f} s)")
        tok = policy.tokenizer
        encode = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
        model = policy.model
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=config.lr)
        rng = np.random.default_rng([config.seed, 0x1417])
        ones = [np.ones(len(e.turns)) for e in eps]
        held = list(range(min(16, len(eps))))
        probe = pack([eps[i] for i in held], [ones[i] for i in held])
        with torch.no_grad():
            before = float(imitation_loss(model, probe, encode, tok.eos_token_id))
        choice_before = choice_nll(model, probe, encode, tok.eos_token_id)
        order: list[int] = []
        for step in range(config.steps):
            if len(order) < config.batch_size:
                order += list(rng.permutation(len(eps)))
            idx, order = order[:config.batch_size], order[config.batch_size:]
            loss = imitation_loss(model, pack([eps[i] for i in idx], [ones[i] for i in idx]), encode,
                                     tok.eos_token_id)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if (step + 1) % max(1, config.steps // 10) == 0:
                log(f"step {step + 1}/{config.steps}: loss {float(loss.detach()):.4f} ({time.perf_counter() - t0:.0f} s)")
        model.eval()
        with torch.no_grad():
            after = float(imitation_loss(model, probe, encode, tok.eos_token_id))
        choice_after = choice_nll(model, probe, encode, tok.eos_token_id)
    figures = {"start": str(start), "config": asdict(config), "teacher_episodes": len(eps),
               "teacher_success": success, "chosen_turns": chosen, "unmatched": unmatched,
               "loss_before": before, "loss_after": after, "choice_nll_before": choice_before,
               "choice_nll_after": choice_after, "seconds": round(time.perf_counter() - t0, 1)}
    _save(src, model, tok, Path(out), figures)
    log(f"on the first {len(held)} teacher episodes: loss {before:.4f} -> {after:.4f}, -log pi(teacher's choice) "
        f"{choice_before:.4f} -> {choice_after:.4f}; model: {out}")
    return figures


def _teacher_settings(src: Path, env_id: str, played: dict) -> tuple[dict, dict]:
    """``(env kwargs, agent options)`` of the start model's transcripts, from its build's config: the env they
    were played on (its recipe's training games, for ALFWorld the generated training collection) with the
    kwargs it plays with, and the teacher's options (``tagged`` turns)."""
    cfg = _trained_config(src)
    recipe = SimpleNamespace(env_kwargs=cfg.get("env_kwargs") or {}, alfworld_games=int(cfg.get("alfworld_games") or 0),
                             alfworld_rooms=int(cfg.get("alfworld_rooms") or 0))
    return ({**transcript_env_kwargs(recipe, env_id), **played},
            dict((cfg.get("agent_options") or {}).get(env_id) or {}))


def _save(src: Path, model, tokenizer, out: Path, figures: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy2(f, out / f.name)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    meta_file = out / "twice_model.json"
    meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
    meta["choice_imitation"] = figures
    meta_file.write_text(json.dumps(meta, indent=1))
