"""A verl agent loop that plays any ``twice_envs`` id turn by turn, with keyed sampling.

One ``run`` is one factual episode of the task the dataset row names
(``extra_info.twice_task = {"seed": ..., "options": {...}}``, see :func:`task_extra_info`).
Every turn is one request to verl's LLM server carrying the turn's noise key in
``sampling_params["extra_args"]`` (the keyed vLLM processor reads it; load it with
``actor_rollout_ref.rollout.engine_kwargs.vllm.logits_processors``). The episode is
played by the project's own rollout code through :class:`ServerPolicy`, so the
prompt, the observation tokens, the noise keys and the env digests are exactly those
of a CPU rollout.

The loop runs no twins: a batch's twins are planned over the whole batch (one lambda,
the discordance predictor fitted on earlier batches' twins) by the ``twice_envs``
trainer (:mod:`.trainer`, :mod:`.twin_phase`) once every episode of the batch is in.
The loop returns, in ``extra_fields``, what that phase and the estimators need: the
episode's record (:data:`~.estimators.EPISODE`: token ids, the env trajectory to fork
from, the noise schedule), the sampling it used (:data:`~.estimators.SAMPLING`), its
noise seed, and the per-turn facts of :mod:`.estimators`.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import asdict
from typing import Any, Optional, Sequence
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopOutput,
    register,
)

from twice_envs.agents.credit.twice import TwiceConfig
from twice_envs.agents.rollout.episodes import Task, rollout
from twice_envs.agents.sampling.policy import Generation, SamplingConfig, cut_at_stop
from twice_envs.agents.sampling.vllm import keyed_extra_args
from twice_envs.agents.types import EpisodeRecord
from twice_envs.integrations.episodes import response_row
from twice_envs.integrations.verl import estimators as est
from twice_envs.keys import stable_json_seed

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
                                               token_counter=request.token_counter,
                                               # a resumed request (fully-async mode) re-sends prompt + output so
                                               # far with these same params: its keys continue the turn
                                               prompt_len=len(request.prompt_ids))}

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


def sampling_of(sampling_params: dict, max_new_tokens: int, key_mode: str) -> SamplingConfig:
    """The sampling of one run from verl's ``sampling_params`` (temperature 0, verl's greedy validation, is greedy)."""
    temperature = float(sampling_params.get("temperature", 1.0))
    greedy = temperature <= 0
    return SamplingConfig(temperature=1.0 if greedy else temperature, top_p=float(sampling_params.get("top_p", 1.0)),
                          max_new_tokens=int(max_new_tokens), greedy=greedy, key_mode=key_mode)


@register(AGENT_NAME)
class TwiceAgentLoop(AgentLoopBase):
    """Plays a ``twice_envs`` task and returns the factual episode with what its batch's twin phase needs.

    Settings (keys of the agent loop's YAML entry, beside ``name`` and ``_target_``):
    ``env_id``, ``env_kwargs``, ``max_turns``, ``max_new_tokens`` (per turn), ``seed``,
    ``method`` (a registered credit method verl can run; the loop plays the same factual
    episode for every method: ``algorithm.adv_estimator`` decides which auxiliary rollouts the
    trainer runs) and ``twice``, which may hold only ``key_mode`` (default:
    ``algorithm.twice.key_mode``, else ``line``). Branching and budget settings belong under
    ``algorithm.twice``, read by the trainer that plans the batch; giving them here is an error
    rather than being ignored.
    """

    def __init__(self, *args, env_id: str = "SearchQA-v0", env_kwargs: Optional[dict] = None, method: str = "twice",
                 max_turns: Optional[int] = 4, max_new_tokens: int = 500, twice: Optional[dict] = None,
                 seed: int = 0, **kwargs) -> None:
        kwargs.pop("tools", None)
        super().__init__(*args, **kwargs)
        if method not in est.estimators():
            raise ValueError(f"method must be a credit method verl can run ({', '.join(est.estimators())}), "
                             f"got {method!r}")
        planning = sorted(set(twice or {}) - {"key_mode"})
        if planning:
            raise ValueError(f"agent loop setting twice: {planning} are planning settings: set them under "
                             "algorithm.twice (the twice_envs trainer plans each batch's twins); the agent loop "
                             "takes only twice.key_mode")
        self.env_id, self.env_kwargs, self.method = env_id, dict(env_kwargs or {}), method
        self.max_turns, self.max_new_tokens, self.seed = max_turns, int(max_new_tokens), int(seed)
        default_mode = est.settings(TwiceConfig, self.config.get("algorithm", None), "twice").key_mode
        self.key_mode = str((twice or {}).get("key_mode", default_mode))
        self.response_length = int(self.rollout_config.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        task = _task_of(kwargs)
        # one noise seed per (prompt uid, session, step): the G sessions of a group get different luck
        noise_seed = stable_json_seed(self.seed, kwargs.get("uid", uuid4().hex), kwargs.get("session_id", 0),
                                      kwargs.get("global_steps", 0))
        sampling = sampling_of(sampling_params, self.max_new_tokens, self.key_mode)
        loop = asyncio.get_running_loop()
        policy = ServerPolicy(self.server_manager, self.tokenizer, loop)
        t0 = time.perf_counter()
        episode = await loop.run_in_executor(None, self.play, policy, task, sampling, noise_seed)
        return self.output(episode, sampling, noise_seed, time.perf_counter() - t0)

    def play(self, policy, task: Task, sampling: SamplingConfig, noise_seed: int) -> EpisodeRecord:
        """The factual episode of ``task`` (no twins: the trainer runs them over the whole batch)."""
        return rollout(policy, self.env_id, [task], group_size=1, sampling=sampling, env_kwargs=self.env_kwargs,
                       noise_seed=noise_seed, max_turns=self.max_turns)[0]

    def output(self, ep: EpisodeRecord, sampling: SamplingConfig, noise_seed: int, seconds: float) -> AgentLoopOutput:
        """The factual episode as verl's output (response cut at ``rollout.response_length``); the
        full record travels in ``extra_fields`` for the twin phase."""
        row = response_row(ep)
        n = self.response_length
        traj_obs = (ep.trajectory or {}).get("observations") or []
        anchors = [traj_obs[0] if traj_obs else ""] + [t.obs for t in ep.turns[:-1]]
        extra = {
            est.TURN_OF_TOKEN: row.turn_of_token[:n],
            est.TURN_REWARDS: [float(t.reward) for t in ep.turns],
            est.TURN_INVALID: [bool(t.invalid) for t in ep.turns],
            est.ANCHORS: [_anchor_digest(a) for a in anchors],
            est.ENV_ID: ep.env_id,
            est.EPISODE: ep.to_json(),
            est.SAMPLING: asdict(sampling),
            est.NOISE_SEED: str(noise_seed),
            "twice_noise_keys": [list(t.noise_key) for t in ep.turns],
            "twice_digests": [t.digest for t in ep.turns],
            "twice_utility": float(ep.utility),
        }
        return AgentLoopOutput(prompt_ids=row.prompt_ids, response_ids=row.response_ids[:n], response_mask=row.mask[:n],
                               response_logprobs=row.logprobs[:n], reward_score=float(ep.utility),
                               num_turns=1 + 2 * len(ep.turns), metrics={"generate_sequences": seconds},
                               extra_fields=extra)
