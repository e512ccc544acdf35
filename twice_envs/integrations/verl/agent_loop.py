"""A verl agent loop that plays any ``twice_envs`` id turn by turn, with keyed sampling and twins.

One ``run`` is one factual episode of the task the dataset row names
(``extra_info.twice_task = {"seed": ..., "options": {...}}``, see :func:`task_extra_info`).
Every turn is one request to verl's LLM server carrying the turn's noise key in
``sampling_params["extra_args"]`` (the keyed vLLM processor reads it; load it with
``actor_rollout_ref.rollout.engine_kwargs.vllm.logits_processors``). The episode is
played by the project's own rollout code through :class:`ServerPolicy`, so the
prompt, the observation tokens, the noise keys and the env digests are exactly those
of a CPU rollout. Then the budget rule picks decisions, their twins are run through
the same server (coupled for ``twice``, independent for ``crr``; none for ``gigpo``),
and the loop returns the factual episode with, in ``extra_fields``, its per-turn
twin credit ``A_hat_t`` and what :mod:`.estimators` need.

Choices verl leaves open: the budget rule is solved per episode (``beta`` times the
episode's own tokens), and the discordance predictor is not trained across verl's
workers: during ``warmup_updates`` steps every decision is branched with
``warmup_q``; after that the square-root rule uses the predictor's untrained prior.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import replace
from typing import Any, Optional, Sequence
from uuid import uuid4

import numpy as np
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopOutput,
    register,
)

from twice_envs.agents.credit import crr, predictor
from twice_envs.agents.credit.registry import get_method
from twice_envs.agents.credit import twice as twin_credit
from twice_envs.agents.rollout.episodes import Task, rollout
from twice_envs.agents.rollout.twins import run_twins
from twice_envs.agents.sampling.policy import Generation, SamplingConfig, cut_at_stop
from twice_envs.agents.sampling.vllm import keyed_extra_args
from twice_envs.agents.types import EpisodeRecord
from twice_envs.integrations.episodes import response_row
from twice_envs.integrations.verl import estimators as est
from twice_envs.keys import branch_plan_rng, stable_json_seed

#: the agent name dataset rows use (``agent_name``) to select this loop
AGENT_NAME = "twice_envs"


def task_extra_info(seed: int, options: Optional[dict] = None) -> dict:
    """The ``extra_info`` entry of a verl dataset row that names a task."""
    return {"twice_task": {"seed": int(seed), "options": dict(options or {})}}


def _task_of(kwargs: dict) -> Task:
    info = kwargs.get("extra_info") or {}
    spec = info.get("twice_task") if isinstance(info, dict) else None
    if spec is None:
        raise ValueError("a twice_envs dataset row needs extra_info.twice_task = {'seed': ..., 'options': {...}} "
                         "(see task_extra_info)")
    return Task(int(spec["seed"]), dict(spec.get("options") or {}))


class ServerPolicy:
    """A :class:`~twice_envs.agents.sampling.policy.Policy` over verl's LLM server (keyed ``extra_args`` per request).

    ``generate`` is synchronous: it is called from a worker thread and waits for
    coroutines it schedules on the agent loop's event loop. Log-probs are the server's
    (configure vLLM with raw log-probs); entropies are not reported (0).
    """

    model = None

    def __init__(self, server_manager, tokenizer, loop: asyncio.AbstractEventLoop) -> None:
        self.server_manager, self.tokenizer, self.loop = server_manager, tokenizer, loop
        self.eos_ids = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
        #: requests sent (for inspection)
        self.requests = 0

    def sampling_params(self, request, sampling: SamplingConfig) -> dict:
        """What one turn asks the server for: the keyed sampler does the sampling, vLLM's is neutral."""
        params = {"max_tokens": sampling.max_new_tokens, "logprobs": True, "top_p": 1.0,
                  "stop": list(request.stop) or None, "include_stop_str_in_output": True}
        if sampling.greedy:
            return {**params, "temperature": 0.0}
        return {**params, "temperature": 1.0,
                "extra_args": keyed_extra_args(request.noise_key, temperature=sampling.temperature,
                                               top_p=sampling.top_p, key_mode=sampling.key_mode,
                                               token_counter=request.token_counter)}

    async def _one(self, request, sampling: SamplingConfig) -> Generation:
        out = await self.server_manager.generate(request_id=uuid4().hex, prompt_ids=list(request.prompt_ids),
                                                 sampling_params=self.sampling_params(request, sampling))
        ids = [int(t) for t in out.token_ids]
        lps = [float(x) for x in (out.log_probs or [])][: len(ids)]
        lps += [0.0] * (len(ids) - len(lps))
        text = self.tokenizer.decode([t for t in ids if t not in self.eos_ids], skip_special_tokens=False)
        text, hit = cut_at_stop(text, request.stop)
        reason = "stop" if hit else ("eos" if ids and ids[-1] in self.eos_ids else "length")
        return Generation(text, ids, lps, 0.0, reason)

    def generate(self, requests: Sequence, sampling: SamplingConfig) -> list[Generation]:
        self.requests += len(requests)
        futures = [asyncio.run_coroutine_threadsafe(self._one(r, sampling), self.loop) for r in requests]
        return [f.result() for f in futures]


def _anchor_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@register(AGENT_NAME)
class TwiceAgentLoop(AgentLoopBase):
    """Plays a ``twice_envs`` task and returns the factual episode with per-turn twin credit.

    Settings (keys of the agent loop's YAML entry, beside ``name`` and ``_target_``):
    ``env_id``, ``env_kwargs``, ``method`` (a registered credit method verl can run), ``max_turns``,
    ``max_new_tokens`` (per turn), ``twice`` (:class:`TwiceConfig` fields) and ``seed``.
    """

    def __init__(self, *args, env_id: str = "SearchQA-v0", env_kwargs: Optional[dict] = None, method: str = "twice",
                 max_turns: Optional[int] = 4, max_new_tokens: int = 500, twice: Optional[dict] = None,
                 seed: int = 0, **kwargs) -> None:
        kwargs.pop("tools", None)
        super().__init__(*args, **kwargs)
        if method not in est.estimators():
            raise ValueError(f"method must be a credit method verl can run ({', '.join(est.estimators())}), "
                             f"got {method!r}")
        self.env_id, self.env_kwargs, self.method = env_id, dict(env_kwargs or {}), method
        self.max_turns, self.max_new_tokens, self.seed = max_turns, int(max_new_tokens), int(seed)
        self.twice_config = replace(twin_credit.TwiceConfig(), **dict(twice or {}))
        self.response_length = int(self.rollout_config.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        task = _task_of(kwargs)
        # one noise seed per (prompt uid, session, step): the G sessions of a group get different luck
        noise_seed = stable_json_seed(self.seed, kwargs.get("uid", uuid4().hex), kwargs.get("session_id", 0),
                                      kwargs.get("global_steps", 0))
        sampling = SamplingConfig(temperature=float(sampling_params.get("temperature", 1.0)),
                                  top_p=float(sampling_params.get("top_p", 1.0)), max_new_tokens=self.max_new_tokens,
                                  key_mode=self.twice_config.key_mode)
        loop = asyncio.get_running_loop()
        policy = ServerPolicy(self.server_manager, self.tokenizer, loop)
        t0 = time.perf_counter()
        episode, a_hat, info = await loop.run_in_executor(
            None, self.play, policy, task, sampling, noise_seed, int(kwargs.get("global_steps", 0)))
        info["noise_seed"] = noise_seed
        return self.output(episode, a_hat, info, time.perf_counter() - t0)

    def play(self, policy, task: Task, sampling: SamplingConfig, noise_seed: int,
             update: int) -> tuple[EpisodeRecord, np.ndarray, dict]:
        """The factual episode, the twin credit of each of its turns, and what the twins cost."""
        ep = rollout(policy, self.env_id, [task], group_size=1, sampling=sampling, env_kwargs=self.env_kwargs,
                     noise_seed=noise_seed, max_turns=self.max_turns)[0]
        a_hat = np.zeros(len(ep.turns))
        info = {"twins": 0, "aux_tokens": 0, "branched": []}
        needs = get_method(self.method).needs
        if not needs & {"twins", "counterfactuals"} or not ep.turns:
            return ep, a_hat, info
        rng = branch_plan_rng(noise_seed)
        if "twins" in needs:
            cfg = self.twice_config
            eta = predictor.predict(predictor.PredictorState(), predictor.decision_features([ep]))
            plan = twin_credit.plan_branches([ep], cfg, eta, rng, update=update)
        else:
            cfg = crr.crr_config(self.twice_config)
            plan = crr.plan_branches([ep], rng, self.twice_config)
        tw = run_twins(policy, [ep], plan.branched_decisions, cfg, sampling, rng, noise_seed=noise_seed)
        credit = twin_credit.twin_credit([ep], tw.records, plan, tw.kept, cfg)
        for (_, t), a in zip(plan.index, credit.a_hat):
            a_hat[t] = a
        info = {"twins": len(tw.records), "aux_tokens": int(tw.aux_tokens),
                "branched": [t for _, t in plan.branched_decisions], "q": [float(q) for q in plan.q],
                "twin_records": tw.records}
        return ep, a_hat, info

    def output(self, ep: EpisodeRecord, a_hat: np.ndarray, info: dict, seconds: float) -> AgentLoopOutput:
        """The factual episode as verl's output (response cut at ``rollout.response_length``)."""
        row = response_row(ep)
        n = self.response_length
        traj_obs = (ep.trajectory or {}).get("observations") or []
        anchors = [traj_obs[0] if traj_obs else ""] + [t.obs for t in ep.turns[:-1]]
        extra = {
            est.TURN_OF_TOKEN: row.turn_of_token[:n],
            est.TWIN_CREDIT: [float(a) for a in a_hat],
            est.TURN_REWARDS: [float(t.reward) for t in ep.turns],
            est.TURN_INVALID: [bool(t.invalid) for t in ep.turns],
            est.ANCHORS: [_anchor_digest(a) for a in anchors],
            "twice_noise_keys": [list(t.noise_key) for t in ep.turns],
            "twice_digests": [t.digest for t in ep.turns],
            "twice_utility": float(ep.utility),
            "twice_noise_seed": str(info.get("noise_seed", "")),
            "twice_twins": int(info["twins"]),
            "twice_aux_tokens": int(info["aux_tokens"]),
            "twice_branched": list(info["branched"]),
        }
        return AgentLoopOutput(prompt_ids=row.prompt_ids, response_ids=row.response_ids[:n], response_mask=row.mask[:n],
                               response_logprobs=row.logprobs[:n], reward_score=float(ep.utility),
                               num_turns=1 + 2 * len(ep.turns), metrics={"generate_sequences": seconds},
                               extra_fields=extra)

