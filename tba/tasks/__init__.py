"""Built-in tasks; importing this package registers them."""

from tba.tasks import (  # noqa: F401  (register the tasks)
    arithmetic,
    calculator,
    countdown,
    gsm8k,
    openenv,
    reasoning_gym,
    redteam,
    reward_model,
    sums,
    verifiers_env,
)
from tba.tasks.base import MultiTurnTask, Prompt, Step, Task, make_task, task_class, task_names

__all__ = ["MultiTurnTask", "Prompt", "Step", "Task", "make_task", "task_class", "task_names"]
