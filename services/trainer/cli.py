"""`tba trainer`: the Trajectory Balance learner that publishes hot-reloadable checkpoints.

Settings come first (env ``TBA_*`` or flags, checked before anything heavy is
imported), then torch. SIGTERM and Ctrl-C finish the current step, publish a
checkpoint and exit 0. With ``TBA_TRAINER_PROCS`` above 1 the command replaces itself
with torchrun running it as that many ranks (services/trainer/distributed.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from tba.settings import TrainerSettings, add_settings_arguments, load_settings

HELP = "Run the trainer: sample batches from the buffer, train with the TB loss, publish checkpoints."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_arguments(parser, TrainerSettings)


def main(args: argparse.Namespace) -> int:
    settings = load_settings(TrainerSettings, args)
    if settings.trainer_procs > 1 and "WORLD_SIZE" not in os.environ:
        # N ranks on this host: the same command, N times under torchrun (it forwards our signals to them).
        from services.trainer.distributed import launcher

        command = [*launcher(settings.trainer_procs), "-m", "tba.cli", *sys.argv[1:]]
        os.execv(command[0], command)

    from tba.logs import setup_logging

    setup_logging(settings.log_level, settings.log_json)
    settings.write_resolved("trainer")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request: our retries log failures
    stop = threading.Event()

    def request_stop(signum, _frame) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    from services.trainer.loop import run_trainer

    return run_trainer(settings, stop)
