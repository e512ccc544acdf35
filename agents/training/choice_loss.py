"""The loss of a turn chosen among listed candidates: PPO-clip on the choice's log-probability.

A chosen turn (``TurnRecord.choice``, :class:`~twice_envs.agents.sampling.choice.Choice`) was drawn from

    pi(i) = softmax(S / tau)[i],   S_j = score of candidate j's token log-probs given the context

(``sum`` or ``mean`` of ``log_softmax`` of the model's logits, no temperature, no nucleus), not sampled
token by token. Its tokens therefore never enter the token loss (:func:`~.loss.pack` masks them), and the
turn enters as one categorical decision:

    r    = exp(log pi_new(i) - log pi_old(i))          log pi_old: the record's ``choice["logprob"]``
    pg   = -min(r A_t, clip(r, 1 - eps, 1 + eps) A_t)
    kl   = exp(d) - d - 1,  d = log pi_ref(i) - log pi_new(i)   (k3, as for tokens)

Each chosen turn counts as one unit of the loss's mean, beside each generated token (a decision is the
unit the policy sampled: a token of a generated turn, the whole of a chosen one).

``log pi_new(i)`` needs every candidate's score with gradients. :func:`choice_logprobs` computes them in one
forward pass per packed row that holds chosen turns: the row's tokens up to its last chosen turn, then
each chosen turn's candidates as a token trie (:class:`~twice_envs.agents.sampling.candidates.Trie`) whose
tokens see the row's tokens before that turn and their own trie ancestors only, at the positions they
would have after that context. So each candidate is scored as if it followed its context alone, as the
choice policy scored it at sampling time (up to float rounding: the log-probs are taken in float64).

A candidate's tokens are its text encoded again, plus the end-of-turn token where the record's token count
says the policy added one; a record whose counts no encoding matches is refused, naming the turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from twice_envs.agents.sampling.candidates import Trie
from twice_envs.agents.sampling.choice import SCORES


@dataclass
class ChoiceTurn:
    """A chosen turn of a packed batch.

    Attributes:
        row: its row in the batch.
        start: the position of its first token in that row (its context is the row before it).
        choice: the turn's record (``TurnRecord.choice``).
        tokens: the chosen candidate's tokens, as the record holds them.
        advantage: the turn's advantage.
        where: the episode and turn, for messages.
    """

    row: int
    start: int
    choice: dict
    tokens: list[int]
    advantage: float
    where: str


def candidate_token_ids(turn: ChoiceTurn, encode: Callable[[str], list[int]], eos: Optional[int]) -> list[list[int]]:
    """Each candidate's tokens: the chosen one's from the record, the others encoded again (with ``eos`` where
    the record's count is one more than the encoding's)."""
    c = turn.choice
    out = []
    for j, (text, count) in enumerate(zip(c["candidates"], c["token_counts"])):
        if j == c["index"]:
            ids = list(turn.tokens)
        else:
            ids = [int(t) for t in encode(text)]
            if count == len(ids) + 1 and eos is not None:
                ids.append(int(eos))
        if len(ids) != count or not ids:
            raise ValueError(f"{turn.where}: candidate {j} {text!r} encodes to {len(ids)} tokens but the record "
                             f"counts {count}: the record was not written by this tokenizer")
        out.append(ids)
    return out


def _row_scores(model: torch.nn.Module, ids: torch.Tensor, turns: Sequence[ChoiceTurn],
                cands: Sequence[list[list[int]]], attention: str) -> list[torch.Tensor]:
    """Per chosen turn of one row, its candidates' scores ``(C,)`` (one forward pass, see the module)."""
    length = max(t.start for t in turns)
    tries = [Trie(c) for c in cands]
    total = length + sum(len(tr) for tr in tries)
    tokens = torch.empty(total, dtype=torch.long)
    pos = torch.empty(total, dtype=torch.long)
    allowed = torch.zeros((total, total), dtype=torch.bool)
    tokens[:length] = ids[:length].cpu()
    pos[:length] = torch.arange(length)
    allowed[:length, :length] = torch.ones((length, length), dtype=torch.bool).tril()
    at, offsets = length, []
    for t, tr in zip(turns, tries):
        n = len(tr)
        tokens[at: at + n] = torch.tensor(tr.tokens, dtype=torch.long)
        pos[at: at + n] = t.start + torch.tensor(tr.depths, dtype=torch.long)
        allowed[at: at + n, : t.start] = True
        allowed[at: at + n, at: at + n] = tr.sees()
        offsets.append(at)
        at += n
    dev = next(model.parameters()).device
    if attention == "sdpa":
        mask = allowed[None, None].to(dev)
    else:
        dtype = next(model.parameters()).dtype
        mask = torch.zeros((1, 1, total, total), dtype=dtype).masked_fill_(~allowed[None, None],
                                                                            torch.finfo(dtype).min).to(dev)
    # the positions whose logits predict a candidate token: each turn's last context token, and its trie nodes
    wanted = torch.tensor([t.start - 1 for t in turns] + list(range(length, total)), dtype=torch.long, device=dev)
    body, head = getattr(model, "model", None), getattr(model, "lm_head", None)
    kwargs = dict(input_ids=tokens[None].to(dev), attention_mask=mask, position_ids=pos[None].to(dev))
    if body is not None and head is not None:
        logits = head(body(**kwargs).last_hidden_state[0, wanted])
    else:
        logits = model(**kwargs).logits[0, wanted]
    logp = torch.log_softmax(logits.double(), dim=-1)
    out = []
    for k, (t, tr, cs) in enumerate(zip(turns, tries, cands)):
        first = logp[k]
        nodes = logp[len(turns) + offsets[k] - length: len(turns) + offsets[k] - length + len(tr)]
        per_cand = []
        for c, path in zip(cs, tr.paths):
            rows = torch.cat([first[None], nodes[path[:-1]]], dim=0)
            lp = rows.gather(-1, torch.tensor(c, device=dev)[:, None]).squeeze(-1)
            per_cand.append(lp.sum() if t.choice["score"] == "sum" else lp.mean())
        out.append(torch.stack(per_cand))
    return out


def choice_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, turns: Sequence[ChoiceTurn],
                    encode: Callable[[str], list[int]], eos: Optional[int]) -> torch.Tensor:
    """``(K,)`` ``log softmax(S / tau)[index]`` of each chosen turn of ``turns`` under ``model`` (differentiable),
    in the order given; ``input_ids`` are the packed batch's ``(B, L)`` tokens."""
    if not turns:
        return torch.zeros(0, dtype=torch.float64)
    for t in turns:
        if t.choice.get("score") not in SCORES:
            raise ValueError(f"{t.where}: unknown choice score {t.choice.get('score')!r}")
    attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
    by_row: dict[int, list[int]] = {}
    for k, t in enumerate(turns):
        by_row.setdefault(t.row, []).append(k)
    out: list[Optional[torch.Tensor]] = [None] * len(turns)
    for row, ks in by_row.items():
        row_turns = [turns[k] for k in ks]
        cands = [candidate_token_ids(t, encode, eos) for t in row_turns]
        scores = _row_scores(model, input_ids[row], row_turns, cands, attention)
        for k, t, s in zip(ks, row_turns, scores):
            out[k] = torch.log_softmax(s / float(t.choice["temperature"]), dim=-1)[int(t.choice["index"])]
    return torch.stack(out)  # type: ignore[arg-type]
