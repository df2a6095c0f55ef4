"""The bare baseline of the learning comparison: synchronous TB in one process, no services.

Repeat: draw P prompts, generate K completions each with transformers from the current policy
(temperature T), score them with the task reward, compute log pi_ref on the frozen base, take one
Trajectory Balance step. The loss (``services.trainer.losses.tb_loss``), the log-prob definition
(``tba.model.logprobs``), the base model and the held-out evaluation are the system's own, so the
comparison with ``tba up`` measures only what the architecture changes.

    python -m experiments.plain_loop --minutes 10 --out runs/experiment/plain-tb
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="Wall-clock budget of the RL loop.")
    parser.add_argument("--task", default="arithmetic")
    parser.add_argument("--prompts", type=int, default=8, help="P: prompts per step.")
    parser.add_argument("--samples", type=int, default=8, help="K: completions per prompt.")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--beta", type=float, default=0.05)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="Torch threads (the whole machine by default).")
    parser.add_argument("--eval-every", type=float, default=30.0, help="Seconds between held-out evaluations.")
    parser.add_argument("--eval-prompts", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path("runs/experiment/plain-tb"))
    args = parser.parse_args(argv)

    import torch

    from services.trainer.losses import LossInput, tb_loss
    from tba.model.evaluation import greedy_accuracy, load_model
    from tba.model.generate import generate
    from tba.model.logprobs import sequence_logprobs
    from tba.model.sft import ensure_base_model
    from tba.model.tokenizer import encode_prompt
    from tba.tasks import make_task

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    task = make_task(args.task)
    base = ensure_base_model(task=args.task)
    policy, tokenizer = load_model(base)
    ref, _ = load_model(base)
    ref.eval().requires_grad_(False)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    held_out = task.eval_prompts(args.eval_prompts)
    stream = task.train_prompts(0)
    opt = torch.optim.AdamW(policy.parameters(), lr=args.lr)

    evaluations: list[dict] = []
    start = time.monotonic()

    def evaluate(step: int) -> None:
        acc = greedy_accuracy(policy, tokenizer, task, held_out, args.max_new_tokens)
        evaluations.append({"t": round(time.monotonic() - start, 1), "step": step, "accuracy": acc})
        print(f"plain-loop: {evaluations[-1]['t']:6.1f}s  step {step:4d}  held-out accuracy {acc:.1%}", flush=True)

    evaluate(0)
    step, next_eval = 0, args.eval_every
    deadline = start + 60 * args.minutes
    while time.monotonic() < deadline:
        prompts = [next(stream) for _ in range(args.prompts)]
        prompt_ids = [encode_prompt(tokenizer, p.text) for p in prompts for _ in range(args.samples)]
        completions = generate(
            policy,
            prompt_ids,
            max_new_tokens=args.max_new_tokens,
            eos_id=eos,
            pad_id=pad,
            temperature=args.temperature,
            seed=step,
        )
        texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
        rewards = [
            r for i, p in enumerate(prompts) for r in task.rewards(p, texts[i * args.samples : (i + 1) * args.samples])
        ]
        with torch.no_grad():
            log_ref = sequence_logprobs(ref, prompt_ids, completions, args.temperature, pad)
        policy.train()
        log_pi = sequence_logprobs(policy, prompt_ids, completions, args.temperature, pad)
        index = torch.arange(args.prompts).repeat_interleave(args.samples)
        out = tb_loss(
            LossInput(log_pi=log_pi, log_ref=log_ref, reward=torch.tensor(rewards), prompt_index=index), args.beta
        )
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
        step += 1
        if time.monotonic() - start >= next_eval:
            evaluate(step)
            next_eval += args.eval_every
    evaluate(step)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {
        "arm": "plain-loop",
        "task": args.task,
        "trainer_steps": step,
        "evaluations": evaluations,
        "accuracy_start": evaluations[0]["accuracy"],
        "accuracy_end": evaluations[-1]["accuracy"],
        "settings": {k: str(v) for k, v in vars(args).items()},
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
