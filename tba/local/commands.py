"""``tba`` command lines for child processes: how ``tba up``, the experiments, the reliability suites and
the tests start the project's commands."""

from __future__ import annotations

import sys


def tba_command(*args: str, **flags: object) -> list[str]:
    """``tba ARGS --flag value ...`` as an argv run by this interpreter (``python -m tba.cli``): how the
    experiments, the reliability suite and the tests start the project's commands. A flag's name is its
    keyword with dashes for underscores; True passes it bare, None and False leave it out."""
    argv = [sys.executable, "-m", "tba.cli", *args]
    for name, value in flags.items():
        if value is None or value is False:
            continue
        argv.append("--" + name.replace("_", "-"))
        if value is not True:
            argv.append(str(value))
    return argv
