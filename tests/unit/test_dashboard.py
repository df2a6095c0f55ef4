"""The live console of ``tba up``: what a person sees for a given state of the system."""

from __future__ import annotations

from rich.console import Console

from tba.local.dashboard import Snapshot, one_line, rates, render, sparkline


def snapshot(t: float, step: int, ingested: int) -> Snapshot:
    return Snapshot(
        t=t,
        trainer={
            "state": "training",
            "step": step,
            "version": step,
            "loss": 0.4321,
            "reward_mean": 0.625,
            "kl": 0.0123,
            "lr": 3e-5,
            "staleness_mean": 2.5,
            "wait_s": 0.01,
        },
        buffer={
            "samples": 900,
            "prompts": 120,
            "samples_ingested": ingested,
            "samples_duplicate": ingested // 4,
            "reward_mean": 0.5,
            "dead_letters": 0,
        },
        searchers={
            "searcher-0": {"state": "running", "version": step - 6, "samples_per_s": 41.5, "reload_ms_last": 120.0},
            "searcher-1": {
                "state": "paused: waiting for a newer policy",
                "version": step,
                "samples_per_s": 38.0,
                "reload_ms_last": None,
            },
        },
        accuracy=[(0, 0.345), (40, 0.5), (80, 0.715)],
    )


def shown(snap: Snapshot, events: list[str], budget_s: float | None = 600) -> str:
    console = Console(record=True, width=120, color_system=None)
    console.print(render(snap, events, budget_s, title="TBA  arithmetic"))
    return console.export_text()


def test_rates_come_from_two_polls_and_skip_what_a_poll_missed():
    before, now = snapshot(10.0, 100, 1000), snapshot(12.0, 140, 1300)
    assert rates(before, now) == {"steps_per_s": 20.0, "ingest_per_s": 150.0}
    assert rates(None, now) == {}
    now.trainer = {"error": "ConnectError"}  # the trainer did not answer: no step rate, the buffer's stays
    assert rates(before, now) == {"ingest_per_s": 150.0}


def cell(text: str, label: str, column: int = 0) -> str:
    """What follows ``label`` in its row of the ``column``-th panel of a row of panels (0: left, 1: right)."""
    for line in text.splitlines():
        panels = [p.strip() for p in line.split("│") if p.strip()]
        if len(panels) > column and panels[column].startswith(label + " "):
            return panels[column][len(label) :].strip()
    raise AssertionError(f"no row {label!r} in panel {column}:\n{text}")


def test_every_part_of_the_system_has_its_panel_with_its_figures():
    snap = snapshot(125.0, 200, 4000)
    snap.rates = {"steps_per_s": 8.25, "ingest_per_s": 96.0}
    text = shown(snap, ["searcher-1 exited with 137", "restarting searcher-1 (restart 1)"])
    assert text.splitlines()[0] == "TBA  arithmetic  ·  125 s elapsed  ·  475 s left"
    trainer = {label: cell(text, label) for label in ("step", "loss", "reward", "KL", "lr", "staleness", "wait")}
    assert trainer == {
        "step": "200  v200  8.2 steps/s",
        "loss": "0.4321",
        "reward": "0.625",
        "KL": "0.0123",
        "lr": "3.00e-05",
        "staleness": "2.5 versions",
        "wait": "0.01 s",
    }
    buffer = {label: cell(text, label, 1) for label in ("samples", "ingest", "duplicates", "reward", "dead letters")}
    assert buffer == {
        "samples": "900 in 120 prompts",
        "ingest": "96.0 samples/s",
        "duplicates": "25%",  # 1000 of 4000 taken in
        "reward": "0.500",
        "dead letters": "0",
    }
    assert cell(text, "searcher-0").split() == ["running", "194", "6", "41.5", "120", "ms"]  # 6 versions behind
    assert cell(text, "searcher-1").split() == [
        "paused:",
        "waiting",
        "for",
        "a",
        "newer",
        "policy",
        "200",
        "0",
        "38.0",
        "-",
    ]
    assert cell(text, "now") == "71.5% at v80  (start 34.5% at v0, best 71.5%)"
    assert "restarts and warnings (2)" in text and cell(text, "restarting") == "searcher-1 (restart 1)"


def test_the_figures_follow_the_system():
    """The same panels for another state of the system show other figures: nothing above is fixed text."""
    snap = snapshot(300.0, 450, 9000)
    snap.trainer.update(loss=1.5, staleness_mean=0.0)
    snap.buffer.update(samples_duplicate=900)
    text = shown(snap, [], budget_s=None)
    assert cell(text, "step").startswith("450  v450") and cell(text, "loss") == "1.5"
    assert cell(text, "staleness") == "0.0 versions" and cell(text, "duplicates", 1) == "10%"
    assert cell(text, "busy") == "-"  # no step timed yet
    split = {"fetch": 1.0, "reference": 15.0, "forward": 21.0, "backward": 44.0, "publish": 13.0, "other": 6.0}
    snap.trainer["time"] = {"wall_s": 100.0, "seconds": split, "busy_fraction": 0.93}
    assert cell(shown(snap, [], budget_s=None), "busy") == "93%  backward 44%, forward 21%"
    assert cell(text, "searcher-0").split()[1:3] == ["444", "6"]
    assert "left" not in text.splitlines()[0]


def test_a_waiting_trainer_shows_why_and_its_reuse():
    snap = snapshot(125.0, 200, 4000)
    snap.trainer.update(state="waiting", waiting_for="reuse", reuse=0.987, wait_s=1.25)
    row = next(line for line in shown(snap, []).splitlines() if "wait" in line and " s" in line)
    assert "1.25 s  for reuse" in row
    assert "0.99 per sample generated" in shown(snap, [])


def test_a_system_still_starting_shows_dashes_not_errors():
    snap = Snapshot(t=3.0, trainer={"error": "ConnectError"}, buffer={"error": "HTTP 503"})
    text = shown(snap, [], budget_s=None)
    assert "ConnectError" in text and "error" in text and "waiting for the first evaluation" in text
    assert "left" not in text and "restarts and warnings" not in text


def test_sparkline_spans_the_range_and_keeps_the_newest_values():
    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert sparkline([2.0, -1.0]) == "█▁"  # clipped to [low, high]
    assert sparkline([0.0] * 30 + [1.0], width=4) == "▁▁▁█"


def test_one_line_for_logs():
    line = one_line(snapshot(42.0, 7, 10))
    assert line == (
        "[   42s] trainer step 7 v7 reward 0.625 | buffer 900 samples | acc 71.5% | searcher-0=v1,searcher-1=v7"
    )


def test_a_lagging_searcher_row_says_so_in_a_warning_style():
    snap = snapshot(75.0, 240, 5000)
    snap.searchers["searcher-1"].update(
        version=0, warning_kind="lagging", warning="serving v0, 240 versions behind", lag_over_bound_s=70.0
    )
    text = shown(snap, [])
    row = next(line for line in text.splitlines() if "searcher-1" in line)
    assert "lagging" in row and "240" in row  # the state says it, the lag column shows how far
    console = Console(record=True, width=120, color_system="truecolor", force_terminal=True)
    console.print(render(snap, [], 600, title="TBA"))
    styled = console.export_text(styles=True)
    lagging_row = next(line for line in styled.splitlines() if "searcher-1" in line)
    healthy_row = next(line for line in styled.splitlines() if "searcher-0" in line)
    assert "\x1b[1;31m" in lagging_row and "\x1b[1;31m" not in healthy_row  # bold red state
    assert "searcher-1=v0 (lagging!)" in one_line(snap)
