"""Keyed sampling in vLLM: the per-request logic shared by both processor interfaces,
the table of vLLM symbols they rely on, and the processor for vLLM's V1 model runner.

vLLM keeps a persistent batch whose rows are added, removed and moved between steps,
so the sampler state lives per *request* (a :class:`KeyedRequest` around the core's
:class:`~twice_envs.noise.KeyState`), and the row index is only where the request sits
now. A request opts in by carrying its key base in ``SamplingParams.extra_args``
(:func:`keyed_extra_args` builds them; :data:`EXTRA_FIELDS` describes each field)::

    SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=128, extra_args={
        "twice_key": [episode_seed, turn, branch],     # the env's info["noise_key"] base
        "twice_temperature": 1.0, "twice_top_p": 1.0,  # the keyed sampling distribution
        "twice_key_mode": "line", "twice_token_counter": 0,
        "twice_prompt_len": 812})                      # optional: see "Resumed requests"

The processor replaces the row's logits by ``0`` at the keyed sample
(:func:`twice_envs.noise.keyed_choice`) and ``-inf`` elsewhere, so whatever vLLM's own
sampler does next, it emits that token: exactly the token
:class:`~twice_envs.agents.sampling.processor.KeyedLogitsProcessor` emits for the same
logits and key. Leave vLLM's own temperature at 1 and top-p at 1 (its scaling cannot
change a forced row's argmax, but its top-k/top-p could only waste time). A row that
already has a single finite logit (forced by another copy of the processor, or by any
other stage) is left alone: its keyed sample is that token.

Resumed requests. A client may stop a turn and re-send it as a new request whose prompt
is the turn's prompt followed by the tokens generated so far (verl's fully-async partial
rollouts do this, with the same sampling parameters). ``twice_prompt_len`` is then the
length of the turn's *original* prompt: the prompt tokens past it are output of this turn
and are folded into the key state before the first sample, so the keys follow the turn's
tokens, not the request's. It never changes across re-sends; leave it out for a fresh turn.

Validation. ``validate_params`` (vLLM runs it when a request is admitted, in the API
process) refuses a malformed request with a ``ValueError`` that names the field, so a
bad request fails alone and never reaches the engine: :func:`parse_keyed_args`.

Which interface: the engine's ``vllm_config.use_v2_model_runner`` says which model runner
constructs the processor (:func:`engine_runner`); the V1 runner takes this module's
:class:`TwiceKeyedLogitsProcessor`, Model Runner V2 the one of
:mod:`~twice_envs.agents.sampling.vllm_v2`, and
:class:`~twice_envs.agents.sampling.vllm_engine.TwiceKeyedProcessor` picks between them.
The state logic is plain Python and torch, tested without vLLM.
"""

from __future__ import annotations

import importlib
import logging
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence, Union

import torch

from twice_envs.agents.sampling.processor import force_tokens, newline_token_table
from twice_envs.keys import UINT32_MAX, UINT64_MAX, NoiseKey
from twice_envs.noise import KEY_MODES, NGRAM, KeyState, keyed_choice, state_rows

log = logging.getLogger(__name__)

EXTRA_KEY = "twice_key"

#: The keyed-sampling fields of ``SamplingParams.extra_args`` (every other ``twice_*`` name is refused).
EXTRA_FIELDS: Mapping[str, str] = {
    "twice_key": "[episode_seed, turn, branch]: the turn's key base (required; its presence opts the request in)",
    "twice_temperature": "temperature of the keyed sampling distribution (> 0; default 1)",
    "twice_top_p": "nucleus mass of the keyed sampling distribution (in (0, 1]; default 1)",
    "twice_key_mode": f"one of {KEY_MODES} (default 'line')",
    "twice_token_counter": "tokens generated earlier in the episode ('counter' mode; default 0)",
    "twice_prompt_len": "length of the turn's original prompt, for a resumed request (default: the prompt's length)",
}

#: Where the chooser lives (``module:Class`` for vLLM's ``logits_processors``); kept as parts so that
#: this module, which its module imports, names it in messages without depending on it.
PROCESSOR_PARTS = ("twice_envs.agents.sampling.vllm_engine", "TwiceKeyedProcessor")


def processor_path() -> str:
    """``module:Class`` of the processor that picks the interface of the engine's model runner."""
    return ":".join(PROCESSOR_PARTS)


# ----------------------------------------------------------------------------- vLLM symbols
class VllmSymbol(NamedTuple):
    """One vLLM symbol the processors rely on, and what they expect of it."""

    interface: str
    """``v1`` (V1 model runner), ``v2`` (Model Runner V2) or ``engine`` (both)."""
    module: str
    name: str
    """Attribute path inside ``module``."""
    kind: str
    """``class``, ``params`` (parameter names of a callable), ``fields`` (dataclass fields, a subset),
    ``members`` (enum members, a subset), ``attrs`` (attributes assigned in ``__init__``, a subset),
    ``arity`` (arguments of a ``tuple[...]`` alias), ``value`` or ``attribute`` (exists on the class)."""
    expected: Any = None


_V1 = "vllm.v1.sample.logits_processor"
_V2 = "vllm.v1.worker.gpu.sample.logits_processor"

#: Every vLLM module path, class, method signature and field the processors use. The code imports
#: its base classes through this table, and ``tests/agents/test_vllm_processor.py`` checks each row
#: against the installed vLLM, so an interface change fails loudly.
VLLM_SYMBOLS: tuple[VllmSymbol, ...] = (
    # V1 model runner: BatchUpdate interface
    VllmSymbol("v1", _V1, "LogitsProcessor", "class"),
    VllmSymbol("v1", _V1, "LogitsProcessor.__init__", "params", ("self", "vllm_config", "device", "is_pin_memory")),
    VllmSymbol("v1", _V1, "LogitsProcessor.validate_params", "params", ("sampling_params",)),
    VllmSymbol("v1", _V1, "LogitsProcessor.is_argmax_invariant", "params", ("self",)),
    VllmSymbol("v1", _V1, "LogitsProcessor.update_state", "params", ("self", "batch_update")),
    VllmSymbol("v1", _V1, "LogitsProcessor.apply", "params", ("self", "logits")),
    VllmSymbol("v1", _V1, "BatchUpdate", "fields", ("removed", "added", "moved")),
    VllmSymbol("v1", _V1, "MoveDirectionality", "members", ("SWAP", "UNIDIRECTIONAL")),
    # (index, params, prompt_tok_ids, output_tok_ids): prompt ids for n-gram and resumed keys
    VllmSymbol("v1", _V1 + ".interface", "AddedRequest", "arity", 4),
    VllmSymbol("v1", _V1, "LOGITSPROCS_GROUP", "value", "vllm.logits_processors"),
    # Model Runner V2
    VllmSymbol("v2", _V2, "LogitsProcessor", "class"),
    VllmSymbol("v2", _V2, "LogitsProcessor.__init__", "params", ("self", "vllm_config", "req_states")),
    VllmSymbol("v2", _V2, "LogitsProcessor.validate_params", "params", ("sampling_params",)),
    VllmSymbol("v2", _V2, "LogitsProcessor.add_request", "params", ("self", "req_idx", "sampling_params")),
    VllmSymbol("v2", _V2, "LogitsProcessor.apply_staged_writes", "params", ("self",)),
    VllmSymbol("v2", _V2, "LogitsProcessor.apply", "params", ("self", "logits", "ctx")),
    VllmSymbol("v2", _V2, "LogitsContext", "fields",
               ("expanded_idx_mapping", "idx_mapping_np", "expanded_local_pos", "input_ids", "pos")),
    VllmSymbol("v2", _V2, "LogitsProcRequestState", "fields", ("prompt_len", "all_token_ids")),
    VllmSymbol("v2", "vllm.v1.worker.gpu.buffer_utils", "UvaBackedTensor", "attrs", ("np",)),
    VllmSymbol("v2", "vllm.v1.worker.gpu.buffer_utils", "StagedWriteTensor", "attrs", ("gpu",)),
    VllmSymbol("v2", _V2 + ".loader", "LOGITSPROCS_GROUP", "value", "vllm.logits_processors"),
    # the engine (both runners)
    VllmSymbol("runner_flag", "vllm.config", "VllmConfig.use_v2_model_runner", "attribute"),
    VllmSymbol("engine", "vllm.config", "VllmConfig", "fields", ("model_config",)),
    VllmSymbol("engine", "vllm.config", "ModelConfig", "fields", ("tokenizer", "trust_remote_code")),
    VllmSymbol("engine", "vllm.config", "ModelConfig.get_vocab_size", "params", ("self",)),
    VllmSymbol("engine", "vllm", "SamplingParams", "fields", ("extra_args",)),
)

#: The vLLM releases whose source has each group of :data:`VLLM_SYMBOLS`: ``(first, end)``, end
#: exclusive (``None``: still there in the newest release checked, 0.34).
VLLM_RELEASES: Mapping[str, tuple[tuple[int, int], Optional[tuple[int, int]]]] = {
    "v1": ((0, 24), (0, 34)),
    "v2": ((0, 32), None),
    "runner_flag": ((0, 24), (0, 34)),
    "engine": ((0, 24), None),
}


def vllm_symbol(interface: str, name: str) -> Optional[Any]:
    """The object a ``class`` row of :data:`VLLM_SYMBOLS` names, or ``None`` when vLLM (or that module) is absent."""
    row = next(s for s in VLLM_SYMBOLS if s.interface == interface and s.name == name and s.kind == "class")
    try:
        obj = importlib.import_module(row.module)
    except ImportError:
        return None
    for part in row.name.split("."):
        obj = getattr(obj, part, None)
    return obj


# ----------------------------------------------------------------------------- request fields
def keyed_extra_args(key: NoiseKey, *, temperature: float = 1.0, top_p: float = 1.0, key_mode: str = "line",
                     token_counter: int = 0, prompt_len: Optional[int] = None) -> dict:
    """The ``SamplingParams.extra_args`` that make a vLLM request sample with ``key``.

    ``prompt_len``: for a turn that may be re-sent with its output so far appended to the
    prompt, the length of the turn's original prompt (see "Resumed requests" above).
    """
    extra = {
        EXTRA_KEY: [int(key.episode_seed), int(key.turn), int(key.branch)],
        "twice_temperature": float(temperature),
        "twice_top_p": float(top_p),
        "twice_key_mode": key_mode,
        "twice_token_counter": int(token_counter),
    }
    if prompt_len is not None:
        extra["twice_prompt_len"] = int(prompt_len)
    parse_keyed_args(extra)  # the same checks vLLM runs on admission
    return extra


@dataclass(frozen=True)
class KeyedArgs:
    """The validated keyed-sampling fields of one request."""

    key: NoiseKey
    temperature: float
    top_p: float
    mode: str
    token_counter: int
    prompt_len: Optional[int]


def _field(name: str, index: Optional[int] = None, label: str = "") -> str:
    where = f"extra_args[{name!r}]" + (f"[{index}]" if index is not None else "")
    return f"{where} ({label})" if label else where


def _integer(value: Any, where: str, upper: int, upper_text: str) -> int:
    # bools are ints to Python and floats would be truncated: both are refused, as are strings
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) <= upper:
        raise ValueError(f"{where} must be an integer in [0, {upper_text}), got {value!r}")
    return int(value)


def _real(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ValueError(f"{where} must be a finite number, got {value!r}")
    return float(value)


def parse_keyed_args(extra: Optional[Mapping]) -> Optional[KeyedArgs]:
    """The keyed-sampling fields of a request's ``extra_args``; ``None`` when it carries none.

    A malformed field raises ``ValueError`` naming it (vLLM's ``validate_params`` runs
    this on admission, so a bad request is refused alone).
    """
    if not extra:
        return None
    if not isinstance(extra, Mapping):
        raise ValueError(f"extra_args must be a dict, got {type(extra).__name__}")
    names = [k for k in extra if isinstance(k, str) and k.startswith("twice_")]
    if not names:
        return None
    unknown = sorted(set(names) - set(EXTRA_FIELDS))
    if unknown:
        raise ValueError(f"unknown keyed sampling field extra_args[{unknown[0]!r}]; "
                         f"the fields are {', '.join(EXTRA_FIELDS)}")
    if EXTRA_KEY not in extra:
        raise ValueError(f"extra_args has keyed sampling fields ({', '.join(sorted(names))}) "
                         f"but no {EXTRA_KEY!r} = [episode_seed, turn, branch]")
    raw = extra[EXTRA_KEY]
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
        raise ValueError(f"{_field(EXTRA_KEY)} must be a list [episode_seed, turn, branch], got {raw!r}")
    if len(raw) != 3:
        raise ValueError(f"{_field(EXTRA_KEY)} must be [episode_seed, turn, branch] (3 integers), "
                         f"got {len(raw)} values: {list(raw)!r}")
    seed = _integer(raw[0], _field(EXTRA_KEY, 0, "episode_seed"), UINT64_MAX, "2**64")
    turn = _integer(raw[1], _field(EXTRA_KEY, 1, "turn"), UINT32_MAX, "2**32")
    branch = _integer(raw[2], _field(EXTRA_KEY, 2, "branch"), UINT32_MAX, "2**32")
    tau = _real(extra.get("twice_temperature", 1.0), _field("twice_temperature"))
    if not tau > 0:
        raise ValueError(f"{_field('twice_temperature')} must be > 0, got {tau!r}")
    top_p = _real(extra.get("twice_top_p", 1.0), _field("twice_top_p"))
    if not 0 < top_p <= 1:
        raise ValueError(f"{_field('twice_top_p')} must lie in (0, 1], got {top_p!r}")
    mode = extra.get("twice_key_mode", "line")
    if mode not in KEY_MODES:
        raise ValueError(f"{_field('twice_key_mode')} must be one of {KEY_MODES}, got {mode!r}")
    counter = _integer(extra.get("twice_token_counter", 0), _field("twice_token_counter"), UINT32_MAX, "2**32")
    prompt_len = extra.get("twice_prompt_len")
    if prompt_len is not None:
        prompt_len = _integer(prompt_len, _field("twice_prompt_len"), UINT32_MAX, "2**32")
    return KeyedArgs(NoiseKey(seed, turn, branch), tau, top_p, str(mode), counter, prompt_len)


# ----------------------------------------------------------------------------- per-request state
class NewlineTable:
    """Per token id, whether its text contains a newline: a tensor, or a function that builds it
    on first use (so an engine that never sees a keyed request never loads its tokenizer)."""

    def __init__(self, source: Union[torch.Tensor, Callable[[], torch.Tensor]]) -> None:
        self._source = source
        self._table: Optional[torch.Tensor] = source.cpu() if isinstance(source, torch.Tensor) else None

    @property
    def table(self) -> torch.Tensor:
        if self._table is None:
            self._table = self._source().cpu()
        return self._table

    def has_newline(self, token: int) -> bool:
        t = self.table
        return 0 <= token < t.numel() and bool(t[token])


@dataclass
class KeyedRequest:
    """The keyed-sampling state of one vLLM request (moves with the request, never with a row)."""

    state: KeyState
    """The core key state (key base, mode, line/pos counters, n-gram context)."""
    temperature: float
    """Temperature of the keyed sampling distribution."""
    top_p: float
    """Nucleus mass of the keyed sampling distribution."""
    turn_prompt_len: Optional[int] = None
    """Length of the turn's original prompt (``twice_prompt_len``); ``None``: the request's prompt."""
    seen: int = 0
    """Output tokens (of this request) already folded into :attr:`state`."""
    started: bool = False
    """Whether :meth:`begin` has run."""

    @classmethod
    def from_extra_args(cls, extra: Optional[Mapping]) -> Optional["KeyedRequest"]:
        """The request's state from its ``extra_args`` (``None`` when it carries no key); bad values raise ``ValueError``."""
        args = parse_keyed_args(extra)
        if args is None:
            return None
        return cls(KeyState(args.key, args.mode, args.token_counter), args.temperature, args.top_p, args.prompt_len)

    def begin(self, prompt_len: int, read_prompt: Callable[[int, int], Sequence[int]], newlines: NewlineTable) -> None:
        """Read what the key needs from the request's prompt (``read_prompt(start, stop)`` gives its tokens).

        ``ngram`` keys take the last tokens of the turn's prompt; a resumed request's prompt
        tokens past the turn's original prompt are folded in as already emitted.
        """
        self.started = True
        turn_len = prompt_len if self.turn_prompt_len is None else self.turn_prompt_len
        if turn_len > prompt_len:
            log.warning("keyed sampling: twice_prompt_len %d exceeds the request's prompt (%d tokens); "
                        "no prompt token is taken as output", turn_len, prompt_len)
            turn_len = prompt_len
        if self.state.mode == "ngram":
            self.state.context = [int(t) for t in read_prompt(max(0, turn_len - NGRAM), turn_len)]
        if turn_len < prompt_len:
            for t in read_prompt(turn_len, prompt_len):
                self.state.advance(int(t), newlines.has_newline(int(t)))

    def catch_up(self, outputs: Sequence[int], newlines: NewlineTable, start: int = 0) -> None:
        """Fold ``outputs`` (the request's output tokens ``start, start + 1, ...``) past :attr:`seen`."""
        for i in range(self.seen - start, len(outputs)):
            t = int(outputs[i])
            self.state.advance(t, newlines.has_newline(t))
            self.seen += 1


def force_keyed_rows(logits: torch.Tensor, rows: Sequence[int], requests: Sequence[KeyedRequest]) -> None:
    """Force ``logits[rows[i]]`` (in place) to the keyed sample of ``requests[i]``.

    Rows are grouped by sampling distribution; each group is one :func:`keyed_choice` call.
    A row with a single finite logit is left as it is (its keyed sample is that token).
    """
    idx_all = torch.tensor(list(rows), dtype=torch.long, device=logits.device)
    open_rows = (torch.isfinite(logits[idx_all]).sum(-1) != 1).tolist()
    groups: dict[tuple[float, float], list[int]] = {}
    for i, req in enumerate(requests):
        if open_rows[i]:
            groups.setdefault((req.temperature, req.top_p), []).append(i)
    for (tau, top_p), members in groups.items():
        idx = torch.tensor([rows[i] for i in members], dtype=torch.long, device=logits.device)
        keys = torch.from_numpy(state_rows([requests[i].state for i in members])).to(logits.device)
        tokens = keyed_choice(logits[idx], keys, temperature=tau, top_p=top_p).tokens
        logits[idx] = force_tokens(logits[idx], tokens)


# ----------------------------------------------------------------------------- V1 state
class KeyedBatchState:
    """Row index -> keyed request, updated from the V1 runner's batch updates."""

    def __init__(self, newline_table: Union[torch.Tensor, Callable[[], torch.Tensor], NewlineTable]) -> None:
        self.newlines = newline_table if isinstance(newline_table, NewlineTable) else NewlineTable(newline_table)
        #: row -> (request state, live reference to the request's output tokens)
        self.rows: dict[int, tuple[KeyedRequest, list]] = {}

    def update(self, removed: Sequence[int], added: Sequence[tuple], moved: Sequence[tuple]) -> None:
        """Apply a batch update in vLLM's order: removed, added, moved.

        ``added``: ``(index, extra_args, prompt_ids, output_ids)`` where ``output_ids`` is
        the live list vLLM appends to; ``moved``: ``(i, j, swap)`` where ``swap`` is True
        for a two-way swap, False for a move i -> j.
        """
        for i in removed:
            self.rows.pop(int(i), None)
        for index, extra, prompt_ids, output_ids in added:
            req = KeyedRequest.from_extra_args(extra)
            if req is None:
                self.rows.pop(int(index), None)
                continue
            prompt = list(prompt_ids) if prompt_ids is not None else []
            req.begin(len(prompt), lambda a, b, p=prompt: p[a:b], self.newlines)
            self.rows[int(index)] = (req, output_ids)
        for i, j, swap in moved:
            a, b = self.rows.pop(int(i), None), self.rows.pop(int(j), None)
            if a is not None:
                self.rows[int(j)] = a
            if swap and b is not None:
                self.rows[int(i)] = b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Force each keyed row's logits to its keyed sample (other rows are left alone)."""
        rows, reqs = [], []
        for i, (req, outputs) in self.rows.items():
            if i < logits.shape[0]:
                req.catch_up(outputs, self.newlines)
                rows.append(i)
                reqs.append(req)
        if rows:
            force_keyed_rows(logits, rows, reqs)
        return logits


def model_newline_table(vllm_config: Any) -> torch.Tensor:
    """:func:`~twice_envs.agents.sampling.processor.newline_token_table` of a vLLM engine's model."""
    from transformers import AutoTokenizer

    cfg = vllm_config.model_config
    tok = AutoTokenizer.from_pretrained(cfg.tokenizer, trust_remote_code=bool(getattr(cfg, "trust_remote_code", False)))
    return newline_token_table(tok, cfg.get_vocab_size())


# ----------------------------------------------------------------------------- which runner
RUNNER_NAMES = {"v1": "vLLM's V1 model runner", "v2": "vLLM's Model Runner V2"}
#: The ``VllmConfig`` attribute that says which runner the engine uses (from :data:`VLLM_SYMBOLS`).
RUNNER_FLAG = next(s for s in VLLM_SYMBOLS if s.interface == "runner_flag").name.rpartition(".")[2]


def engine_runner(vllm_config: Any, runner_args: Sequence[Any] = (),
                  runner_kwargs: Optional[Mapping[str, Any]] = None) -> str:
    """``"v1"`` or ``"v2"``: the model runner that constructs a processor with these arguments.

    ``vllm_config.use_v2_model_runner`` decides where the engine has it (vLLM 0.24-0.33);
    without it, the arguments do: the V1 runner passes ``(vllm_config, device,
    is_pin_memory)``, Model Runner V2 ``(vllm_config, req_states)`` (vLLM 0.34 has only V2).
    Config and arguments that disagree raise ``RuntimeError``.
    """
    runner_kwargs = runner_kwargs or {}
    by_args = "v2" if len(runner_args) + len(runner_kwargs) == 1 or "req_states" in runner_kwargs else "v1"
    try:
        flag = getattr(vllm_config, RUNNER_FLAG, None)
    except Exception:  # noqa: BLE001 - a config that cannot say: the arguments decide
        flag = None
    if not isinstance(flag, bool):
        return by_args
    by_config = "v2" if flag else "v1"
    if by_config != by_args:
        raise RuntimeError(f"keyed sampling: vllm_config.{RUNNER_FLAG} is {flag}, but the processor was "
                           f"constructed with the arguments of {RUNNER_NAMES[by_args]}")
    return by_config


def wrong_runner(cls: type, runner: str) -> RuntimeError:
    """The error of a processor class constructed by a model runner whose interface it does not implement."""
    other = "v1" if runner == "v2" else "v2"
    return RuntimeError(
        f"{cls.__name__} implements the logits processor interface of {RUNNER_NAMES[other]}, but this engine "
        f"runs {RUNNER_NAMES[runner]}: pass logits_processors=['{processor_path()}'] (it picks the interface of "
        "the engine's model runner)")


# ----------------------------------------------------------------------------- the V1 processor
_VLLMLogitsProcessor = vllm_symbol("v1", "LogitsProcessor")
_V2Base = vllm_symbol("v2", "LogitsProcessor")

if _VLLMLogitsProcessor is not None:
    _MoveDirectionality = importlib.import_module(_V1).MoveDirectionality

    class TwiceKeyedLogitsProcessor(_VLLMLogitsProcessor):
        """Keyed Gumbel sampling per request, V1 model runner (module level: vLLM loads it by name)."""

        def __init__(self, vllm_config: Any, *runner_args: Any, **runner_kwargs: Any) -> None:
            runner = engine_runner(vllm_config, runner_args, runner_kwargs)
            if runner != "v1":
                raise wrong_runner(type(self), runner)
            self.state = KeyedBatchState(lambda: model_newline_table(vllm_config))

        @classmethod
        def validate_params(cls, sampling_params: Any) -> None:
            parse_keyed_args(sampling_params.extra_args)

        def is_argmax_invariant(self) -> bool:
            return False

        def update_state(self, batch_update: Any) -> None:
            if batch_update is None:
                return
            added = [(i, params.extra_args if params is not None else None, prompt, out)
                     for i, params, prompt, out in batch_update.added]
            moved = [(i, j, d == _MoveDirectionality.SWAP) for i, j, d in batch_update.moved]
            self.state.update(batch_update.removed, added, moved)

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            return self.state.apply(logits)

elif _V2Base is not None:

    class TwiceKeyedLogitsProcessor:  # type: ignore[no-redef]
        """Stand-in where vLLM has no V1 model runner (0.34 on): constructing it names the class to use."""

        def __init__(self, vllm_config: Any, *runner_args: Any, **runner_kwargs: Any) -> None:
            raise wrong_runner(type(self), "v2")

        @classmethod
        def validate_params(cls, sampling_params: Any) -> None:
            parse_keyed_args(sampling_params.extra_args)

        def apply(self, logits: torch.Tensor, *args: Any) -> torch.Tensor:  # pragma: no cover - never built
            return logits

if _V2Base is not None:
    # Model Runner V2's loader accepts it, so that its constructor can name the class to use there
    _V2Base.register(TwiceKeyedLogitsProcessor)
