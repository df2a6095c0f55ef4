"""The TB loss and its baseline, checked against the formula, against REINFORCE, and for invariances."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from services.trainer.losses import BetaSchedule, LossInput, grpo_loss, make_loss, tb_loss


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models run fastest on one thread, and the CI cores are shared with other tests."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def random_input(num_prompts: int = 5, seed: int = 0, dtype=torch.float64) -> tuple[LossInput, list[str]]:
    """Samples of several prompts with uneven group sizes, interleaved in a random order."""
    g = torch.Generator().manual_seed(seed)
    sizes = [int(s) for s in torch.randint(2, 7, (num_prompts,), generator=g)]
    prompt_index = torch.tensor([p for p, n in enumerate(sizes) for _ in range(n)])
    prompt_index = prompt_index[torch.randperm(len(prompt_index), generator=g)]
    N = len(prompt_index)
    x = LossInput(
        log_pi=(-20 * torch.rand(N, generator=g, dtype=dtype)).requires_grad_(),
        log_ref=-20 * torch.rand(N, generator=g, dtype=dtype),
        reward=torch.rand(N, generator=g, dtype=dtype),
        prompt_index=prompt_index,
    )
    return x, [f"prompt-{int(i)}" for i in prompt_index]


def direct_tb(
    log_pi: list[float], log_ref: list[float], reward: list[float], prompt_ids: list[str], beta: float
) -> tuple[float, list[float]]:
    """docs/algorithm.md §2 written out with Python loops: the loss and dloss/dlog_pi_i (log Z held constant)."""
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(prompt_ids):
        groups.setdefault(p, []).append(i)
    N = len(prompt_ids)
    total, grad = 0.0, [0.0] * N
    for idx in groups.values():
        target = {i: log_ref[i] + reward[i] / beta for i in idx}
        log_Z = sum(target[i] - log_pi[i] for i in idx) / len(idx)
        for i in idx:
            total += (log_Z + log_pi[i] - target[i]) ** 2
            grad[i] = 2 * (log_Z + log_pi[i] - target[i]) / N
    return total / N, grad


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("beta", [0.014, 0.5, 3.0])
def test_tb_loss_equals_direct_formula(seed: int, beta: float) -> None:
    x, ids = random_input(seed=seed)
    out = tb_loss(x, beta)
    out.loss.backward()
    want_loss, want_grad = direct_tb(x.log_pi.tolist(), x.log_ref.tolist(), x.reward.tolist(), ids, beta)
    assert out.loss.item() == pytest.approx(want_loss, rel=1e-10)
    torch.testing.assert_close(x.log_pi.grad, torch.tensor(want_grad, dtype=torch.float64), rtol=1e-9, atol=1e-12)
    assert out.metrics["loss"] == pytest.approx(want_loss, rel=1e-10)


def test_tb_metrics_are_the_batch_means() -> None:
    x, _ = random_input(seed=3)
    beta = 0.1
    out = tb_loss(x, beta)
    kl = (x.log_pi.detach() - x.log_ref).mean().item()
    assert out.metrics["kl"] == pytest.approx(kl)
    assert out.metrics["reward_mean"] == pytest.approx(x.reward.mean().item())
    log_Z = {}
    for p in x.prompt_index.unique().tolist():
        m = x.prompt_index == p
        log_Z[p] = (x.log_ref[m] + x.reward[m] / beta - x.log_pi.detach()[m]).mean().item()
    want = sum(log_Z[int(p)] for p in x.prompt_index) / len(x.prompt_index)
    assert out.metrics["log_Z_mean"] == pytest.approx(want)


def test_mixed_prompts_counts_groups_whose_rewards_differ() -> None:
    reward = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5], dtype=torch.float64)
    index = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    x = LossInput(
        log_pi=torch.zeros(8, dtype=torch.float64),
        log_ref=torch.zeros(8, dtype=torch.float64),
        reward=reward,
        prompt_index=index,
    )
    for loss in (tb_loss, grpo_loss):
        assert loss(x, 0.1).metrics["mixed_prompts"] == 1.0  # only prompt 1 has both a 1 and a 0


def test_tb_loss_groups_by_prompt_not_by_position() -> None:
    """Shuffling samples across positions (indices moving with them) changes nothing; position grouping would."""
    x, _ = random_input(seed=4)
    out = tb_loss(x, 0.2)
    out.loss.backward()
    perm = torch.randperm(len(x.prompt_index), generator=torch.Generator().manual_seed(9))
    y = LossInput(
        x.log_pi.detach()[perm].clone().requires_grad_(), x.log_ref[perm], x.reward[perm], x.prompt_index[perm]
    )
    out_y = tb_loss(y, 0.2)
    out_y.loss.backward()
    assert out_y.loss.item() == pytest.approx(out.loss.item(), rel=1e-12)
    torch.testing.assert_close(y.log_pi.grad, x.log_pi.grad[perm])
    # The reference code's `.view(K, -1)` grouping by position gives another number on this layout,
    # so the test above would notice a loss that grouped by position.
    by_position = LossInput(x.log_pi.detach(), x.log_ref, x.reward, torch.arange(len(perm)) % 5)
    assert tb_loss(by_position, 0.2).loss.item() != pytest.approx(out.loss.item(), rel=1e-3)


def test_tb_loss_splits_into_micro_batches_of_whole_prompts() -> None:
    """With denom = N of the whole batch, per-prompt pieces add up to the whole loss (gradient accumulation)."""
    x, _ = random_input(seed=5)
    whole = tb_loss(x, 0.3).loss.item()
    parts = 0.0
    for p in x.prompt_index.unique():
        m = x.prompt_index == p
        part = LossInput(x.log_pi.detach()[m], x.log_ref[m], x.reward[m], torch.zeros(int(m.sum()), dtype=torch.long))
        parts += tb_loss(part, 0.3, denom=len(x.prompt_index)).loss.item()
    assert parts == pytest.approx(whole, rel=1e-12)


def test_tb_gradient_is_scaled_reinforce_on_the_kl_regularised_reward(tiny_model) -> None:
    """On samples the policy drew itself, grad L_TB = (2/beta) grad L_RF, exactly, for every parameter.

    Derivation (docs/algorithm.md §2). With log R_i = log ref_i + r_i/beta and log Z_g detached,
        grad L_TB = (2/N) sum_i (log Z_g + log pi_i - log R_i) grad log pi_i.
    Since log Z_g = mean_{j in g}(log R_j - log pi_j), the residual is
        (log pi_i - log R_i) - mean_j (log pi_j - log R_j)
        = (KL_i - mean KL) - (r_i - mean r)/beta = -A_i / beta,
    with KL_i = log pi_i - log ref_i and A_i = (r_i - mean r) - beta (KL_i - mean KL). Hence
        grad L_TB = -(2/(beta N)) sum_i A_i grad log pi_i = (2/beta) grad L_RF,
    where L_RF = -(1/N) sum_i sg(A_i) log pi_i is REINFORCE with a per-prompt mean baseline on the
    KL-regularised reward r - beta KL: a TB descent step is a REINFORCE ascent step with lr scaled by 2/beta.
    """
    from transformers import AutoModelForCausalLM

    from tba.model.logprobs import sequence_logprobs

    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    with torch.no_grad():  # move the policy away from the reference so that KL_i != 0
        for p in policy.parameters():
            p.add_(0.02 * torch.randn_like(p))
    T, K, beta, pad = 0.7, 4, 0.1, 0
    prompts = [[1, 20, 17, 30], [1, 22, 15], [1, 25, 25, 16, 40]]
    prompt_rows, completions, index = [], [], []
    for g, prompt in enumerate(prompts):
        out = policy.generate(
            torch.tensor([prompt]),
            do_sample=True,
            temperature=T,
            top_k=0,
            top_p=1.0,
            max_new_tokens=5,
            min_new_tokens=5,
            num_return_sequences=K,
            pad_token_id=pad,
        )
        for seq in out[:, len(prompt) :].tolist():
            prompt_rows.append(prompt)
            completions.append(seq)
            index.append(g)
    with torch.no_grad():
        log_ref = sequence_logprobs(reference, prompt_rows, completions, T, pad)
    reward = torch.tensor([float(sum(c) % 3) for c in completions])
    prompt_index = torch.tensor(index)

    def grads(loss_of) -> torch.Tensor:
        policy.zero_grad()
        log_pi = sequence_logprobs(policy, prompt_rows, completions, T, pad)
        loss_of(log_pi).backward()
        return torch.cat([p.grad.flatten() for p in policy.parameters()])

    g_tb = grads(lambda lp: tb_loss(LossInput(lp, log_ref, reward, prompt_index), beta).loss)

    def reinforce(log_pi: torch.Tensor) -> torch.Tensor:
        kl = log_pi.detach() - log_ref
        A = torch.zeros_like(kl)
        for g in range(len(prompts)):
            m = prompt_index == g
            A[m] = (reward[m] - reward[m].mean()) - beta * (kl[m] - kl[m].mean())
        return -(A * log_pi).mean()

    g_rf = grads(reinforce)
    assert g_rf.norm() > 0
    torch.testing.assert_close(g_tb, (2 / beta) * g_rf, rtol=1e-4, atol=1e-6 * g_tb.abs().max().item())


@pytest.mark.parametrize("K", [2, 3])
def test_tb_expected_gradient_is_the_kl_regularised_policy_gradient(K: int) -> None:
    """Exact expectation over every on-policy draw of K samples from a 3-armed softmax policy.

    E[grad L_TB] = -(2/beta) (1 - 1/K) grad J, with J(theta) = E_pi[r] - beta KL(pi || pi_ref):
    the per-prompt mean includes sample i itself, which scales the REINFORCE estimate by (K-1)/K.
    """
    beta = 0.3
    r = torch.tensor([1.0, 0.2, -0.5], dtype=torch.float64)
    log_ref = torch.log(torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64))
    theta = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64, requires_grad=True)
    log_probs = torch.log_softmax(theta, 0)
    J = (log_probs.exp() * (r - beta * (log_probs - log_ref))).sum()
    (grad_J,) = torch.autograd.grad(J, theta)

    expected = torch.zeros(3, dtype=torch.float64)
    for ys in itertools.product(range(3), repeat=K):
        lp = torch.log_softmax(theta, 0)
        log_pi = lp[list(ys)]
        x = LossInput(log_pi, log_ref[list(ys)], r[list(ys)], torch.zeros(K, dtype=torch.long))
        (g,) = torch.autograd.grad(tb_loss(x, beta).loss, theta)
        expected += math.prod(lp[y].exp().item() for y in ys) * g
    torch.testing.assert_close(expected, -(2 / beta) * (1 - 1 / K) * grad_J, rtol=1e-10, atol=1e-12)


def direct_grpo(log_pi, log_ref, reward, prompt_ids, beta, eps=1e-4):
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(prompt_ids):
        groups.setdefault(p, []).append(i)
    N = len(prompt_ids)
    total, A = 0.0, [0.0] * N
    for idx in groups.values():
        u = {i: reward[i] - beta * (log_pi[i] - log_ref[i]) for i in idx}
        mean = sum(u.values()) / len(idx)
        std = math.sqrt(sum((v - mean) ** 2 for v in u.values()) / len(idx))
        for i in idx:
            A[i] = (u[i] - mean) / (std + eps)
            total += -A[i] * log_pi[i]
    return total / N, A


def test_grpo_loss_equals_direct_formula_and_advantages_centre_per_prompt() -> None:
    x, ids = random_input(seed=6)
    out = grpo_loss(x, 0.05)
    out.loss.backward()
    want, A = direct_grpo(x.log_pi.tolist(), x.log_ref.tolist(), x.reward.tolist(), ids, 0.05)
    assert out.loss.item() == pytest.approx(want, rel=1e-10)
    torch.testing.assert_close(x.log_pi.grad, -torch.tensor(A, dtype=torch.float64) / len(ids))
    for p in set(ids):
        assert sum(a for a, q in zip(A, ids, strict=True) if q == p) == pytest.approx(0.0, abs=1e-9)


def test_grpo_without_std_scaling_is_tb_up_to_beta_over_two() -> None:
    x, _ = random_input(seed=7)
    beta = 0.25
    tb_loss(x, beta).loss.backward()
    g_tb = x.log_pi.grad.clone()
    x.log_pi.grad = None
    grpo_loss(x, beta, scale_by_std=False).loss.backward()
    torch.testing.assert_close(x.log_pi.grad, (beta / 2) * g_tb)


def test_make_loss_names() -> None:
    assert make_loss("tb") is tb_loss and make_loss("grpo") is grpo_loss
    with pytest.raises(ValueError, match="unknown loss 'ppo'"):
        make_loss("ppo")
    with pytest.raises(ValueError, match="importance weights apply to the TB loss, not 'grpo'"):
        make_loss("grpo", importance_clip=0.2)


def with_behaviour(x: LossInput, log_behaviour: torch.Tensor) -> LossInput:
    return LossInput(x.log_pi.detach().clone().requires_grad_(), x.log_ref, x.reward, x.prompt_index, log_behaviour)


def direct_weighted_tb(x: LossInput, beta: float, eps: float) -> tuple[float, list[float]]:
    """The importance-weighted loss written out with loops: w_i = clip(exp(log_pi_i - log_mu_i), 1-eps, 1+eps),
    log Z the w-weighted mean of the targets, loss = sum_i w_i residual_i^2 / N; and dloss/dlog_pi_i."""
    log_pi, log_mu = x.log_pi.tolist(), x.log_behaviour.tolist()
    target = [r + q / beta for r, q in zip(x.log_ref.tolist(), x.reward.tolist(), strict=True)]
    w = [min(max(math.exp(a - b), 1 - eps), 1 + eps) for a, b in zip(log_pi, log_mu, strict=True)]
    N, total, grad = len(log_pi), 0.0, [0.0] * len(log_pi)
    for p in set(x.prompt_index.tolist()):
        idx = [i for i, q in enumerate(x.prompt_index.tolist()) if q == p]
        log_Z = sum(w[i] * (target[i] - log_pi[i]) for i in idx) / sum(w[i] for i in idx)
        for i in idx:
            total += w[i] * (log_Z + log_pi[i] - target[i]) ** 2
            grad[i] = 2 * w[i] * (log_Z + log_pi[i] - target[i]) / N
    return total / N, grad


@pytest.mark.parametrize("seed", [0, 1])
def test_importance_weighted_tb_equals_direct_formula_and_reports_its_weights(seed: int) -> None:
    x, _ = random_input(seed=seed)
    g = torch.Generator().manual_seed(seed + 10)
    # Behaviour log-probs within +-0.5 of the policy's: some ratios inside [0.8, 1.2], some clipped either side.
    log_mu = x.log_pi.detach() + (torch.rand(len(x.reward), generator=g, dtype=torch.float64) - 0.5)
    y = with_behaviour(x, log_mu)
    out = tb_loss(y, 0.1, importance_clip=0.2)
    out.loss.backward()
    want_loss, want_grad = direct_weighted_tb(y, 0.1, 0.2)
    assert out.loss.item() == pytest.approx(want_loss, rel=1e-10)
    torch.testing.assert_close(y.log_pi.grad, torch.tensor(want_grad, dtype=torch.float64), rtol=1e-9, atol=1e-12)
    ratio = (x.log_pi.detach() - log_mu).exp()
    assert out.metrics["importance_weight_mean"] == pytest.approx(ratio.clamp(0.8, 1.2).mean().item())
    clipped = ((ratio < 0.8) | (ratio > 1.2)).double().mean().item()
    assert 0 < clipped < 1 and out.metrics["importance_clipped"] == pytest.approx(clipped)
    assert out.metrics["behaviour_log_ratio_abs"] == pytest.approx((x.log_pi.detach() - log_mu).abs().mean().item())
    # make_loss binds the clip: the trainer's loss function is this one.
    assert make_loss("tb", 0.2)(y, 0.1, None).loss.item() == pytest.approx(want_loss, rel=1e-10)


def test_importance_weights_of_fresh_samples_leave_the_loss_unchanged() -> None:
    """On-policy samples (mu = pi_theta) weigh 1 each: the weighted loss is plain TB, and so is its gradient;
    a stale batch gets another loss."""
    x, _ = random_input(seed=6)
    plain = tb_loss(x, 0.2)
    plain.loss.backward()
    fresh = with_behaviour(x, x.log_pi.detach().clone())
    weighted = tb_loss(fresh, 0.2, importance_clip=0.2)
    weighted.loss.backward()
    assert weighted.loss.item() == pytest.approx(plain.loss.item(), rel=1e-12)
    torch.testing.assert_close(fresh.log_pi.grad, x.log_pi.grad)
    assert weighted.metrics["importance_clipped"] == 0.0 and weighted.metrics["behaviour_log_ratio_abs"] == 0.0
    stale = with_behaviour(x, x.log_pi.detach() - 0.1)  # every sample likelier now than when it was drawn
    assert tb_loss(stale, 0.2, importance_clip=0.2).loss.item() == pytest.approx(
        math.exp(0.1) * plain.loss.item(), rel=1e-9
    )  # a common weight scales every squared residual and leaves log Z where it was


def test_importance_weights_need_the_behaviour_log_probs() -> None:
    x, _ = random_input(seed=7)
    with pytest.raises(ValueError, match="behaviour policy's log-probs"):
        tb_loss(x, 0.2, importance_clip=0.2)


def test_beta_schedule_values() -> None:
    """GSM8K's 0.014 -> 0.004 over 500 steps: beta(u) = b0 + (b1 - b0) min(1, (u-1)/T)."""
    s = BetaSchedule(0.014, 0.004, 500)
    assert s(1) == pytest.approx(0.014)
    assert s(2) == pytest.approx(0.014 - 0.01 / 500)
    assert s(251) == pytest.approx(0.009)
    assert s(501) == pytest.approx(0.004)
    assert s(10_000) == pytest.approx(0.004)
    values = [s(u) for u in range(1, 600)]
    assert all(a >= b for a, b in itertools.pairwise(values))
    assert BetaSchedule(0.05, 0.05, 0)(random.randint(1, 10**6)) == 0.05
    with pytest.raises(ValueError, match="from 1"):
        s(0)
