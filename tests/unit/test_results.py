"""The results are data: every page, docs/results/claims.json and README's results table match the committed
records (``python -m experiments.report --check``), a record an experiment writes is one the pages render, and
nothing under docs/results is named by a machine or a round or left without the data that makes it."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from experiments import records, report
from experiments.arms import Arm
from experiments.report import claims

RESULTS = records.RESULTS
CLAIM_FIELDS = {"claim", "task", "model", "budget", "seeds", "cpu_model", "commit", "headline", "page", "result"}
ORDINAL = re.compile(
    r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|teenth|twentieth|"
    r"twenty-|machine|round"
)


def test_every_page_and_the_readme_table_match_the_data() -> None:
    stale = report.stale()
    assert not stale, "stale against docs/results/data (run `python -m experiments.report`):\n" + "\n".join(stale)


def test_a_changed_figure_makes_its_page_stale(tmp_path: Path) -> None:
    data = tmp_path / "results" / "data"
    shutil.copytree(records.DATA, data)
    name, record = list(records.load("decoupling", data))[-1]
    record["pairs"][0]["time_ratio"]["0.6"]["mean"] = 0.123
    records.write("decoupling", name, record, data)
    pages = report.build(data)
    assert "0.12" in pages[tmp_path / "results" / "decoupling.md"]
    assert pages[tmp_path / "results" / "decoupling.md"] != (RESULTS / "decoupling.md").read_text()


def test_claims_carry_what_a_reader_needs_and_the_readme_shows_each() -> None:
    entries = json.loads((RESULTS / "claims.json").read_text())
    ids = [c["id"] for c in entries]
    assert {"decoupling", "diversity", "redteam", "demo"} <= set(ids)
    for c in entries:
        assert CLAIM_FIELDS <= set(c), (c["id"], CLAIM_FIELDS - set(c))
        assert (records.ROOT / c["page"]).exists(), c["page"]
    decoupling = entries[ids.index("decoupling")]
    for figures in decoupling["headline"]["ratios"].values():
        assert set(figures) == {"0.5", "0.6", "0.7"} and all(0 < v for v in figures.values())
    readme = report.README.read_text()
    block = readme.split(report.START, 1)[1].split(report.END, 1)[0]
    assert block.strip() == claims.table(entries, "docs/results/")
    assert all(f"({c['page']})" in block for c in entries)


def test_nothing_in_the_results_is_named_by_a_machine_or_a_round() -> None:
    names = [p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*") if p.is_file()]
    assert names and not [n for n in names if ORDINAL.search(n)]
    history = re.compile(rf"\b(?:{ORDINAL.pattern}) machine\b|\brounds?\b", re.I)
    said = [p.name for p in records.DATA.rglob("*.json") if history.search(p.read_text())]
    assert not said, f"records that tell a machine by its number or a round: {said}"


def test_every_results_file_is_generated_from_data() -> None:
    generated = set(report.build()) | set(report.plots())
    for path in RESULTS.iterdir():
        if path.is_file():
            assert path in generated, f"{path.name}: no data makes it"
    benchmarks = ("buffer-benchmark", "searcher-throughput", "lora-fsdp", "real-model-throughput", "docker-smoke")
    assert {RESULTS / f"{name}.md" for name in benchmarks} <= generated


def test_the_benchmark_pages_state_no_dates_and_no_history() -> None:
    """A benchmark page says what was measured and where: its dates are in the records, its history in git."""
    history = re.compile(r"\b20\d\d-\d\d-\d\d\b|\bsession|\brounds?\b|\bfixed\b|\bdefect|\bthe issue\b", re.I)
    pages = report.bench.render_all(report.load())
    assert pages
    for name, text in pages.items():
        assert not history.findall(text), (name, history.findall(text))


def test_the_cores_page_has_a_section_per_cpu_each_with_its_newest_record_first() -> None:
    """Cores compare only on one CPU: two CPUs' records are two current results, never one the other's past."""

    def rec(commit: str, flags: list[str], value: float) -> dict:
        figure = {"name": "stream add", "value": value, "unit": "GB/s", "baseline": 10.0, "ratio": value / 10}
        machine = {"cpu_model": "AMD EPYC", "cpu_flags": flags, "cores": 2}
        return {"commit": commit, "machine": machine, "figures": [figure], "command": "python -m benchmarks.run cores"}

    named = [
        ("a", rec("aaa", ["avx2", "avx512_bf16"], 7.0)),
        ("b", rec("bbb", ["avx2"], 9.0)),
        ("c", rec("ccc", ["avx2"], 9.5)),
    ]
    text = report.bench.render_all({"cores": named})["cores.md"]
    avx2 = text.index("## Current result: AMD EPYC (AVX2, no AVX-512)")
    bf16 = text.index("## Current result: AMD EPYC (AVX512-BF16)")
    assert avx2 < text.index("`ccc`") < text.index("### Earlier: b") < bf16 < text.index("`aaa`")


def test_the_gpu_page_is_rendered_from_its_record_once_there(tmp_path: Path, monkeypatch) -> None:
    data = tmp_path / "results" / "data"
    data.mkdir(parents=True)
    assert tmp_path / "results" / "gpu-trainer.md" not in report.build(data)
    (data / report.GPU_RECORD).write_text(json.dumps({"benchmark": "gpu-trainer"}))
    monkeypatch.setattr("benchmarks.gpu.render", lambda record: f"# page of {record['benchmark']}\n")
    assert report.build(data)[tmp_path / "results" / "gpu-trainer.md"] == "# page of gpu-trainer\n"


# --- what an experiment writes is what the pages read -------------------------------------------------------------


def fake_run(run_dir: Path, seed: int, mode: str, step_s: float, accuracies: list[float]) -> dict:
    """A finished run's files as ``tba up`` and experiments.arms leave them: the trainer's metrics, the timeline's
    last status, the summary."""
    run_dir.mkdir(parents=True)
    steps = [
        {"ts": 100.0 + 10 + i * step_s, "step": i + 1, "samples": 64, "step_s": 0.06, "wait_s": 0.01, "lr": 2e-5}
        | {"staleness_hist": {"0" if mode == "sync" else "2": 64}}
        | {"reward_mean": i / 40, "tokens": 60, "ref_s": 0.01, "forward_s": 0.02, "backward_s": 0.02}
        for i in range(40)
    ]
    (run_dir / "trainer_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    status = {
        "searchers": {
            "searcher-0": {"batches": 10, "generate_seconds": 1.0, "score_seconds": 0.1, "reload_seconds": 0.3}
            | {"reloads": 10}
        },
        "trainer": {"publish_s_mean": 0.02},
    }
    (run_dir / "timeline.jsonl").write_text(json.dumps(status) + "\n")
    evaluations = [{"t": 5.0 * i, "version": i, "accuracy": a} for i, a in enumerate(accuracies)]
    return {
        "seed": seed,
        "mode": mode,
        "evaluations": evaluations,
        "started_at": 100.0,
        "trainer_steps": 40,
        "buffer": {"samples_ingested": 2560, "samples_served": 2560},
        "cpu_busy": [0.98, 0.7],
    }


def test_a_decoupling_record_renders_as_the_claim_s_current_result(tmp_path: Path) -> None:
    from experiments.decoupling import arms, record

    out, data = tmp_path / "runs", tmp_path / "results" / "data"
    fast, slow = [0.3, 0.4, 0.55, 0.65, 0.75, 0.85], [0.3, 0.35, 0.4, 0.5, 0.55, 0.6, 0.65, 0.72, 0.81]
    arm_list: list[Arm] = arms("arithmetic")
    runs = {
        "async-tb": [fake_run(out / "async-tb" / f"seed-{s}", s, "async", 0.1, fast) for s in (0, 1)],
        "sync-tb": [fake_run(out / "sync-tb" / f"seed-{s}", s, "sync", 0.2, slow) for s in (0, 1)],
    }
    rec = record(arm_list, runs, "arithmetic", 5.0, out, "python -m experiments.decoupling --seeds 2 --minutes 5")
    assert rec["machine"]["cpu_model"] and rec["schema"] == records.SCHEMA
    run = rec["arms"]["async-tb"]["runs"][0]
    # 50% is first seen at 10 s, the trainer's first step came 10 s after the launch
    assert run["time_to"]["0.5"] == pytest.approx(0.0) and run["time_to"]["0.6"] == pytest.approx(5.0)
    assert rec["arms"]["sync-tb"]["runs"][0]["sync_cycle"]["cycle"] == pytest.approx(0.2)
    assert rec["pairs"][0]["time_ratio"]["0.7"]["mean"] == pytest.approx(10 / 25)
    assert rec["arms"]["async-tb"]["deviations"] == {} and rec["arms"]["sync-tb"]["deviations"] == {}
    name = records.record_name("arithmetic", 5.0, rec)
    assert not ORDINAL.search(name)
    records.write("decoupling", name, json.loads(json.dumps(rec)), data)
    page = report.build(data)[tmp_path / "results" / "decoupling.md"]
    assert "## Current result" in page and "**0.40**" in page and name in page


def test_a_demo_run_joins_the_demo_record_and_becomes_its_current_result(tmp_path: Path) -> None:
    from experiments import demo

    results = tmp_path / "results"
    shutil.copytree(records.DATA, results / "data")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    evaluations = [{"t": 30.0 * i, "version": i, "accuracy": a} for i, a in enumerate([0.345, 0.52, 0.8, 0.912])]
    (run_dir / "summary.json").write_text(
        json.dumps({"state": "complete", "evaluations": evaluations, "trainer_steps": 4321})
    )
    assert demo.main([str(run_dir), "--results", str(results)]) == 0
    record = json.loads((results / "data" / "demo" / "demo-runs.json").read_text())
    run = record["runs"][-1]
    assert run["time_to"] == {"0.5": 30.0, "0.9": 90.0} and run["deviations"] == {} and run["trainer_steps"] == 4321
    page = report.build(results / "data")[results / "demo.md"]
    assert "34.5% → **91.2%**, 50% at **30 s**, 4,321 trainer steps" in page


def test_the_decoupling_command_writes_its_record_where_it_is_told(tmp_path: Path, monkeypatch) -> None:
    """``python -m experiments.decoupling`` end to end, its runs faked: one record per budget, in --results."""
    from experiments import decoupling

    def runs(arm_list, seeds, minutes, out):
        curves = {"async": [0.3, 0.55, 0.65, 0.75], "sync": [0.3, 0.4, 0.5, 0.6, 0.7]}
        return {
            a.name: [fake_run(out / a.name / f"seed-{s}", s, a.mode, 0.1, curves[a.mode]) for s in range(seeds)]
            for a in arm_list
        }

    monkeypatch.setattr(decoupling, "run_interleaved", runs)
    results = tmp_path / "results"
    argv = ["--seeds", "2", "--minutes", "5", "--out", str(tmp_path / "runs"), "--results", str(results)]
    assert decoupling.main(argv) == 0
    (path,) = (results / "data" / "decoupling").glob("arithmetic-5min-*.json")
    record = json.loads(path.read_text())
    assert record["command"] == "python -m experiments.decoupling --seeds 2 --minutes 5"
    assert [len(a["runs"]) for a in record["arms"].values()] == [2, 2]
    assert "## Current result" in report.build(results / "data")[results / "decoupling.md"]


def test_the_real_model_command_records_each_run_as_it_ends_and_resumes(
    tmp_path: Path, monkeypatch, capsys: pytest.CaptureFixture
) -> None:
    """``python -m experiments.real_model`` end to end, its runs faked: times from the first step to +10/+20/+30
    points over the raw model, the async / sync and async / TRL ratios seed against seed, a record rewritten after
    every run that ``--resume`` continues without running again what it holds, and the page and README row."""
    from experiments import real_model
    from experiments.peer import recipe
    from experiments.report import real_model as real_model_page

    started: list[str] = []
    curves = {
        "async-tb-ahead": [0.125, 0.125, 0.125, 0.45, 0.5],  # every 5 s from launch; the first step at 9.9 s
        "sync-tb": [0.125, 0.2, 0.3, 0.35, 0.45],
        "trl-grpo": [0.125, 0.125, 0.3, 0.2, 0.5],
        "sync-tb-2-cores": [0.125, 0.2, 0.3, 0.35, 0.45],
    }
    cpus: dict[str, str | None] = {}
    ref_pass: dict[str, str | None] = {}

    task_options_seen: list = []

    def run_arm(arm, seed, minutes, out, eval_prompts):
        started.append(f"{arm.name}/{seed}")
        cpus[arm.name] = arm.trainer_cpus
        ref_pass[arm.name] = arm.env.get("TBA_REF_PASS")
        task_options_seen.append(arm.env.get("TBA_TASK_OPTIONS"))
        return fake_run(out / arm.name / f"seed-{seed}", seed, arm.mode, 0.1, curves[arm.name])

    def run_peer(seed, minutes, out, task_options=None):
        started.append(f"trl-grpo/{seed}")
        task_options_seen.append(task_options)
        evals = [{"t": 20.0 * i, "step": i, "accuracy": a} for i, a in enumerate(curves["trl-grpo"])]
        return {"seed": seed, "evaluations": evals, "steps": 4, "samples_trained": 256, "budget_s": minutes * 60}

    monkeypatch.setattr(real_model, "run_arm", run_arm)
    monkeypatch.setattr(real_model, "run_peer", run_peer)
    results = tmp_path / "results"
    argv = ["--seeds", "1", "--minutes", "20", "--out", str(tmp_path / "runs"), "--results", str(results)]
    assert real_model.main(argv) == 0
    assert started == ["async-tb-ahead/0", "trl-grpo/0", "sync-tb/0"]
    own = records.slug(recipe("real-model")["task_options"]["dataset"])  # the recipe's task names its record
    (path,) = (results / "data" / "real-model").glob(f"{own}-20min-*.json")
    record = json.loads(path.read_text())
    mine = record["arms"]["async-tb-ahead"]["runs"][0]
    # the trainer's first step began 10 s after the launch (its first row: 110 s - 0.06 s of step - 0.01 s of wait)
    assert mine["first_step_s"] == pytest.approx(9.9, abs=0.05)
    assert mine["time_to"] == {"+0.1": 5.1, "+0.2": 5.1, "+0.3": 5.1}  # 15 s - 9.9 s
    assert record["arms"]["sync-tb"]["runs"][0]["time_to"] == {"+0.1": 0.1, "+0.2": 5.1, "+0.3": 10.1}
    assert record["arms"]["trl-grpo"]["runs"][0]["time_to"] == {"+0.1": 40.0, "+0.2": 80.0, "+0.3": 80.0}
    assert record["arms"]["trl-grpo"]["runs"][0]["below_start"] == 0
    ratios = {tuple(p["arms"]): p["time_ratio"] for p in record["pairs"]}
    assert ratios[("async-tb-ahead", "trl-grpo")]["+0.3"]["mean"] == pytest.approx(5.1 / 80.0)
    assert ratios[("async-tb-ahead", "sync-tb")]["+0.3"]["mean"] == pytest.approx(5.1 / 10.1)
    page = report.build(results / "data")[results / "real-model.md"]
    assert "TRL GRPOTrainer" in page and "+30 points" in page and path.stem in page
    for date, config, greedy in [
        ("2026-01-01", {"min_terms": 2}, 0.1),
        ("2026-01-02", {"min_terms": 2}, 0.125),
        ("2026-01-03", {"min_terms": 3}, 0.02),
    ]:  # screened tasks: the newest of each
        forms = [{"form": "chat-lenient", "greedy": greedy, "pass_at_k": {"1": 0.1, "8": 0.5}}]
        screened = {
            **record,
            "experiment": "prompt-forms",
            "date": date,
            "samples": 8,
            "prompts": 48,
            "temperature": 1.0,
            "max_new_tokens": 32,
            "forms": forms,
            "task_options": {"dataset": "chain_sum", "config": config},
        }
        records.write("real-model", f"prompt-forms-{date}", screened, results / "data")
    page = report.build(results / "data")[results / "real-model.md"]
    screened_rows = [line for line in page.splitlines() if line.startswith("| `chain_sum`")]
    assert [row.split(" | ")[2] for row in screened_rows] == ["12.5%", "2.0%"], screened_rows
    assert "(min_terms 3)" in screened_rows[1] and "50.0% (k 8)" in screened_rows[0]
    verdicts = {row[0]: row[3] for row in real_model_page.targets(record)}
    assert verdicts["time to +30 points, async / TRL ≤ 0.5"] == "**met**"  # 5.1 s / 80 s
    assert verdicts["time to +30 points, async / on-policy ≤ 0.5, every seed < 1"] == "not met"  # 5.1 s / 10.1 s
    assert verdicts["accuracy at the end ≥ TRL's + 10 points"] == "not met"  # 50% both
    assert verdicts["never below the start for more than one evaluation"] == "**met**"
    floor = next(row for row in real_model_page.targets(record) if row[0].startswith("the ratio at equal steps"))
    cycles = [record["arms"][arm]["runs"][0]["step"]["cycle"] for arm in ("async-tb-ahead", "sync-tb")]
    assert floor[1] == f"{cycles[0] / cycles[1]:.2f}" and floor[3].startswith("0.5 ")
    row = next(
        c for c in json.loads(report.build(results / "data")[results / "claims.json"]) if c["id"] == "real-model"
    )
    assert row["model"].startswith("SmolLM2") and "async / TRL" in row["result"]

    started.clear()  # a second seed, continuing the record: the first seed's runs are not run again
    argv = ["--seeds", "2", "--minutes", "20", "--out", str(tmp_path / "runs2"), "--results", str(results)]
    assert real_model.main([*argv, "--resume", str(path)]) == 0
    assert started == ["async-tb-ahead/1", "trl-grpo/1", "sync-tb/1"]
    record = json.loads(path.read_text())
    assert [len(a["runs"]) for a in record["arms"].values()] == [2, 2, 2] and record["seeds"] == 2
    assert real_model_page.targets({**record, "seeds": 3})[0][3] == "met so far (2 of 3 seeds)"
    assert real_model.main([*argv, "--minutes", "10", "--resume", str(path)]) == 2  # another budget: refused
    longer = {**record, "minutes": 45.0}  # another budget on the same CPU: a section of its own beside this one
    written = records.write("real-model", path.stem.replace("20min", "45min"), longer, results / "data")
    page = report.build(results / "data")[results / "real-model.md"]
    budgets = sorted(line.rsplit(", ", 1)[1] for line in page.splitlines() if line.startswith("## `"))
    assert budgets == ["20 minutes", "45 minutes"]
    written.unlink()
    elsewhere = tmp_path / "elsewhere.json"  # a record measured on another CPU: refused, its runs would not compare
    elsewhere.write_text(json.dumps({**record, "machine": {**record["machine"], "cpu_model": "Another CPU"}}))
    assert real_model.main([*argv, "--resume", str(elsewhere)]) == 2
    assert "measured on" in capsys.readouterr().err
    assert task_options_seen == [None] * 6  # the profile's own task: nothing overridden

    # The on-policy loop with the trainer on both cores, run only when named: paired with the recipe like sync-tb,
    # with a ratio row and a target of its own.
    started.clear()
    assert real_model.main([*argv, "--only", "sync-tb-2-cores", "--resume", str(path)]) == 0
    assert started == ["sync-tb-2-cores/0", "sync-tb-2-cores/1"] and cpus == {**cpus, "sync-tb-2-cores": "0,1"}
    assert cpus["sync-tb"] == "1" and ref_pass["sync-tb-2-cores"] == "trainer"  # as sync-tb's placement gives it
    record = json.loads(path.read_text())
    ratios = {tuple(p["arms"]): p["time_ratio"] for p in record["pairs"]}
    assert ratios[("async-tb-ahead", "sync-tb-2-cores")]["+0.3"]["mean"] == pytest.approx(5.1 / 10.1)
    page = report.build(results / "data")[results / "real-model.md"]
    recipe_row = "| TBA, asynchronous, the searcher a batch ahead of the trainer (the recipe) / TBA, exactly on-policy"
    assert recipe_row + ", the trainer on both cores | 2 |" in page
    assert "`--only sync-tb-2-cores --resume`" in page
    verdicts = {row[0]: row[3] for row in real_model_page.targets(record)}
    assert verdicts["time to +30 points, async / on-policy (the trainer on both cores) ≤ 0.5, every seed < 1"] == (
        "not met"
    )
    assert real_model.main([*argv, "--only", "sync-tb-3-cores"]) == 2  # no such arm

    # The recipe with its searcher paced to a batch per version, and with it free, run only when named:
    # asynchronous, paired with each on-policy arm (and the free one with the recipe); the trainer's compute rates
    # by reward on the page; the balance targets judged for each.
    curves["async-tb-paced"] = curves["async-tb"] = curves["async-tb-ahead"]
    started.clear()
    modes: dict[str, tuple[str, str | None]] = {}
    real_run_arm = run_arm

    def run_paced(arm, seed, minutes, out, eval_prompts):
        modes[arm.name] = (arm.mode, arm.env.get("TBA_MAX_BATCHES_PER_VERSION") or arm.env.get("TBA_MAX_SAMPLES_AHEAD"))
        return real_run_arm(arm, seed, minutes, out, eval_prompts)

    monkeypatch.setattr(real_model, "run_arm", run_paced)
    assert real_model.main([*argv, "--only", "async-tb-paced,async-tb", "--resume", str(path)]) == 0
    assert started == ["async-tb-paced/0", "async-tb/0", "async-tb-paced/1", "async-tb/1"]
    assert modes == {"async-tb-paced": ("async", "1"), "async-tb": ("async", "off")}
    record = json.loads(path.read_text())
    pairs = [tuple(p["arms"]) for p in record["pairs"]]
    assert ("async-tb-paced", "sync-tb") in pairs and ("async-tb-paced", "sync-tb-2-cores") in pairs
    assert ("async-tb-paced", "trl-grpo") not in pairs and ("async-tb-ahead", "async-tb") in pairs
    for run in record["arms"]["async-tb"]["runs"]:
        run["time_split"] = {"trainer": {"busy_fraction": 0.95}}
    verdicts = {row[0]: row[3] for row in real_model_page.targets(record)}
    assert verdicts["TBA, asynchronous, the searcher free: trainer busy ≥ 90% of the wall"] == "**met**"
    rates = record["arms"]["async-tb-paced"]["runs"][0]["compute_rate"]
    assert rates == {  # 40 steps less the 10 of warm-up, by the batch's reward (step i: i / 40)
        "0.25 to 0.75": {"steps": 20, "tokens_per_s": 1200.0},
        "0.75 and above": {"steps": 10, "tokens_per_s": 1200.0},
    }
    page = report.build(results / "data")[results / "real-model.md"]
    assert (
        "| TBA, asynchronous, the searcher paced to a batch per version / TBA, exactly on-policy (sync) | 2 |" in page
    )
    assert "| TBA, exactly on-policy (sync) | 0 | 1,200 (20) | 1,200 (10) |" in page
    assert "`--only async-tb,async-tb-paced,sync-tb-2-cores --resume`" in page

    # Another task (--task-options): every arm runs on it, its record is kept apart, the page shows both tasks
    # with the recipe's first, and a record of one task does not resume on another.
    three = '{"dataset": "chain_sum", "config": {"min_terms": 3, "max_terms": 3}, "reader": "lenient"}'
    started.clear()
    task_options_seen.clear()
    argv = ["--seeds", "1", "--minutes", "20", "--out", str(tmp_path / "runs3"), "--results", str(results)]
    assert real_model.main([*argv, "--task-options", three, "--resume", str(path)]) == 2
    assert real_model.main([*argv, "--task-options", three]) == 0
    assert started == ["async-tb-ahead/0", "trl-grpo/0", "sync-tb/0"]
    assert [json.loads(t) if isinstance(t, str) else t for t in task_options_seen] == [json.loads(three)] * 3
    (other,) = [p for p in (results / "data" / "real-model").glob("chain-sum-*-20min-*.json") if p != path]
    assert json.loads(other.read_text())["task_options"] == json.loads(three)
    assert f"--task-options '{json.dumps(json.loads(three))}'" in json.loads(other.read_text())["command"]
    page = report.build(results / "data")[results / "real-model.md"]
    sections = [line for line in page.splitlines() if line.startswith("## `")]
    assert len(sections) == 2 and "the recipe's task, on " in sections[0] and "(min_terms 3" in sections[1]
    # The recipe's task on another CPU, without the peer: a section of its own (times on one CPU do not compare with
    # another's), after the record with more runs, which the README's row still reads.
    elsewhere = json.loads(path.read_text())
    elsewhere["machine"] = {**elsewhere["machine"], "cpu_model": "Another CPU"}
    elsewhere["arms"].pop("trl-grpo")
    elsewhere["pairs"] = [p for p in elsewhere["pairs"] if "trl-grpo" not in p["arms"]]
    (path.parent / "aiw-another-cpu.json").write_text(json.dumps(elsewhere))
    built = report.build(results / "data")
    sections = [line for line in built[results / "real-model.md"].splitlines() if line.startswith("## `")]
    assert len(sections) == 3 and "Another CPU" in sections[1] and "Another CPU" not in sections[0]
    claims = json.loads(built[results / "claims.json"])
    assert path.stem in next(c for c in claims if c["id"] == "real-model")["records"]
    (path.parent / "aiw-another-cpu.json").unlink()
    row = next(
        c for c in json.loads(report.build(results / "data")[results / "claims.json"]) if c["id"] == "real-model"
    )
    assert path.stem in row["records"]  # the README's row is the recipe's task
    for bad, message in [("{oops", "not JSON"), ('{"dataset": "chain_summ"}', "no dataset 'chain_summ'")]:
        capsys.readouterr()
        assert real_model.main([*argv, "--task-options", bad]) == 2 and message in capsys.readouterr().err
    kept = [p for p in (results / "data" / "real-model").glob("*.json") if not p.name.startswith("prompt-forms")]
    assert len(kept) == 2  # nothing more


def test_the_balance_target_counts_distinct_samples_trained_where_the_record_holds_them() -> None:
    """Distinct samples trained (the buffer's count of samples served at least once) against distinct samples
    stored: met at 80% or more; an older record without the count is judged by its draws against the stored."""
    from experiments.report.real_model import _balance_rows

    def rows(run: dict) -> list:
        return _balance_rows({"arms": {"async-tb-ahead": {"runs": [run]}}}, "async-tb-ahead", planned=1)

    run = {"samples_generated": 1000, "samples_stored": 600, "samples_trained": 1000, "samples_duplicate": 400}
    (row,) = rows({**run, "samples_trained_distinct": 540})
    assert row[3] == "**met**" and "90% of the distinct samples stored" in row[1] and "1.85×" in row[1]
    (row,) = rows({**run, "samples_trained_distinct": 420})
    assert row[3] == "not met" and "70%" in row[1]
    (row,) = rows(run)  # draws 1.67x the distinct stored
    assert row[3] == "not met" and "trained 1.67× the distinct stored" in row[1]
    assert rows({**run, "samples_stored": None}) == []
    busy, _ = rows({**run, "samples_trained_distinct": 540, "time_split": {"trainer": {"busy_fraction": 0.85}}})
    assert busy[0] == "trainer busy ≥ 90% of the wall" and busy[1:] == ["85% at the least", 1, "not met"]
    assert _balance_rows({"arms": {}}, "async-tb-ahead", planned=1) == []


def test_a_target_the_other_arm_never_reached_is_judged_by_a_bound() -> None:
    """Where the recipe reached +30 points and TRL never did, their ratio is below the recipe's time over TRL's
    last evaluation: that bound meets the target at or below 0.5 and decides nothing above it."""
    from experiments.report.real_model import targets

    def record(mine_s: float) -> dict:
        def run(t, last):
            return {"seed": 0, "time_to": {"+0.3": t}, "evaluations": [[0.0, 0.1], [last, 0.2]]}

        return {
            "seeds": 1,
            "gains": [0.3],
            "pairs": [],
            "arms": {"async-tb": {"runs": [run(mine_s, 1100.0)]}, "trl-grpo": {"runs": [run(None, 1000.0)]}},
        }

    rows = {row[0]: row for row in targets(record(100.0))}
    row = rows["time to +30 points, async / TRL ≤ 0.5"]
    assert row[3] == "**met**" and "below 0.10 in 1 seed where TRL never reached it" in row[1]
    row = {row[0]: row for row in targets(record(800.0))}["time to +30 points, async / TRL ≤ 0.5"]
    assert row[3] == "not decided by the bound" and "below 0.80" in row[1]
    assert {row[0]: row for row in targets(record(800.0))}[
        "time to +30 points, async / on-policy ≤ 0.5, every seed < 1"
    ][3] == "not measured"
