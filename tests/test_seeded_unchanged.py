"""The hot-path rewrite (k-selection processing, candidate-only noise, the gather-based sampler)
leaves every token of a fixed seeded workload unchanged.

tests/data/seeded_tokens_before_hot_path_rewrite.json was recorded by
``python -m tests.seeded_workload`` at the commit it names, before the rewrite: six sampling
settings (the paper's T=1/top-k 10/top-p 0.9, no truncation, top-p alone, top-k alone, greedy,
T=0.5 with top-k 20 and top-p 0.95) on four prompts, all in one batch, MTAD W=4, γ=4, τ=0.5.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.seeded_workload import run

pytestmark = pytest.mark.engine

RECORDED = Path(__file__).parent / "data" / "seeded_tokens_before_hot_path_rewrite.json"


# Every setting together (a sampled row without top-k makes the drafter's batch dense), and the
# top-k settings with greedy alone (the k-selection path: candidates only).
SPARSE = (0, 3, 4, 5)


def test_seeded_workload_tokens_unchanged(tiny_pair_dirs):
    from tests.seeded_workload import SETTINGS, requests

    before = json.loads(RECORDED.read_text())["tokens"]
    n = len(requests([0]))
    stats = []
    everything, sparse = run(*tiny_pair_dirs, batches=(None, SPARSE), stats=stats)
    # The first batch drafted densely every round, the second never did (nor redid a round).
    assert stats[0]["dense_rounds"] == stats[0]["rounds"] > 0
    assert stats[1]["dense_rounds"] == stats[0]["dense_rounds"]
    assert stats[1]["rounds"] > stats[0]["rounds"] and stats[1]["dense_redos"] == 0
    # Draft log-probs reached the sampler through vLLM's draft_probs channel, every step.
    assert stats[1]["sampler_draft_probs_channel"] > 0
    assert stats[1]["sampler_draft_store"] == 0
    expected_sparse = [before[i * n + j] for i in SPARSE for j in range(n)]
    for name, now, want in (("all settings", everything, before),
                            ("top-k settings", sparse, expected_sparse)):
        assert len(now) == len(want)
        differ = [i for i, (a, b) in enumerate(zip(now, want)) if a != b]
        assert not differ, (f"{name}: {len(differ)} of {len(now)} sequences changed (first: "
                            f"#{differ[0]}: {want[differ[0]]} -> {now[differ[0]]})")
    assert len(SETTINGS) * n == len(before)


def test_seeded_tokens_unchanged_with_the_compiled_noise_kernel(tiny_pair_dirs, monkeypatch):
    """The dense batch again, with every dense noise draw (draft beams and the sampler's extra
    token) run through the torch.compile'd kernel inside the engine."""
    from vllm_mtad.core import noise

    monkeypatch.setenv("VLLM_MTAD_NOISE_COMPILE_MIN_ELEMENTS", "1")
    monkeypatch.setenv("VLLM_MTAD_COMPILE_NOISE", "1")
    monkeypatch.setattr(noise, "_compiled", None)
    before = json.loads(RECORDED.read_text())["tokens"]
    (now,) = run(*tiny_pair_dirs)
    assert noise._compiled, "the compiled kernel was not used (compilation failed?)"
    assert now == before


def test_tie_overflow_falls_back_to_the_same_tokens(tiny_pair_dirs, monkeypatch):
    """When a row's ties at its k-th value reach past the candidates (bf16 logits can do
    that), the drafter redoes its round densely and the sampler takes vLLM's dense path. The
    tiny pair's float32 logits never tie, so every sparse call is flagged here: the top-k batch
    must still give the recorded tokens, through the fallbacks."""
    from vllm_mtad import proposer, sampler
    from vllm_mtad.core.processing import draft_candidates

    def flagged(*args, **kwargs):
        c = draft_candidates(*args, **kwargs)
        if c.token_ids is not None:
            c.overflow = torch.ones_like(c.overflow)
        return c

    monkeypatch.setattr(proposer, "draft_candidates", flagged)
    monkeypatch.setattr(sampler, "draft_candidates", flagged)
    from tests.seeded_workload import requests

    before = json.loads(RECORDED.read_text())["tokens"]
    n = len(requests([0]))
    stats = []
    (sparse,) = run(*tiny_pair_dirs, batches=(SPARSE,), stats=stats)
    assert sparse == [before[i * n + j] for i in SPARSE for j in range(n)]
    assert stats[0]["dense_redos"] == stats[0]["rounds"] > 0
