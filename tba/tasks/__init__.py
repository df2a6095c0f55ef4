"""Built-in tasks; importing this package registers them."""

from tba.tasks import arithmetic, countdown, gsm8k, redteam, reward_model, sums  # noqa: F401  (register the tasks)
from tba.tasks.base import Prompt, Task, make_task, task_class, task_names

__all__ = ["Prompt", "Task", "make_task", "task_class", "task_names"]
