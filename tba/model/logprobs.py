"""Summed completion log-probabilities under temperature-scaled logits.

The one definition of log pi(y|x) in the project: the trainer calls it on the
policy (with gradients), the searcher on the reference model (without), so the
two sides of the TB loss are computed the same way (docs/algorithm.md §3). Padding
is masked out of the sums, so the result does not depend on batch padding.

A multi-turn completion holds the environment's tokens between the model's turns
(tool results, observations): they are context the model conditions on, never
its choices, so the sums cover only the tokens ``scored`` marks as the model's
(per completion, one flag per token; None: all of them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from tba.model.batches import pad, pad_batch, token_budget_chunks

# Per completion, one flag per token: True where the model generated it (scored), False where the
# environment wrote it (context). None: every token is the model's (single-turn).
Scored = Sequence[Sequence[bool]] | None


def token_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    temperature: float,
    pad_id: int,
    scored: Scored = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs of each scored completion token, (N, L-1), and their mask (N, L-1)."""
    device = next(model.parameters()).device
    input_ids, attention_mask, completion_mask = pad_batch(prompts, completions, pad_id)
    if scored is not None:
        own, _ = pad([[0] * len(p) + [int(f) for f in s] for p, s in zip(prompts, scored, strict=True)], 0)
        completion_mask &= own[:, : completion_mask.shape[1]].bool()
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]  # (N, L-1, V)
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    targets = input_ids[:, 1:]  # token t+1 is predicted at position t
    tok_logp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (N, L-1)
    mask = completion_mask[:, 1:].to(device)
    return tok_logp.masked_fill(~mask, 0.0), mask


def sequence_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    temperature: float,
    pad_id: int,
    scored: Scored = None,
) -> torch.Tensor:
    """log pi(y_i | x_i) summed over the scored completion tokens, shape (N,)."""
    tok_logp, _ = token_logprobs(model, prompts, completions, temperature, pad_id, scored)
    return tok_logp.sum(dim=-1)


# --- the same sums, each prompt and each shared completion prefix computed once ---

MASKED_ATTENTION = ("sdpa", "eager")  # attention implementations that take the trees' custom 4D mask


def takes_tree_mask(model: torch.nn.Module) -> bool:
    return getattr(model.config, "_attn_implementation", None) in MASKED_ATTENTION


@dataclass
class PrefixTree:
    """One prompt and the distinct prefixes of its completions, laid out as one row of tokens.

    ``tokens[:len(prompt)]`` is the prompt; every later token is a trie node (a completion prefix's last
    token) at position ``len(prompt) + depth``, attending to the prompt and its own ancestors only.
    ``parents[j]`` is the index whose logits predict token ``j`` (-1 for prompt tokens). A completion's
    path is the nodes its sum covers: its scored tokens' nodes."""

    prompt_len: int
    tokens: list[int]
    positions: list[int]
    parents: list[int]
    paths: dict[int, list[int]] = field(default_factory=dict)  # completion index -> its nodes' indices

    @classmethod
    def build(
        cls,
        prompt: Sequence[int],
        completions: dict[int, Sequence[int]],
        scored: dict[int, Sequence[bool]] | None = None,
    ) -> PrefixTree:
        """The tree of ``completions`` (completion index -> its tokens) after ``prompt``; ``scored``: the
        completions whose tokens are not all the model's, with their flags."""
        if not prompt:
            raise ValueError("a prompt needs at least one token (the first completion token is predicted from it)")
        tree = cls(len(prompt), list(prompt), list(range(len(prompt))), [-1] * len(prompt))
        nodes: dict[tuple[int, int], int] = {}  # (parent index, token) -> node index
        for i, completion in completions.items():
            parent, path, flags = len(prompt) - 1, [], (scored or {}).get(i)
            for depth, tok in enumerate(completion):
                node = nodes.get((parent, tok))
                if node is None:
                    node = nodes[(parent, tok)] = len(tree.tokens)
                    tree.tokens.append(tok)
                    tree.positions.append(len(prompt) + depth)
                    tree.parents.append(parent)
                if flags is None or flags[depth]:
                    path.append(node)
                parent = node
            tree.paths[i] = path
        return tree


def tree_batch(
    trees: Sequence[PrefixTree], pad_id: int, additive: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``input_ids`` and ``position_ids`` (R, L), and the 4D attention mask (R, 1, L, L).

    In the mask a prompt token sees the prompt causally, a node the prompt, its ancestors and itself;
    padding sees itself (no empty softmax row). Boolean (True: attend), or additive in dtype ``additive``
    (0 or the dtype's minimum) for attention implementations that add the mask to the scores."""
    input_ids, _ = pad([t.tokens for t in trees], pad_id)
    position_ids, _ = pad([t.positions for t in trees], 0)
    R, L = input_ids.shape
    allowed = torch.eye(L, dtype=torch.bool).repeat(R, 1, 1)
    causal = torch.tril(torch.ones((L, L), dtype=torch.bool))
    rows: list[int] = []
    nodes: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    for r, tree in enumerate(trees):
        n, lp = len(tree.tokens), tree.prompt_len
        allowed[r, :lp, :lp] = causal[:lp, :lp]
        rows += [r] * (n - lp)
        nodes += range(lp, n)
        parents += tree.parents[lp:]
        depths += [p - lp for p in tree.positions[lp:]]
    rows_t, nodes_t, parents_t, depths_t = (torch.tensor(x, dtype=torch.long) for x in (rows, nodes, parents, depths))
    for depth in range(max(depths, default=-1) + 1):  # parents before children: one step per depth, all rows
        level = depths_t == depth
        row, node = rows_t[level], nodes_t[level]
        allowed[row, node] = allowed[row, parents_t[level]]
        allowed[row, node, node] = True
    mask = allowed[:, None]
    if additive is not None:
        mask = torch.zeros(mask.shape, dtype=additive).masked_fill_(~mask, torch.finfo(additive).min)
    return input_ids, position_ids, mask


def prefix_trees(
    prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], scored: Scored = None
) -> list[PrefixTree]:
    """One tree per distinct prompt; completion ``i`` of the inputs is path ``i`` of its prompt's tree."""
    by_prompt: dict[tuple[int, ...], dict[int, Sequence[int]]] = {}
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        by_prompt.setdefault(tuple(p), {})[i] = c
    flags = {} if scored is None else {i: f for i, f in enumerate(scored) if not all(f)}
    return [PrefixTree.build(p, cs, {i: flags[i] for i in cs if i in flags}) for p, cs in by_prompt.items()]


def tree_logprob_sums(
    model: torch.nn.Module, trees: Sequence[PrefixTree], n: int, temperature: float, pad_id: int
) -> torch.Tensor:
    """(n,) sums over each path of ``trees`` (one forward pass); 0 for completions not in these trees."""
    device = next(model.parameters()).device
    # sdpa takes a boolean mask (faster); eager attention adds the mask to its scores.
    additive = None if getattr(model.config, "_attn_implementation", None) == "sdpa" else next(model.parameters()).dtype
    input_ids, position_ids, mask = (x.to(device) for x in tree_batch(trees, pad_id, additive))
    logits = model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask).logits
    rows: list[int] = []  # one entry per trie node, over all trees: its row, its parent, its token
    parents: list[int] = []
    targets: list[int] = []
    owners: list[int] = []  # completion i sums the nodes on its path
    nodes: list[int] = []
    for r, tree in enumerate(trees):
        start = len(targets) - tree.prompt_len  # node j of this tree is entry start + j
        rows += [r] * (len(tree.tokens) - tree.prompt_len)
        parents += tree.parents[tree.prompt_len :]
        targets += tree.tokens[tree.prompt_len :]
        for i, path in tree.paths.items():
            owners += [i] * len(path)
            nodes += [start + j for j in path]
    picked = logits[torch.tensor(rows, device=device), torch.tensor(parents, device=device)]  # (nodes, V)
    logp = torch.log_softmax(picked.float() / temperature, dim=-1)
    node_lp = logp.gather(-1, torch.tensor(targets, device=device)[:, None]).squeeze(-1)
    sums = torch.zeros(n, dtype=node_lp.dtype, device=device)
    return sums.index_add(0, torch.tensor(owners, device=device), node_lp[torch.tensor(nodes, device=device)])


def shared_prefix_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    temperature: float,
    pad_id: int,
    scored: Scored = None,
) -> torch.Tensor:
    """What :func:`sequence_logprobs` returns (N,), computing each prompt and each shared completion prefix once.

    The S completions of a prompt share the prompt and often their first tokens: one row per prompt holds
    the prompt and the trie of its completions (a 4D attention mask: each token sees the prompt and its own
    ancestors; positions by depth), so ``len(prompt) + distinct prefixes`` token positions replace
    ``S * (len(prompt) + len(completion))``. Differentiable, as the trainer needs. The model must take a
    custom 4D mask (sdpa or eager attention, not flash-attention)."""
    return tree_logprob_sums(model, prefix_trees(prompts, completions, scored), len(prompts), temperature, pad_id)


def shared_prefix_logprobs_chunked(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    temperature: float,
    pad_id: int,
    token_budget: int,
    scored: Scored = None,
) -> list[float]:
    """:func:`shared_prefix_logprobs` without gradients, in passes of at most ``token_budget`` padded tokens
    (whole trees per pass; each completion is in exactly one tree, so the passes' sums add up)."""
    trees = prefix_trees(prompts, completions, scored)
    out = torch.zeros(len(prompts))
    with torch.no_grad():
        for chunk in token_budget_chunks([len(t.tokens) for t in trees], token_budget):
            out += tree_logprob_sums(model, [trees[r] for r in chunk], len(prompts), temperature, pad_id).cpu()
    return out.tolist()
