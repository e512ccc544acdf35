"""The tiny model's tokenizer: byte-level BPE trained on transcripts, with a ChatML template."""

from __future__ import annotations

from typing import Sequence

from twice_envs._deps import require

#: A ChatML-style template for the tiny model's tokenizer.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: Special tokens, in id order (``<|endoftext|>`` pads, ``<|im_end|>`` ends a turn).
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def train_tokenizer(texts: Sequence[str], vocab_size: int, whole_tokens: Sequence[str] = ()):
    """A byte-level BPE tokenizer trained on ``texts``, with the ChatML template.

    Each string of ``whole_tokens`` (product ids) becomes one token of its own, added after the
    ``vocab_size`` BPE tokens and matched before BPE: it is the same single token on a page
    (``" B00001D1VZ"``) and in an action (``"click[B00001D1VZ]"``), so copying it is one step.
    """
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
    if whole_tokens:
        tok.add_tokens([tokenizers.AddedToken(t, normalized=False) for t in sorted(set(whole_tokens))])
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None, unk_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
