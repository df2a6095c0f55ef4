"""Start-up checks that turn a misconfiguration into one clear line instead of a vLLM traceback.

Everything here runs before vLLM is imported, so a wrong ``TBA_MODEL`` or
``TBA_TASK`` fails in a second, not after a 30-second engine start. Each
message names the variable and the flag to fix.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from tba.settings import SearcherSettings
from tba.tasks import MultiTurnTask, Task, make_task, task_class

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")


class StartupError(RuntimeError):
    """A setting the searcher cannot start with; the message names it."""


def check_task(settings: SearcherSettings) -> Task:
    try:
        task_class(settings.task)
    except ValueError as err:
        raise StartupError(f"TBA_TASK / --task: {err}") from None
    try:
        return make_task(settings.task, settings.task_options)
    except (ValueError, TypeError) as err:
        raise StartupError(
            f"TBA_TASK_OPTIONS / --task-options: bad options for task {settings.task!r}: {err}"
        ) from None


def check_lengths(settings: SearcherSettings) -> None:
    if settings.max_new_tokens >= settings.max_model_len:
        raise StartupError(
            f"TBA_MAX_NEW_TOKENS / --max-new-tokens: {settings.max_new_tokens} leaves no room for a prompt "
            f"within TBA_MAX_MODEL_LEN / --max-model-len = {settings.max_model_len}"
        )


def check_model_dir(path: Path, where: str = "TBA_MODEL / --model"):
    """A Hugging Face model directory: config.json that parses, weights, and a loadable config and tokenizer.

    Returns the tokenizer."""
    if not path.exists():
        raise StartupError(f"{where}: model directory {path} does not exist")
    if not path.is_dir():
        raise StartupError(f"{where}: {path} is not a directory")
    config = path / "config.json"
    if not config.is_file():
        raise StartupError(f"{where}: {path} is not a Hugging Face model directory (no config.json)")
    try:
        json.loads(config.read_text())
    except (ValueError, OSError) as err:
        raise StartupError(f"{where}: {config} is not valid JSON ({err})") from None
    if not any(next(path.glob(p), None) for p in WEIGHT_PATTERNS):
        raise StartupError(f"{where}: no weights in {path} (expected *.safetensors)")
    try:
        from transformers import AutoConfig

        from tba.model.tokenizer import load_tokenizer

        AutoConfig.from_pretrained(str(path))
        tokenizer = load_tokenizer(path)
    except Exception as err:  # transformers raises many types; all mean "cannot load this directory"
        first_line = (str(err).splitlines() or [""])[0]
        raise StartupError(f"{where}: cannot load the model in {path}: {type(err).__name__}: {first_line}") from None
    if tokenizer.eos_token_id is None:
        raise StartupError(f"{where}: the tokenizer in {path} has no EOS token, so no completion could end")
    return tokenizer


def check_chat(settings: SearcherSettings, tokenizer) -> bool:
    """Whether the task speaks in chat form with this model (TBA_CHAT_TEMPLATE)."""
    from tba.model.tokenizer import uses_chat

    try:
        return uses_chat(tokenizer, settings.chat_template)
    except ValueError:
        raise StartupError(
            f"TBA_CHAT_TEMPLATE / --chat-template: 'on', but the tokenizer in {settings.model} has "
            "no chat template (use auto or off)"
        ) from None


PROMPTS_CHECKED = 64  # the first prompts of the task's stream whose length check_prompt_lengths reads


def completion_budget(settings: SearcherSettings, task: Task) -> int:
    """The tokens a completion may take after its prompt: a turn's (``max_new_tokens``), or a multi-turn
    task's whole episode (its turns and the environment's answers)."""
    return task.max_episode_tokens if isinstance(task, MultiTurnTask) else settings.max_new_tokens


def check_prompt_lengths(settings: SearcherSettings, task: Task, tokenizer) -> None:
    """Refuse a task none of whose prompts fits: a searcher would skip every prompt and loop forever while
    ready. Some prompts too long is fine (each is skipped, counted and logged)."""
    from tba.model.tokenizer import PromptFormat

    budget = completion_budget(settings, task)
    limit = settings.max_model_len - budget
    form = PromptFormat(chat=task.chat, system_prompt=settings.system_prompt)
    prompts = itertools.islice(task.train_prompts(0), PROMPTS_CHECKED)
    lengths = [len(form.encode(tokenizer, p.text)) for p in prompts]
    if lengths and min(lengths) > limit:
        raise StartupError(
            f"TBA_MAX_MODEL_LEN / --max-model-len: none of the first {len(lengths)} prompts of task "
            f"{settings.task!r} fits: the shortest is {min(lengths)} tokens, and max_model_len "
            f"{settings.max_model_len} - the completion's {budget} tokens leaves {limit}"
        )


def check_all(settings: SearcherSettings) -> Task:
    """Every check, cheapest first; returns the task, in chat form where the model speaks it."""
    task = check_task(settings)
    check_lengths(settings)
    tokenizer = check_model_dir(Path(settings.model))
    task.chat = check_chat(settings, tokenizer)  # as make_task(..., chat=) sets it
    check_prompt_lengths(settings, task, tokenizer)
    return task
