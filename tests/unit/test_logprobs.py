"""The two computations of log pi(y|x): the trainer's padded rows and the searcher's prefix trees agree."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tba.model.logprobs import (
    PrefixTree,
    sequence_logprobs,
    shared_prefix_logprobs,
    shared_prefix_logprobs_chunked,
    tree_batch,
)
from tba.model.tiny import TinyModelSpec, init_model

T = 0.7
SMALL = TinyModelSpec(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=256)


def gqa_tied_model(attention: str):
    """What real models bring that the tiny one lacks: grouped-query attention (4 heads sharing 2 KV heads) and
    an output layer tied to the embeddings, as SmolLM2, Llama 3.2 and Qwen 2.5 small models have."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(5)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        attn_implementation=attention,
    )
    model = LlamaForCausalLM(config).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return model


@pytest.fixture(
    scope="module",
    params=[("sdpa", "mha"), ("eager", "mha"), ("sdpa", "gqa-tied"), ("eager", "gqa-tied")],
    ids="-".join,
)
def model(request, tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoModelForCausalLM

    attention, arch = request.param
    if arch == "gqa-tied":
        return gqa_tied_model(attention)
    path = init_model(tmp_path_factory.mktemp("small") / "m", SMALL, seed=3)
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation=attention).eval()


def test_a_tree_holds_the_prompt_once_and_each_distinct_prefix_once() -> None:
    tree = PrefixTree.build([1, 5, 6], {0: [7, 8], 1: [7, 9, 2], 2: [7, 8], 3: [4]})
    assert tree.tokens == [1, 5, 6, 7, 8, 9, 2, 4]  # 7 is shared by three completions, [7, 8] by two
    assert tree.positions == [0, 1, 2, 3, 4, 4, 5, 3]  # a node sits where its token sits in its sequence
    assert tree.parents == [-1, -1, -1, 2, 3, 3, 5, 2]  # the token whose logits predict it
    assert tree.paths == {0: [3, 4], 1: [3, 5, 6], 2: [3, 4], 3: [7]}
    ids, positions, mask = tree_batch([tree, PrefixTree.build([2], {4: [3]})], pad_id=0)
    assert ids.tolist() == [tree.tokens, [2, 3, 0, 0, 0, 0, 0, 0]] and positions[0].tolist() == tree.positions
    visible = [row.nonzero().flatten().tolist() for row in mask[0, 0]]
    assert visible[1] == [0, 1] and visible[6] == [0, 1, 2, 3, 5, 6] and visible[7] == [0, 1, 2, 7]
    assert visible[4] == [0, 1, 2, 3, 4] and visible[5] == [0, 1, 2, 3, 5]  # siblings do not see each other
    assert [row.nonzero().flatten().tolist() for row in mask[1, 0]] == [[0], [0, 1], [2], [3], [4], [5], [6], [7]]
    additive = tree_batch([tree], pad_id=0, additive=torch.float32)[2]
    assert ((additive == 0) == mask[:1]).all() and additive.min() == torch.finfo(torch.float32).min
    with pytest.raises(ValueError, match="at least one token"):
        PrefixTree.build([], {0: [1]})


pairs = st.lists(
    st.tuples(st.integers(0, 3), st.lists(st.integers(3, 12), min_size=1, max_size=6)),
    min_size=1,
    max_size=24,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pairs, st.sampled_from([64, 16384]))
def test_shared_prefix_sums_equal_the_trainers(model, drawn, budget: int) -> None:
    # A few prompts of different lengths, completions that share beginnings or repeat: the searcher's case.
    prompt_bank = [[1, 4], [1, 5, 6, 7, 8], [1, 9, 9, 9, 10, 11, 3], [1]]
    prompts = [prompt_bank[p] for p, _ in drawn]
    completions = [c for _, c in drawn]
    with torch.no_grad():
        expected = sequence_logprobs(model, prompts, completions, T, pad_id=0)
        got = shared_prefix_logprobs_chunked(model, prompts, completions, T, pad_id=0, token_budget=budget)
    torch.testing.assert_close(torch.tensor(got, dtype=expected.dtype), expected, atol=1e-4, rtol=1e-5)


def test_gradients_through_the_trees_equal_the_padded_rows(model) -> None:
    prompts = [[1, 4], [1, 4], [1, 4], [1, 5, 6, 7, 8], [1, 5, 6, 7, 8]]
    completions = [[3, 4, 5], [3, 4], [9], [3, 4, 5, 6], [7]]
    weights = torch.tensor([0.3, -1.0, 2.0, 0.5, -0.7])  # any loss that is linear in the sums

    def grads(fn) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        (fn(model, prompts, completions, T, 0) * weights).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    for tree, rows in zip(grads(shared_prefix_logprobs), grads(sequence_logprobs), strict=True):
        torch.testing.assert_close(tree, rows, atol=1e-5, rtol=1e-4)


def test_long_prompts_and_completions(model) -> None:
    # Chat prompts of hundreds of tokens and completions of up to 256 that share their first tokens.
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 60, (n,), generator=gen).tolist() for n in (300, 300, 300, 120)]
    stem = torch.randint(3, 60, (200,), generator=gen).tolist()
    completions = [
        stem + torch.randint(3, 60, (56,), generator=gen).tolist(),
        stem[:150],
        stem + [4],
        torch.randint(3, 60, (256,), generator=gen).tolist(),
    ]
    with torch.no_grad():
        expected = sequence_logprobs(model, prompts, completions, T, pad_id=0)
        got = shared_prefix_logprobs(model, prompts, completions, T, pad_id=0)
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=1e-5)


def test_a_model_whose_attention_ignores_custom_masks_is_refused(tmp_path: Path) -> None:
    from services.searcher.reference import Reference
    from tba.settings import SearcherSettings

    path = init_model(tmp_path / "m", SMALL, seed=0)
    config = path / "config.json"
    config.write_text(
        config.read_text().replace('"model_type"', '"attn_implementation": "flex_attention", "model_type"', 1)
    )
    with pytest.raises(ValueError, match="needs attention that takes a 4D mask"):
        Reference(SearcherSettings(model=path), pad_id=0)


def by_hand(model, prompts, completions, scored) -> torch.Tensor:
    """Multi-turn sums written out: one forward pass per sequence, log softmax(logits / T) of each token the
    model generated, the environment's tokens skipped."""
    out = []
    for p, c, flags in zip(prompts, completions, scored, strict=True):
        logp = torch.log_softmax(model(input_ids=torch.tensor([p + c])).logits[0].float() / T, dim=-1)
        out.append(sum((logp[len(p) + j - 1, tok] for j, tok in enumerate(c) if flags[j]), torch.tensor(0.0)))
    return torch.stack(out)


# Two-turn trajectories (model, environment, model) next to single-turn ones: the first three share their
# first four tokens, which the environment wrote in the first two (positions 2-3) and the model in the third.
MULTI_TURN_PROMPTS = [[1, 4], [1, 4], [1, 4], [1, 4], [1, 5, 6, 7, 8], [1, 5, 6, 7, 8]]
MULTI_TURN = [[3, 4, 9, 9, 5, 2], [3, 4, 9, 9, 6], [3, 4, 9, 9, 5, 2], [3, 7], [3, 4, 5, 6], [10, 11, 12]]
SCORED = [
    [True, True, False, False, True, True],
    [True, True, False, False, True],
    [True] * 6,
    [True, True],
    [True, False, False, True],
    [True, False, True],
]


def test_multi_turn_sums_cover_the_models_tokens_only(model) -> None:
    with torch.no_grad():
        expected = by_hand(model, MULTI_TURN_PROMPTS, MULTI_TURN, SCORED)
        rows = sequence_logprobs(model, MULTI_TURN_PROMPTS, MULTI_TURN, T, pad_id=0, scored=SCORED)
        trees = shared_prefix_logprobs(model, MULTI_TURN_PROMPTS, MULTI_TURN, T, pad_id=0, scored=SCORED)
        chunked = shared_prefix_logprobs_chunked(
            model, MULTI_TURN_PROMPTS, MULTI_TURN, T, pad_id=0, token_budget=16, scored=SCORED
        )
        unmasked = sequence_logprobs(model, MULTI_TURN_PROMPTS, MULTI_TURN, T, pad_id=0)
    for got in (rows, trees, torch.tensor(chunked)):
        torch.testing.assert_close(got.to(expected.dtype), expected, atol=1e-4, rtol=1e-5)
    # The same tokens scored whole (trajectory 2) and with the environment's two skipped (trajectory 0) differ
    # by exactly those two tokens' log-probs; single-turn rows are unchanged by the mask.
    assert (expected[0] > unmasked[0]) and torch.isclose(expected[2], unmasked[2], atol=1e-4)
    torch.testing.assert_close(expected[3], unmasked[3], atol=1e-4, rtol=1e-5)


def test_multi_turn_gradients_through_the_trees_equal_the_padded_rows(model) -> None:
    weights = torch.tensor([0.3, -1.0, 2.0, 0.5, -0.7, 1.1])

    def grads(fn) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        (fn(model, MULTI_TURN_PROMPTS, MULTI_TURN, T, 0, scored=SCORED) * weights).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    for tree, rows in zip(grads(shared_prefix_logprobs), grads(sequence_logprobs), strict=True):
        torch.testing.assert_close(tree, rows, atol=1e-5, rtol=1e-4)
