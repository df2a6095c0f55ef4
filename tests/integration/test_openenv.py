"""OpenEnv environments (tba/tasks/openenv.py) over real servers: the project's own (`tba envserver`, the
calculator served by OpenEnv's server framework) and one that misbehaves on purpose (tests/envs/faulty_openenv.py,
the protocol by hand). Turns are scripted; the real engine plays them in tests/integration/test_searcher_engine.py."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tba.health import free_port
from tba.local.commands import tba_command
from tba.model.episodes import run_episodes
from tba.model.tokenizer import build_tokenizer
from tba.tasks import Prompt, make_task

pytestmark = pytest.mark.slow
TOK = build_tokenizer()


def wait_ready(proc: subprocess.Popen, ready) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        if ready():
            return
        time.sleep(0.1)
    raise TimeoutError("the server did not come up within 60 s")


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def envserver() -> Iterator[str]:
    """``tba envserver``: the calculator as an OpenEnv server."""
    port = free_port()
    proc = subprocess.Popen(tba_command("envserver", task="calculator", port=port), stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(proc, lambda: _healthy(f"http://127.0.0.1:{port}"))
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=10)
    # Sessions the client closed leave no traceback behind (services/envserver/app.py, quiet_disconnects).
    assert "Traceback" not in stderr, stderr[-3000:]


def faulty(*args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "tests.envs.faulty_openenv", str(port), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc, f"http://127.0.0.1:{port}"


def calculator_turns(contexts: list[list[int]], n: int, budgets: list[int]):
    """A model that uses the calculator right: ``[a*b]``, then the sum of its answer and c."""
    out = []
    for ids in contexts:
        text = TOK.decode(ids, skip_special_tokens=True)
        product, addend = text.split("=")[0].split("+")
        reply = f"[{product}]" if text.endswith("=") else str(int(text.rsplit("]", 1)[1].rstrip(";")) + int(addend))
        tokens = TOK.encode(reply, add_special_tokens=False) + ([] if reply.endswith("]") else [TOK.eos_token_id])
        out.append([(tokens, -1.0, "stop")] * n)
    return out


def any_turn(contexts: list[list[int]], n: int, budgets: list[int]):
    return [[(TOK.encode("42", add_special_tokens=False), -1.0, "stop")] * n for _ in contexts]


def test_the_calculator_served_over_openenv_plays_as_the_calculator_does(envserver: str) -> None:
    task = make_task("openenv", {"url": envserver, "turn_stop": ["]"], "max_turns": 3, "max_episode_tokens": 48})
    held_out = task.eval_prompts(4)
    assert len(held_out) == 4 and all(p.text.endswith("=") and "*" in p.text for p in held_out)
    train = task.train_prompts(seed=0)
    prompts = [next(train) for _ in range(3)]
    assert not {p.text for p in prompts} & {p.text for p in held_out}
    ids = [TOK.encode(p.text) for p in prompts]
    groups = run_episodes(calculator_turns, task, TOK, prompts, ids, 2, 12, 48)
    for prompt, group in zip(prompts, groups, strict=True):
        for t in group:
            assert (t.failure, t.reward, t.turns) == (None, 1.0, 2)
            ((start, end),) = t.env_spans
            a, b = prompt.text.split("+")[0].split("*")
            assert TOK.decode(t.token_ids[start:end]) == f"{int(a) * int(b)};"  # the calculator's answer


def test_a_server_that_hangs_or_answers_garbage_ends_those_episodes_with_the_reason() -> None:
    proc, url = faulty()
    try:
        task = make_task("openenv", {"url": url, "timeout_s": 1.5})
        prompts = [Prompt(f"seed-{s}", f"prompt {s}", "") for s in range(4)]
        groups = run_episodes(any_turn, task, TOK, prompts, [TOK.encode(p.text) for p in prompts], 2, 8, 32)
    finally:
        proc.kill()
        proc.wait()
    done, hangs, garbage, wrong = groups
    assert all(t.failure is None and t.reward == 1.0 for t in done)
    assert all(t.failure_kind == "step" and "no answer within 1.5 s" in (t.failure or "") for t in hangs)
    assert all(t.failure_kind == "step" and "JSONDecodeError" in (t.failure or "") for t in garbage)
    assert all(t.failure_kind == "step" and "no string field 'text'" in (t.failure or "") for t in wrong)


def test_a_server_that_dies_ends_episodes_then_drawing_prompts_stops_naming_it(monkeypatch) -> None:
    import tba.tasks.openenv as openenv

    proc, url = faulty("die")
    try:
        task = make_task("openenv", {"url": url, "timeout_s": 2})
        prompts = [Prompt("seed-0", "prompt 0", "")]
        ((first, second),) = run_episodes(any_turn, task, TOK, prompts, [TOK.encode("prompt 0")], 2, 8, 32)
        proc.wait(10)
    finally:
        proc.kill()
        proc.wait()
    assert first.failure_kind == "step"  # the server died under it
    assert second.failure_kind in ("step", "start")  # the same, or it was already gone
    ((again,),) = run_episodes(any_turn, task, TOK, prompts, [TOK.encode("prompt 0")], 1, 8, 32)
    assert again.failure_kind == "start" and "ConnectionError" in (again.failure or "")
    monkeypatch.setattr(openenv, "RETRY_PAUSE_S", 0.01)
    with pytest.raises(RuntimeError, match=f"OpenEnv server {url}: reset.* failed 5 times in a row"):
        next(task.train_prompts(seed=0))


def test_bad_options_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="url must be"):
        make_task("openenv", {"url": "localhost:8000"})
    with pytest.raises(ValueError, match="timeout_s"):
        make_task("openenv", {"url": "http://x", "timeout_s": 0})
    with pytest.raises(ValueError, match="bad options for task 'openenv'"):
        make_task("openenv", {})


def test_envserver_takes_its_address_from_the_environment() -> None:
    """``tba envserver`` as its image runs it: TBA_HOST and TBA_PORT give the address, empty task options are
    none."""
    port = free_port()
    env = {**os.environ, "TBA_HOST": "127.0.0.1", "TBA_PORT": str(port)}
    proc = subprocess.Popen(tba_command("envserver", task_options=""), env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(proc, lambda: _healthy(f"http://127.0.0.1:{port}"))
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--port", "0"], {}, "--port / TBA_PORT must be in [1, 65535], got '0'"),
        ([], {"TBA_PORT": "http"}, "got 'http'"),
        (["--max-sessions", "0"], {}, "--max-sessions must be in [1, 100000], got 0"),
        (["--task-options", "[1]"], {}, "--task-options must be a JSON object"),
        (["--task-options", "{"], {}, "--task-options is not JSON"),
        (["--task", "arithmetic"], {}, "'arithmetic' is single-turn"),
    ],
)
def test_envserver_names_a_bad_value(argv: list[str], env: dict[str, str], message: str, monkeypatch) -> None:
    from services.envserver import cli

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    with pytest.raises(SystemExit, match=re.escape(message)):
        cli.main(parser.parse_args(argv))
