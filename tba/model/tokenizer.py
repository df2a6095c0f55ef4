"""Tokenizers: the character-level one the project builds itself, and how every prompt is encoded.

The tiny model's tokenizer is saved as a ``PreTrainedTokenizerFast`` so that transformers'
``AutoTokenizer`` and vLLM load it like any other. Prompts are encoded by :class:`PromptFormat`
everywhere (searcher, evaluation, SFT): as plain text, or through the tokenizer's chat template for
instruction-tuned models. The searcher sends the ids it generated from with every group, so the
trainer scores exactly those ids and never encodes a prompt itself.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
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
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
    )


def load_tokenizer(model_dir: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


CHAT_MODES = ("auto", "on", "off")


def uses_chat(tokenizer, mode: str) -> bool:
    """Whether prompts go through the chat template: ``on``, ``off``, or ``auto`` (when the tokenizer has one)."""
    if mode not in CHAT_MODES:
        raise ValueError(f"chat template mode must be one of {', '.join(CHAT_MODES)}, got {mode!r}")
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if mode == "on" and not has_template:
        raise ValueError("chat template mode is 'on' but the model's tokenizer has no chat template")
    return has_template if mode == "auto" else mode == "on"


@dataclass(frozen=True)
class PromptFormat:
    """How a task's prompt text becomes the token ids the policy sees.

    Plain: the tokenizer's own special tokens (the tiny model's BOS) and the text. Chat: the text as
    the user's message (after an optional system message) rendered by the tokenizer's chat template
    with the assistant's turn opened, then tokenized without adding special tokens again, as
    transformers' ``apply_chat_template(tokenize=True)`` does: a template that writes BOS itself
    does not get a second one."""

    chat: bool = False
    system_prompt: str | None = None

    def render(self, tokenizer, text: str) -> str:
        """The chat-rendered prompt string (the text itself when plain)."""
        if not self.chat:
            return text
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": text})
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def encode(self, tokenizer, text: str) -> list[int]:
        return list(tokenizer(self.render(tokenizer, text), add_special_tokens=not self.chat)["input_ids"])


PLAIN = PromptFormat()


def encode_prompt(tokenizer, text: str, prompt_format: PromptFormat = PLAIN) -> list[int]:
    """Token ids of a prompt as the policy sees it (plain: the tiny model's BOS, then one id per character)."""
    return prompt_format.encode(tokenizer, text)
