"""The whole system on a real pretrained model: ``tba up`` on SmolLM2-135M-Instruct at smoke scale.

Real redis-server, buffer, trainer and one searcher with the real vLLM CPU engine, on the packaged
model named on the command line (fetched and imported on first use): chat-template prompts, EOS
``<|im_end|>``, tied embeddings, grouped-query attention, 538 MB checkpoints. After the run, the
buffer is brought back up on the run's own Redis data and serves each reloaded version's samples
as the trainer would fetch them; those samples are checked against transformers:

- the behaviour log-probs (what vLLM computed while generating after an in-place reload) equal the
  trainer's computation on that checkpoint: the searcher generated with exactly the new weights;
- the reference log-probs equal the trainer's computation on the base model;
- the prompt ids are the chat template's, special tokens included, as the trainer scores them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

from tba.health import free_port
from tba.local.commands import tba_command

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.vllm]

STEPS = 3
MINUTES = 10.0
T = 0.7
TOKEN = "e2e-real-model-token"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, smollm2: Path) -> dict:
    run_dir = tmp_path_factory.mktemp("e2e-real") / "run"
    env = {
        **os.environ,
        "TBA_AUTH_TOKEN": TOKEN,
        "TBA_TEMPERATURE": str(T),
        "TBA_PROMPTS_PER_BATCH": "2",
        "TBA_COMPLETIONS_PER_PROMPT": "4",
        "TBA_PROMPTS_PER_STEP": "2",
        "TBA_TRAIN_SAMPLES_PER_PROMPT": "4",
        "TBA_MAX_NEW_TOKENS": "32",
        "TBA_MAX_MODEL_LEN": "256",
        "TBA_WARMUP_SAMPLES": "8",
        "TBA_CHECKPOINT_EVERY": "1",
        "TBA_KEEP_CHECKPOINTS": "10",
        "TBA_CHECKPOINT_GRACE_SECONDS": "600",
        "TBA_GENERATION_DTYPE": "float32",  # behaviour log-probs are compared with the float32 checkpoints'
        "TBA_LR": "1e-3",  # large for a smoke run: each version's log-probs move well past the kernels' noise
    }
    cmd = tba_command(
        "up",
        no_console=True,
        searchers=1,
        placement="shared",  # every process anywhere (tests/e2e/test_no_orphans.py runs the default)
        minutes=MINUTES,
        max_steps=STEPS,
        run_dir=run_dir,
        base_model="smollm2-135m-instruct",
        eval_every=86400,  # the bound: no evaluation until the final one
        eval_prompts=4,
    )
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=MINUTES * 60 + 300)
    assert proc.returncode == 0, f"tba up failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return {"dir": run_dir, "summary": json.loads((run_dir / "summary.json").read_text())}


@pytest.fixture(scope="module")
def served(run: dict, tmp_path_factory: pytest.TempPathFactory):
    """The run's Redis (from its append-only file) and a buffer on it, as a trainer would reach them."""
    from services.trainer.client import BufferClient
    from tba.redis_server import RedisServer

    redis_dir = run["dir"] / "redis"
    server = RedisServer(redis_dir)
    server.start()
    port = free_port()
    env = {
        **os.environ,
        "TBA_REDIS_URL": server.url,
        "TBA_NAMESPACE": "tba",
        "TBA_AUTH_TOKEN": TOKEN,
        "TBA_INGEST_ENABLED": "false",
        "TBA_PORT": str(port),
    }
    buffer = subprocess.Popen(tba_command("buffer"), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = BufferClient(f"http://127.0.0.1:{port}", auth_token=TOKEN, timeout=10)
    try:
        assert client.stats()["samples"] > 0  # retried until the buffer answers
        yield client
    finally:
        client.close()
        buffer.terminate()
        buffer.wait(30)
        server.stop()


def test_the_trainer_stepped_and_published_the_real_model(run: dict, smollm2: Path) -> None:
    summary = run["summary"]
    assert summary["trainer_steps"] == STEPS and summary["versions_published"] == list(range(1, STEPS + 1))
    from tba.checkpoints import CheckpointStore
    from tba.model.tokenizer import load_tokenizer

    store = CheckpointStore(run["dir"] / "checkpoints")
    latest = store.verify(store.read_manifest())
    config = json.loads((latest / "config.json").read_text())
    assert config["tie_word_embeddings"] and config["num_key_value_heads"] == 3
    assert load_tokenizer(latest).chat_template == load_tokenizer(smollm2).chat_template
    assert summary["accuracy_start"] is not None and summary["accuracy_end"] is not None


def test_the_searcher_reloaded_in_place(run: dict) -> None:
    versions = run["summary"]["searcher_versions"]["searcher-0"]
    assert 0 in versions and max(versions) > 0, versions
    log = (run["dir"] / "logs" / "searcher-0.log").read_text()
    assert re.search(r"reloaded v\d+ -> v\d+ in place", log), "no in-place reload in the searcher's log"
    assert log.count("vLLM engine up") == 1, "the engine was started more than once"


def test_samples_after_a_reload_carry_the_new_weights_and_the_base_reference(run: dict, served, smollm2: Path) -> None:
    from transformers import AutoModelForCausalLM

    from tba.model.logprobs import sequence_logprobs
    from tba.model.tokenizer import PromptFormat, load_tokenizer
    from tba.schemas import SampleRequest

    tok = load_tokenizer(smollm2)
    base = AutoModelForCausalLM.from_pretrained(str(smollm2), dtype=torch.float32).eval()
    reloaded = sorted(v for v in run["summary"]["searcher_versions"]["searcher-0"] if v > 0)
    checked = 0
    for version in reloaded:
        batch = served.sample(
            SampleRequest(
                num_prompts=1, samples_per_prompt=4, trainer_version=version, only_version=version, seed=version
            )
        )
        if batch is None:
            continue  # the run ended before this version's samples were ingested
        policy = AutoModelForCausalLM.from_pretrained(
            str(run["dir"] / "checkpoints" / f"step-{version:06d}"), dtype=torch.float32
        ).eval()
        for group in batch.groups:
            # The ids the trainer scores are the chat template's, special tokens included.
            assert group.prompt_ids == PromptFormat(chat=True).encode(tok, group.prompt_text)
            assert group.prompt_ids.count(1) == 3 and group.prompt_text.startswith("What is ")
            prompts = [group.prompt_ids] * len(group.samples)
            completions = [s.completion_ids for s in group.samples]
            with torch.no_grad():
                on_policy = sequence_logprobs(policy, prompts, completions, T, tok.pad_token_id)
                on_base = sequence_logprobs(base, prompts, completions, T, tok.pad_token_id)
            behaviour = torch.tensor([s.logprob_sum for s in group.samples])
            reference = torch.tensor([s.ref_logprob_sum for s in group.samples])
            # Generated with exactly the reloaded weights (tied output layer included), not the base's.
            torch.testing.assert_close(behaviour, on_policy, atol=5e-3, rtol=1e-4)
            assert ((on_policy - on_base).abs() > 0.1).all(), (on_policy, on_base)
            torch.testing.assert_close(reference, on_base, atol=2e-3, rtol=1e-4)
            checked += 1
    assert checked, f"no samples of a reloaded version ({reloaded}) came back from the buffer"


def test_no_error_lines_and_nothing_left_running(run: dict) -> None:
    pattern = re.compile(r"\b(ERROR|CRITICAL)\b|Traceback \(most recent call last\)")
    for log in (run["dir"] / "logs").glob("*.log"):
        bad = [line for line in log.read_text(errors="replace").splitlines() if pattern.search(line)]
        assert not bad, f"{log.name}: {bad[:5]}"
    from tba.process_tree import command_line

    needle = str(run["dir"])
    alive = [
        command_line(int(p.name))
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and needle in command_line(int(p.name)) and "redis" not in command_line(int(p.name))
    ]
    assert not alive, f"still running: {alive}"
