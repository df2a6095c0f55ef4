"""Builders of buffer test data, shared by the buffer's unit and integration tests."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Sequence

from tba.schemas import ScoredGroup, ScoredSample

_counter = itertools.count()
TEMPERATURE, REFERENCE = 0.7, "test-reference"  # the objective of every group made here


def make_sample(tokens: Sequence[int], reward: float = 0.0, logprob: float = -1.0) -> ScoredSample:
    return ScoredSample(completion_ids=list(tokens), completion_text="x" * len(tokens), reward=reward,
                        logprob_sum=logprob, ref_logprob_sum=logprob - 0.5)


def make_group(prompt_id: str = "p0", version: int = 0, rewards: Sequence[float] = (0.0, 1.0),
               tokens: Sequence[Sequence[int]] | None = None, searcher_id: str = "s0",
               group_id: str | None = None) -> ScoredGroup:
    """A group whose completions are distinct unless ``tokens`` says otherwise."""
    if tokens is None:
        tokens = [[next(_counter) % 50_000 + 1, i + 1] for i in range(len(rewards))]
    return ScoredGroup(
        group_id=group_id or uuid.uuid4().hex, prompt_id=prompt_id, prompt_text=f"prompt {prompt_id}",
        prompt_ids=[1, 2, 3], task="arithmetic", policy_version=version, searcher_id=searcher_id,
        temperature=TEMPERATURE, reference=REFERENCE,
        samples=[make_sample(t, r) for t, r in zip(tokens, rewards, strict=True)],
    )


def check_consistency(client, ns: str = "tba") -> dict:
    """Read every buffer key (a test may scan) and assert the indexes agree; return a summary."""
    from services.buffer.scripts import VERSION_SHIFT
    from tba.keys import Keys

    keys = Keys(ns)
    g = keys.global_key("")
    pmax = {k.decode(): int(v) for k, v in client.zrange(g + "pmax", 0, -1, withscores=True)}
    gold = {k.decode(): int(v) for k, v in client.zrange(g + "gold", 0, -1, withscores=True)}
    assert set(pmax) == set(gold), "pmax and gold index different prompts"
    vcount: dict[int, int] = {}
    total, reward_sum = 0, 0.0
    for p in pmax:
        ord_ = {h: int(s) for h, s in client.zrange(keys.prompt_key(p, "ord"), 0, -1, withscores=True)}
        rew = client.hgetall(keys.prompt_key(p, "rew"))
        rec = client.hgetall(keys.prompt_key(p, "rec"))
        assert set(ord_) == set(rew) == set(rec), f"prompt {p}: ord/rew/rec disagree"
        copies = {h: int(c) for h, c in client.hgetall(keys.prompt_key(p, "cnt")).items()}
        assert set(copies) <= set(ord_) and all(c > 1 for c in copies.values()), f"prompt {p}: copies {copies}"
        assert ord_, f"prompt {p} is indexed but empty"
        versions = [s // VERSION_SHIFT for s in ord_.values()]
        assert pmax[p] == max(versions), f"prompt {p}: pmax {pmax[p]} != {max(versions)}"
        assert gold[p] == min(ord_.values()), f"prompt {p}: gold is not its oldest score"
        pv = {int(k): int(v) for k, v in client.hgetall(keys.prompt_key(p, "pv")).items()}
        expect = {v: versions.count(v) for v in set(versions)}
        assert pv == expect, f"prompt {p}: per-version counts {pv} != {expect}"
        for v in expect:
            assert client.zscore(g + f"vp:{v}", p) is not None, f"prompt {p} missing from vp:{v}"
            vcount[v] = vcount.get(v, 0) + expect[v]
        assert client.exists(keys.prompt_key(p, "meta")), f"prompt {p} lost its record"
        total += len(ord_)
        reward_sum += sum(float(x) for x in rew.values())
    stored_vcount = {int(k): int(v) for k, v in client.hgetall(g + "vcount").items()}
    assert stored_vcount == vcount
    stats = {k.decode(): v.decode() for k, v in client.hgetall(g + "stats").items()}
    assert int(stats.get("samples", 0)) == total
    assert abs(float(stats.get("reward_sum", 0)) - reward_sum) < 1e-6 * max(1.0, total)
    counters = {k: int(stats.get(k, 0)) for k in
                ("samples_ingested", "samples_duplicate", "samples_evicted", "samples_dead_lettered")}
    assert counters["samples_ingested"] == (total + counters["samples_evicted"] + counters["samples_duplicate"]
                                            + counters["samples_dead_lettered"]), (counters, total)
    return {"prompts": len(pmax), "samples": total, "versions": vcount, **counters}
