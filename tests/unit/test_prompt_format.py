"""How a prompt becomes the token ids the policy sees: plain, or through the model's chat template."""

from __future__ import annotations

import pytest

from tba.model.tokenizer import PLAIN, PromptFormat, build_tokenizer, encode_prompt, uses_chat

# A ChatML template like SmolLM2's and Qwen's, written for the character-level tokenizer (its special
# tokens spelt with the characters it has): the template writes BOS itself, as Llama 3's does.
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def chat_tokenizer():
    tok = build_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


def test_plain_prompts_are_bos_then_characters(tokenizer) -> None:
    ids = encode_prompt(tokenizer, "12+3=")
    assert ids[0] == tokenizer.bos_token_id and tokenizer.decode(ids[1:]) == "12+3="
    assert PLAIN.render(tokenizer, "12+3=") == "12+3=" and PLAIN.encode(tokenizer, "12+3=") == ids


def test_chat_prompts_are_what_apply_chat_template_gives(chat_tokenizer) -> None:
    for fmt in (PromptFormat(chat=True), PromptFormat(chat=True, system_prompt="Be brief.")):
        messages = [{"role": "system", "content": fmt.system_prompt}] if fmt.system_prompt else []
        messages.append({"role": "user", "content": "What is 2+3?"})
        expected = chat_tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        ids = fmt.encode(chat_tokenizer, "What is 2+3?")
        assert ids == list(expected)
        assert ids.count(chat_tokenizer.bos_token_id) == 1  # the template's BOS, not a second one
        assert fmt.render(chat_tokenizer, "What is 2+3?").endswith("[user]What is 2+3?\n[assistant]")
    assert "[system]Be brief." in PromptFormat(chat=True, system_prompt="Be brief.").render(chat_tokenizer, "x")


def test_chat_mode_resolution(tokenizer, chat_tokenizer) -> None:
    assert uses_chat(chat_tokenizer, "auto") and uses_chat(chat_tokenizer, "on")
    assert not uses_chat(chat_tokenizer, "off") and not uses_chat(tokenizer, "auto") and not uses_chat(tokenizer, "off")
    with pytest.raises(ValueError, match="'on' but the model's tokenizer has no chat template"):
        uses_chat(tokenizer, "on")
    with pytest.raises(ValueError, match="must be one of auto, on, off"):
        uses_chat(tokenizer, "yes")


def test_the_warm_up_sees_prompts_as_the_searchers_encode_them(tokenizer, chat_tokenizer) -> None:
    from tba.model.sft import _example
    from tba.tasks import make_task

    for tok, chat in ((tokenizer, False), (chat_tokenizer, True)):
        task = make_task("arithmetic", chat=chat)
        prompt = task.eval_prompts(1)[0]
        ids, target = _example(tok, task, prompt)
        assert ids == PromptFormat(chat=chat).encode(tok, prompt.text)
        assert tok.decode(target[:-1]) == task.sft_target(prompt) and target[-1] == tok.eos_token_id


def test_the_warm_up_refuses_a_chat_form_a_fresh_tiny_model_cannot_take(capsys: pytest.CaptureFixture) -> None:
    from tba.cli import main as tba_main

    assert tba_main(["model", "sft", "--out", "/nonexistent/sft", "--chat-template", "on"]) == 2
    assert "--chat-template on needs a --base model with a chat template" in capsys.readouterr().err
