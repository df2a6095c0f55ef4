"""A character-level tokenizer the project builds itself (no hub at run time).

Saved as a ``PreTrainedTokenizerFast`` so that transformers' ``AutoTokenizer``
and vLLM load it like any other. Prompts are encoded with :func:`encode_prompt`
everywhere (searcher, trainer, eval), so every service sees the same ids.
"""

from __future__ import annotations

import string
from pathlib import Path

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]
# Everything the built-in tasks and GSM8K-style text need, one token per character.
CHARACTERS = string.digits + "+-*/()=., ?:;!'\"%$#&<>[]_\n" + string.ascii_letters


def build_tokenizer():
    """Return a ``PreTrainedTokenizerFast`` over :data:`CHARACTERS` with BOS prepended to every text."""
    from tokenizers import Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + sorted(set(CHARACTERS), key=CHARACTERS.index))}
    # BPE without merges splits a text into its characters; Fuse joins them back without spaces.
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
        clean_up_tokenization_spaces=False,
    )


def load_tokenizer(model_dir: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Token ids of a prompt as the policy sees it: BOS, then one id per character."""
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])
