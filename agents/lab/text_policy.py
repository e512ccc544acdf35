"""TextLab's policy: a lab policy that writes multi-line turns and remembers its own text.

Contract. :func:`text_lab_policy` gives a lab policy (:mod:`twice_envs.agents.lab.toy`)
for ``TextLab-v0`` (:mod:`twice_envs.envs.textlab.env`) whose values are exact, yet whose
twins behave like an LLM's: a turn is several tokens on several lines, its length is
random, and what the policy writes next depends on what it wrote before, so an
alternative turn changes everything after it. It samples through the project's one
sampler core (keyed Gumbel argmax, one :class:`~twice_envs.noise.KeyState` per row in
the policy's key mode), forks and twins like every lab policy, and its exact
``V(s_t)`` and ``A(s_t, y_t)`` come from dynamic programming.

The policy (vocabulary ``W`` thought words, ``"\\n"``, ``search``, ``answer``, ``q0 ..``):

* a turn is ``0 .. max_lines`` thought lines, then one action line ``search qJ`` or
  ``answer``. At the start of line ``l`` the policy acts with probability
  ``sigmoid(act_bias + act_slope l + memory z_act[m])`` (always at ``l = max_lines``),
  else writes a thought line: words, each followed by the end of the line with
  probability ``sigmoid(stop_bias + stop_slope (k - 1) + memory z_stop[m])`` after its
  ``k``-th word (always after ``max_words``); thought words are drawn from
  ``softmax(memory z_word[m])``;
* its **memory** ``m`` is a deterministic function of its own earlier text: the sum of
  ``(word id + 1)`` over every thought word written in the episode, modulo
  ``memory_size``. It carries across turns;
* the action is drawn from ``softmax((logits[found, prev] + memory z_action[m]) /
  temperature)`` (``m``: the memory when the action line starts), written as the tokens
  ``answer`` or ``search qJ``. ``logits`` is the trainable part (SearchToy's tabular
  logits, :func:`~twice_envs.agents.lab.search_toy.initial_logits`); the ``z`` tables are
  seeded standard normals. With ``memory = 0`` nothing depends on the memory, the
  thoughts are irrelevant, and the policy is SearchToy's Markov-in-(found, previous
  action) policy with the same value.

Its "actions" in the lab-policy interface are the turn texts (``action_of(text)`` is the
text): the exact oracle needs the memory, which only the text carries.

Exact oracle. The state the policy depends on at a turn start is ``(turn, found, m,
prev)``. A dynamic programme over the within-turn token chain ``(line, position, m)``
gives the thought kernel ``K[m, n]`` = P(the action line starts with memory ``n`` | the
turn starts with ``m``) (the thoughts depend on the memory only); with the action table
it gives each turn's exact law of ``(action, new memory)``, and backward induction over
the horizon gives ``V[t, found, m, prev]`` and ``Q[t, found, n, a]``. A setting whose
tables would exceed ``max_oracle`` entries is refused (``ValueError`` naming the size and
the cap) when it is made, before anything is sampled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import NamedTuple

import numpy as np

from twice_envs.agents.lab import toy
from twice_envs.agents.lab.search_toy import initial_logits
from twice_envs.agents.lab.text_setting import WORDS, TextLabSetting
from twice_envs.envs.searchtoy.env import INVALID, SearchToyConfig, outcome, transition
from twice_envs.noise import NGRAM, KeyState, keyed_choice, state_rows

ENV_ID = "TextLab-v0"
_THINK, _QUERY, _DONE = 0, 1, 2


class TextLabState(NamedTuple):
    """What the policy conditions on at a turn start, read from a live env."""

    turn: int
    """Turns taken."""
    found: int
    """Facts found (bitmask)."""
    memory: int
    """The memory of the policy's earlier text."""
    prev: int
    """Previous action (``queries + 1``: none, or invalid)."""
    tokens_before: int
    """Tokens the policy generated earlier in the episode (``counter`` keys)."""
    context: tuple
    """The last :data:`~twice_envs.noise.NGRAM` of those tokens (``ngram`` keys)."""


def _log_sigmoid(x: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -x)


def _logsumexp(x: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return np.squeeze(m, axis) + np.log(np.sum(np.exp(x - m), axis=axis))


@dataclass(frozen=True)
class TextLabPolicy:
    """The TextLab policy (see the module); ``logits`` ``(2**hops, queries + 2, queries + 1)`` is the
    trainable action table (``prev = queries + 1``: no previous action)."""

    setting: TextLabSetting
    logits: np.ndarray = field(hash=False, compare=False)
    env_id = ENV_ID

    # ------------------------------------------------------------- vocabulary
    @property
    def config(self) -> SearchToyConfig:
        return self.setting.world

    @property
    def env_kwargs(self) -> dict:
        return asdict(self.setting.world)

    @property
    def key_mode(self) -> str:
        return self.setting.key_mode

    @property
    def num_actions(self) -> int:
        return self.config.num_actions

    @property
    def newline(self) -> int:
        """Token id of ``"\\n"`` (words are ``0 .. words - 1``)."""
        return self.setting.words

    @property
    def vocab(self) -> tuple[str, ...]:
        """Text of every token id."""
        s = self.setting
        return WORDS[: s.words] + ("\n", "search", "answer") + tuple(f"q{j}" for j in range(self.config.queries))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of a turn's tokens: words joined by spaces, lines by ``"\\n"``."""
        lines, cur, voc = [], [], self.vocab
        for t in ids:
            if t == self.newline:
                lines.append(" ".join(cur))
                cur = []
            else:
                cur.append(voc[t])
        return "\n".join(lines + [" ".join(cur)])

    def encode(self, text: str) -> list[int]:
        """The token ids of a turn this policy wrote (the inverse of :meth:`decode`)."""
        W, lines = self.setting.words, text.split("\n")
        ids: list[int] = []
        for line in lines[:-1]:
            for w in line.split(" "):
                if w not in WORDS[:W]:
                    raise ValueError(f"not a TextLab thought line: {line!r}")
                ids.append(WORDS.index(w))
            ids.append(W)
        a = self.config.action_text
        last = lines[-1]
        if last == "answer":
            return ids + [W + 2]
        j = last[len("search q"):]
        if last.startswith("search q") and j.isdigit() and int(j) < self.config.queries and a(int(j)) == last:
            return ids + [W + 1, W + 3 + int(j)]
        raise ValueError(f"not a TextLab action line: {last!r}")

    def action_of_ids(self, ids: Sequence[int]) -> int:
        """The action index of a turn's tokens."""
        W = self.setting.words
        return self.config.queries if ids[-1] == W + 2 else int(ids[-1]) - W - 3

    def memory_after(self, memory: int, ids: Sequence[int]) -> int:
        """The memory after writing ``ids``."""
        W, M = self.setting.words, self.setting.memory_size
        for t in ids:
            if t < W:
                memory = (memory + int(t) + 1) % M
        return memory

    # ------------------------------------------------------------- the policy's tables
    @cached_property
    def _z(self) -> dict:
        s = self.setting
        rng = np.random.default_rng([s.search.seed, 0x7E47])
        M, W, A = s.memory_size, s.words, self.num_actions
        return {"word": rng.standard_normal((M, W)), "act": rng.standard_normal(M), "stop": rng.standard_normal(M),
                "action": rng.standard_normal((M, A))}

    @cached_property
    def word_logp(self) -> np.ndarray:
        """``log p(word | memory)`` ``(M, W)``."""
        z = self.setting.memory * self._z["word"]
        return z - _logsumexp(z)[:, None]

    @cached_property
    def action_logp(self) -> np.ndarray:
        """``log pi(a | found, prev, memory)`` ``(F, A + 1, M, A)``."""
        s = self.setting
        z = (self.logits[:, :, None, :] + s.memory * self._z["action"][None, None]) / s.search.temperature
        return z - _logsumexp(z)[..., None]

    def next_logprobs(self, found, prev, memory, line, pos, stage) -> np.ndarray:
        """Log-probs ``(B, V)`` of the next token of rows in the given chain states (arrays)."""
        s = self.setting
        W, Q = s.words, self.config.queries
        found, prev, memory, line, pos, stage = (np.asarray(x, dtype=np.int64)
                                                 for x in (found, prev, memory, line, pos, stage))
        B = len(found)
        out = np.full((B, len(self.vocab)), -np.inf)
        la = self.action_logp[found, prev, memory]
        log_search = _logsumexp(la[:, :Q])
        start = (stage == _THINK) & (pos == 0)
        inline = (stage == _THINK) & (pos > 0)
        query = stage == _QUERY
        lw = self.word_logp[memory]
        act = s.act_bias + s.act_slope * line + s.memory * self._z["act"][memory]
        forced = line >= s.max_lines
        log_act = np.where(forced, 0.0, _log_sigmoid(act))
        log_think = np.where(forced, -np.inf, _log_sigmoid(-act))
        stop = s.stop_bias + s.stop_slope * (pos - 1) + s.memory * self._z["stop"][memory]
        full = pos >= s.max_words
        log_stop = np.where(full, 0.0, _log_sigmoid(stop))
        log_go = np.where(full, -np.inf, _log_sigmoid(-stop))
        out[start, :W] = log_think[start, None] + lw[start]
        out[start, W + 1] = log_act[start] + log_search[start]
        out[start, W + 2] = log_act[start] + la[start, Q]
        out[inline, :W] = log_go[inline, None] + lw[inline]
        out[inline, W] = log_stop[inline]
        out[query, W + 3:] = la[query, :Q] - log_search[query, None]
        return out

    def _advance(self, memory, line, pos, stage, tokens):
        """The chain states after emitting ``tokens`` (arrays; returns new arrays)."""
        W, M = self.setting.words, self.setting.memory_size
        word = tokens < W
        nl = tokens == W
        memory = np.where(word, (memory + tokens + 1) % M, memory)
        pos = np.where(word, pos + 1, np.where(nl, 0, pos))
        line = np.where(nl, line + 1, line)
        stage = np.where(tokens == W + 1, _QUERY, np.where((tokens == W + 2) | (tokens >= W + 3), _DONE, stage))
        return memory, line, pos, stage

    def turn_logprobs(self, found: int, prev: int, memory: int, ids: Sequence[int]) -> np.ndarray:
        """Per-token log-probs of the turn ``ids`` written from ``(found, prev, memory)``."""
        m, line, pos, stage = (np.zeros(1, dtype=np.int64) + v for v in (memory, 0, 0, _THINK))
        out = []
        for t in ids:
            lp = self.next_logprobs([found], [prev], m, line, pos, stage)[0]
            out.append(lp[t])
            m, line, pos, stage = self._advance(m, line, pos, stage, np.array([t]))
        return np.array(out)

    def with_logits(self, logits: np.ndarray) -> TextLabPolicy:
        return replace(self, logits=np.asarray(logits, dtype=np.float64))

    def with_key_mode(self, key_mode: str) -> TextLabPolicy:
        return replace(self, setting=replace(self.setting, key_mode=key_mode))

    # ------------------------------------------------------------- the lab-policy interface
    def state(self, env) -> TextLabState:
        """The policy's state at a live TextLab env's next turn (from the env's turn texts)."""
        u = env.unwrapped
        ids = [t for text in u.texts for t in self.encode(text)]
        prev = u.history[-1] if u.history and u.history[-1] != INVALID else self.num_actions
        return TextLabState(env.turn, u.found, self.memory_after(0, ids), prev, len(ids), tuple(ids[-NGRAM:]))

    def action_probs(self, state) -> np.ndarray:
        """The law of the turn's action (the thoughts summed out)."""
        return self.kernel[state.memory] @ np.exp(self.action_logp[state.found, state.prev])

    def action_text(self, text: str) -> str:
        return text

    def action_of(self, text: str) -> str:
        return text

    def sample_turns(self, states: Sequence[TextLabState], keys) -> list[toy.LabTurn]:
        """One turn per row, token by token, each token read at its :class:`KeyState` key (batched).

        Runs torch on one thread (as the sampler does for small models): the tensors are
        tiny, and more threads only add synchronisation."""
        import torch

        old = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._sample_turns(states, keys)
        finally:
            torch.set_num_threads(old)

    def _sample_turns(self, states: Sequence[TextLabState], keys) -> list[toy.LabTurn]:
        import torch

        n = len(states)
        ks = [KeyState(k, mode=self.key_mode, token_counter=s.tokens_before, context=s.context)
              for s, k in zip(states, keys)]
        found = np.array([s.found for s in states], dtype=np.int64)
        prev = np.array([s.prev for s in states], dtype=np.int64)
        mem = np.array([s.memory for s in states], dtype=np.int64)
        line, pos, stage = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        toks: list[list[int]] = [[] for _ in range(n)]
        lps: list[list[float]] = [[] for _ in range(n)]
        ents: list[list[float]] = [[] for _ in range(n)]
        live = np.arange(n)
        while live.size:
            logp = self.next_logprobs(found[live], prev[live], mem[live], line[live], pos[live], stage[live])
            rows = state_rows([ks[i] for i in live])
            ch = keyed_choice(torch.from_numpy(logp), torch.from_numpy(rows))
            tok = ch.tokens.numpy()
            for i, t, lp, e in zip(live.tolist(), tok.tolist(), ch.logprobs.tolist(), ch.entropy.tolist()):
                toks[i].append(t)
                lps[i].append(lp)
                ents[i].append(e)
                ks[i].advance(t, t == self.newline)
            mem[live], line[live], pos[live], stage[live] = self._advance(mem[live], line[live], pos[live],
                                                                          stage[live], tok)
            live = live[stage[live] != _DONE]
        return [toy.LabTurn(self.decode(t), t, lp, float(np.mean(e))) for t, lp, e in zip(toks, lps, ents)]

    # ------------------------------------------------------------- exact oracle
    @cached_property
    def kernel(self) -> np.ndarray:
        """``K[m, n]``: P(the action line starts with memory ``n`` | the turn starts with memory ``m``)."""
        s = self.setting
        M, W = s.memory_size, s.words
        ms = np.arange(M)
        K = np.zeros((M, M))
        nxt = {(0, 0): np.eye(M)}
        for line in range(s.max_lines + 1):
            for pos in range(s.max_words + 1):
                cur = nxt.pop((line, pos), None)
                if cur is None:
                    continue
                z = np.zeros(M, dtype=np.int64)
                p = np.exp(self.next_logprobs(z, z + self.num_actions, ms, z + line, z + pos, z + _THINK))
                if pos == 0:
                    K += cur * (p[:, W + 1] + p[:, W + 2])[None, :]
                else:
                    nxt[(line + 1, 0)] = nxt.get((line + 1, 0), 0.0) + cur * p[:, W][None, :]
                step = np.zeros((M, M))
                for w in range(W):
                    step[ms, (ms + w + 1) % M] += p[:, w]
                nxt[(line, pos + 1)] = nxt.get((line, pos + 1), 0.0) + cur @ step
        return K

    @cached_property
    def values(self) -> tuple[np.ndarray, np.ndarray]:
        """``(V[t, found, m, prev], Q[t, found, n, a])`` by backward induction over the horizon
        (``n``: the memory when the action line starts)."""
        c, A, M = self.config, self.num_actions, self.setting.memory_size
        F = 1 << c.hops
        nxt = np.array([[transition(c, f, a) for a in range(A)] for f in range(F)])
        final = np.array([outcome(c, f) for f in range(F)])
        pi = np.exp(self.action_logp)
        V = np.zeros((c.horizon + 1, F, M, A + 1))
        Q = np.zeros((c.horizon, F, M, A))
        for t in range(c.horizon - 1, -1, -1):
            last = t + 1 >= c.horizon
            for a in range(A):
                f2 = nxt[:, a]
                Q[t, :, :, a] = final[f2][:, None] if (last or a == c.queries) else V[t + 1, f2, :, a]
            V[t] = np.einsum("mn,fpn->fmp", self.kernel, np.einsum("fpna,fna->fpn", pi, Q[t]))
        return V, Q

    @property
    def value(self) -> float:
        """``V(s_0)``: the policy's exact expected utility."""
        return float(self.values[0][0, 0, 0, self.num_actions])

    def _walk(self, texts: Sequence[str]):
        """``(t, found, memory, prev, memory at the action, action)`` of every turn of an episode."""
        f, m, p = 0, 0, self.num_actions
        for t, text in enumerate(texts):
            ids = self.encode(text)
            n, a = self.memory_after(m, ids), self.action_of_ids(ids)
            yield t, f, m, p, n, a
            f, m, p = transition(self.config, f, a), n, a

    def episode_states(self, texts: Sequence[str]) -> list[tuple[int, int, int, int]]:
        """The policy's state ``(turn, found, memory, prev)`` before each turn of an episode (given by its
        turn texts)."""
        return [(t, f, m, p) for t, f, m, p, _, _ in self._walk(texts)]

    @property
    def answer_action(self) -> int:
        """The action index of ``answer`` (the env's gold answer) in :meth:`action_probs`."""
        return self.config.queries

    def boundary_states(self, texts: Sequence[str]) -> list[TextLabState]:
        """The policy's states before the first turn and after each turn (``len(texts) + 1`` of them),
        as :meth:`state` reads them from a live env."""
        f, m, p, ids = 0, 0, self.num_actions, []
        out = [TextLabState(0, f, m, p, 0, ())]
        for t, text in enumerate(texts):
            turn = self.encode(text)
            ids += turn
            a = self.action_of_ids(turn)
            f, m, p = transition(self.config, f, a), self.memory_after(m, turn), a
            out.append(TextLabState(t + 1, f, m, p, len(ids), tuple(ids[-NGRAM:])))
        return out

    def episode_values(self, texts: Sequence[str]) -> np.ndarray:
        """Exact ``V(s_t)`` along an episode (given by its turn texts)."""
        V, _ = self.values
        return np.array([V[t, f, m, p] for t, f, m, p, _, _ in self._walk(texts)])

    def episode_advantages(self, texts: Sequence[str]) -> np.ndarray:
        """Exact ``A(s_t, y_t) = V(s_{t+1}) - V(s_t)`` along an episode (the last turn's
        ``V(s_{t+1})`` is its outcome)."""
        V, Q = self.values
        return np.array([Q[t, f, n, a] - V[t, f, m, p] for t, f, m, p, n, a in self._walk(texts)])

    def policy_gradient(self, episodes, advantages) -> np.ndarray:
        """Mean over episodes of ``sum_t A_t grad_logits log pi(y_t | s_t)``: only the action
        token(s) depend on ``logits``, through ``pi(a | found, prev, n)``."""
        grad = np.zeros_like(self.logits)
        pi = np.exp(self.action_logp)
        for ep, adv in zip(episodes, advantages):
            f, m, p = 0, 0, self.num_actions
            for turn, a_t in zip(ep.turns, adv):
                ids = list(turn.token_ids)
                n, a = self.memory_after(m, ids), self.action_of_ids(ids)
                g = -pi[f, p, n].copy()
                g[a] += 1.0
                grad[f, p] += a_t * g / self.setting.search.temperature
                f, m, p = transition(self.config, f, a), n, a
        return grad / max(1, len(episodes))

    # ------------------------------------------------------------- exact trajectory laws
    def action_sequence_prob(self, actions: Sequence[int]) -> float:
        """Exact probability that an episode's actions are ``actions`` (the memory summed out)."""
        alpha = np.zeros(self.setting.memory_size)
        alpha[0] = 1.0
        f, p = 0, self.num_actions
        pi = np.exp(self.action_logp)
        for a in actions:
            alpha = (alpha @ self.kernel) * pi[f, p, :, a]
            f, p = transition(self.config, f, a), a
        return float(alpha.sum())

    def outcome_law(self) -> dict[tuple[int, int], float]:
        """Exact law of ``(turns taken, facts found at the end)`` over episodes."""
        c, A, M = self.config, self.num_actions, self.setting.memory_size
        F = 1 << c.hops
        pi = np.exp(self.action_logp)
        occ = np.zeros((F, M, A + 1))
        occ[0, 0, A] = 1.0
        law: dict[tuple[int, int], float] = {}
        for t in range(c.horizon):
            flow = np.einsum("fmp,mn,fpna->fna", occ, self.kernel, pi)
            new = np.zeros_like(occ)
            for a in range(A):
                for f in range(F):
                    f2 = transition(c, f, a)
                    mass = flow[f, :, a]
                    if a == c.queries or t + 1 == c.horizon:
                        key = (t + 1, f2.bit_count())
                        law[key] = law.get(key, 0.0) + float(mass.sum())
                    else:
                        new[f2, :, a] += mass
            occ = new
        return law


def text_lab_policy(setting: TextLabSetting = TextLabSetting()) -> TextLabPolicy:
    """The setting's initial policy (its action logits are SearchToy's for the same world)."""
    return TextLabPolicy(setting, initial_logits(setting.search))
