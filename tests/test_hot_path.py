"""The fast forms of the hot path equal their definitions.

- draft_candidates (one k-selection, no sort) against processed_logprobs (the definition: a full
  sort), on random and adversarial logits;
- beam_step and extra_tokens_from on candidates against the same functions on the dense rows
  the candidates stand for (bit for bit: the same values and the same noise keys);
- the compiled dense noise against the eager one (bit for bit);
- the per-step functions never read a device value on the host: they run on the "meta" device,
  where any such read raises.
"""

from __future__ import annotations

import math

import pytest
import torch

from vllm_mtad import envs
from vllm_mtad.beam_kv import BeamKVLayout, RequestBlocks
from vllm_mtad.core import (Bonus, NoiseKeys, StepCandidates, beam_step, is_greedy, mtad_accept,
                            noise)
from vllm_mtad.core.acceptance import extra_tokens_from
from vllm_mtad.core.processing import (TIE_SLACK, Candidates, draft_candidates, size_candidates,
                                       processed_logprobs)

pytestmark = pytest.mark.unit

INF = float("inf")


def random_rows(gen, R, V, kind):
    logits = torch.randn(R, V, generator=gen) * 3
    if kind == "ties":  # coarse values: ties everywhere, at the k-th value and the top-p boundary
        logits = (logits * 2).round() / 2
    elif kind == "neg_inf":  # tokens removed upstream (bad words, grammar)
        logits[torch.rand(R, V, generator=gen) < 0.3] = -INF
    elif kind == "bf16":  # the real pair's logits: bfloat16, ties common near the top
        logits = (logits * 4).to(torch.bfloat16)
    return logits


def settings(gen, R, V):
    temp = torch.rand(R, generator=gen) + 0.3
    temp[::5] = 0.0  # greedy rows
    top_k = torch.randint(1, 40, (R,), generator=gen)
    top_p = torch.rand(R, generator=gen) * 0.7 + 0.3
    top_p[::3] = 1.0
    return temp, top_k, top_p


def densify(c: Candidates, V: int) -> torch.Tensor:
    return torch.full((c.logprobs.shape[0], V), -INF).scatter(1, c.token_ids, c.logprobs)


@pytest.mark.parametrize("kind", ["plain", "ties", "neg_inf", "bf16"])
def test_candidates_equal_the_definition(kind):
    gen = torch.Generator().manual_seed(11)
    R, V, W = 96, 3000, 4
    flagged = 0
    for _ in range(6):
        logits = random_rows(gen, R, V, kind)
        temp, top_k, top_p = settings(gen, R, V)
        greedy = is_greedy(temp)
        plan = size_candidates(V, W, greedy.tolist(), top_k.tolist(), top_p.tolist())
        k_max = int(top_k[~greedy].max())
        assert plan.num_candidates == max(W, k_max + max(TIE_SLACK, k_max))
        c = draft_candidates(logits, temp, top_k, top_p, plan)
        ref = processed_logprobs(logits, temp, top_k, top_p)
        # Sampled rows not flagged: the same kept tokens, the same log-probs up to float32
        # rounding of the normaliser (summed over K values instead of V: < 4 ulp at |lp| < 32).
        ok = ~greedy & ~c.overflow
        dense = densify(c, V)
        assert torch.equal(torch.isfinite(dense[ok]), torch.isfinite(ref[ok]))
        fin = torch.isfinite(ref[ok])
        assert torch.allclose(dense[ok][fin], ref[ok][fin], rtol=0, atol=4e-6)
        # Greedy rows: their K best tokens by logit, with the plain log-softmax.
        best = ref[greedy].topk(W, dim=-1).values
        assert torch.allclose(c.logprobs[greedy][:, :W], best, rtol=0, atol=4e-6)
        assert torch.equal(c.logprobs[greedy].gather(1, torch.zeros_like(c.token_ids[greedy][:, :1])),
                           c.logprobs[greedy][:, :1])
        # A flagged row really has ties (or -inf values) reaching the last candidate.
        K = plan.num_candidates
        for r in torch.nonzero(c.overflow).flatten().tolist():
            scaled = logits[r].float() / temp[r]
            kth = scaled.topk(int(top_k[r])).values[-1]
            assert int((scaled >= kth).sum()) >= K or kth == -INF
        flagged += int(c.overflow.sum())
    if kind == "plain":
        assert flagged == 0  # continuous logits never tie


@pytest.mark.parametrize("top_k", [10, 50, 200])
def test_bf16_logits_rarely_overflow(top_k):
    """bfloat16 logits tie often; the candidates' slack grows with k so that a real-sized row
    practically never needs the dense redo (each flagged row costs its whole round twice)."""
    gen = torch.Generator().manual_seed(top_k)
    R, V = 64, 151_936
    logits = (torch.randn(R, V, generator=gen) * 3).to(torch.bfloat16)
    temp, k = torch.ones(R), torch.full((R,), top_k)
    plan = size_candidates(V, 4, [False] * R, [top_k] * R, [0.9] * R)
    c = draft_candidates(logits, temp, k, torch.full((R,), 0.9), plan)
    assert int(c.overflow.sum()) == 0


def test_adversarial_rows():
    V = 1000
    # Row 0: all equal (every token ties at the k-th value: flagged, must go dense).
    # Row 1: ties at the k-th value that fit in the slack: kept, exactly as the definition.
    # Row 2: dyadic probabilities exactly on the top-p boundary (1/2, 1/4, 1/4; p = 0.5).
    # Then top-k >= V (no top-k): the batch plan is dense.
    logits = torch.full((3, V), -30.0)
    logits[0] = 0.0
    logits[1, :3] = torch.tensor([5.0, 4.0, 4.0])
    logits[1, 3:6] = 3.0  # k = 4: the 4th value (3.0) is shared by 3 tokens; all 3 kept
    logits[2, :3] = torch.tensor([math.log(0.5), math.log(0.25), math.log(0.25)])
    logits[2, 3:] = -INF
    temp = torch.ones(3)
    top_k = torch.tensor([4, 4, 3])
    top_p = torch.tensor([1.0, 1.0, 0.5])
    plan = size_candidates(V, 2, [False] * 3, top_k.tolist(), top_p.tolist())
    c = draft_candidates(logits, temp, top_k, top_p, plan)
    ref = processed_logprobs(logits, temp, top_k, top_p)
    assert c.overflow.tolist() == [True, False, False]
    dense = densify(c, V)
    for r in (1, 2):
        assert torch.equal(torch.isfinite(dense[r]), torch.isfinite(ref[r]))
    assert torch.isfinite(ref[1]).sum() == 6  # the ties at the k-th value are kept
    assert torch.isfinite(ref[2]).sum() == 1  # cum 0.25, 0.5 <= 1 - p: both 1/4s dropped
    dense_plan = size_candidates(V, 2, [False, False], [4, V], [1.0, 1.0])
    assert dense_plan.num_candidates is None
    c2 = draft_candidates(logits[:2], temp[:2], torch.tensor([4, V]), None, dense_plan)
    assert c2.token_ids is None
    assert torch.allclose(c2.logprobs, processed_logprobs(logits[:2], temp[:2],
                                                          torch.tensor([4, V]), None),
                          atol=1e-6)
    # Greedy-only batches need W candidates per beam, k-selection even without top-k.
    assert size_candidates(V, 4, [True, True], [0, 0], [1.0, 1.0]).num_candidates == 4


@pytest.mark.parametrize("greedy_rows", [(), (0, 2)])
def test_beam_step_on_candidates_equals_dense(greedy_rows):
    gen = torch.Generator().manual_seed(5)
    B, W, V = 6, 4, 500
    temp = torch.ones(B)
    for r in greedy_rows:
        temp[r] = 0.0
    greedy = is_greedy(temp)
    top_k = torch.tensor([7, 3, 12, 1, 9, 30])
    top_p = torch.tensor([0.9, 1.0, 0.8, 1.0, 0.95, 0.7])
    plan = size_candidates(V, W, greedy.tolist(), top_k.tolist(), top_p.tolist())
    seeds = torch.arange(B) * 1000 + 3
    positions = torch.arange(B) + 40
    rep = lambda t: t.repeat_interleave(W)  # noqa: E731
    keys = NoiseKeys(greedy, seeds, positions)
    sparse_keys = NoiseKeys(greedy, seeds, positions, any_sampled=True)

    c = draft_candidates(torch.randn(B, V, generator=gen), temp, top_k, top_p, plan)
    sparse = beam_step(StepCandidates(c.logprobs[:, None], c.token_ids[:, None], V), None, W,
                       sparse_keys, 1)
    dense = beam_step(densify(c, V)[:, None], None, W, keys, 1)
    for step in range(2, 5):
        assert_same_live_beams(sparse, dense)
        c = draft_candidates(torch.randn(B * W, V, generator=gen), rep(temp), rep(top_k),
                             rep(top_p), plan)
        sparse = beam_step(StepCandidates(c.logprobs.view(B, W, -1), c.token_ids.view(B, W, -1),
                                          V), sparse, W, sparse_keys, step)
        dense = beam_step(densify(c, V).view(B, W, V), dense, W, keys, step)
    assert_same_live_beams(sparse, dense)


def assert_same_live_beams(a, b):
    """Equal scores; equal tokens, parents and log-probs on live beams. (A dead beam, score
    -inf, exists where a row has fewer than W candidates with probability > 0; its placeholder
    token is arbitrary and never drafted.)"""
    assert torch.equal(a.scores, b.scores)
    live = torch.isfinite(a.scores)
    assert bool(live[:, 0].all())
    assert torch.equal(a.tokens[live], b.tokens[live])
    assert torch.equal(a.parents[live], b.parents[live])
    assert torch.equal(a.token_logprobs[live], b.token_logprobs[live])


def test_extra_token_on_candidates_equals_dense():
    gen = torch.Generator().manual_seed(9)
    B, V = 400, 1000
    temp = torch.ones(B)
    temp[::4] = 0.0
    greedy = is_greedy(temp)
    top_k = torch.randint(1, 20, (B,), generator=gen)
    plan = size_candidates(V, 1, greedy.tolist(), top_k.tolist(), [1.0] * B)
    c = draft_candidates(torch.randn(B, V, generator=gen), temp, top_k, None, plan)
    seeds, positions = torch.arange(B), torch.full((B,), 17)
    a = extra_tokens_from(c, NoiseKeys(greedy, seeds, positions, any_sampled=True))
    assert c.token_ids is not None  # the sparse form
    b = extra_tokens_from(Candidates(densify(c, V), None, c.overflow),
                          NoiseKeys(greedy, seeds, positions))
    assert torch.equal(a, b)


def test_noise_at_chosen_columns_and_compiled_dense_noise_equal_eager():
    keys = noise.row_keys(torch.arange(4), torch.arange(4) * 7, 3, noise.STREAM_DRAFT)
    n = envs.noise_compile_min_elements() // 4 + 123  # large enough to run compiled
    eager = noise._gumbel_dense_eager(keys, n)
    assert torch.equal(noise.gumbel(keys, n), eager)
    cols = torch.randint(0, n, (4, 50))
    assert torch.equal(noise.gumbel_at(keys, cols), eager.gather(1, cols))
    # Enough columns to run the compiled kernel at chosen columns (as every draw does on CUDA).
    many = torch.randint(0, n, (4, envs.noise_compile_min_elements() // 4 + 7))
    assert torch.equal(noise.gumbel_at(keys, many), eager.gather(1, many))
    assert noise._compiled_at, "the compiled kernel at chosen columns did not run"


def test_per_step_functions_never_read_the_device():
    """On the meta device every value is unknown: a host read (.item(), bool(), masked
    indexing, nonzero) raises. So these run without a host sync on any device."""
    meta = torch.device("meta")
    B, W, V, gamma = 3, 4, 1000, 4
    greedy_host = [False, True, False]
    top_k_host = [10, 10, 5]
    plan = size_candidates(V, W, greedy_host, top_k_host, [0.9, 1.0, 1.0])
    temp = torch.empty(B, device=meta)
    top_k = torch.empty(B, dtype=torch.int64, device=meta)
    top_p = torch.empty(B, device=meta)
    greedy = torch.empty(B, dtype=torch.bool, device=meta)
    seeds = torch.empty(B, dtype=torch.int64, device=meta)
    pos = torch.empty(B, dtype=torch.int64, device=meta)
    rep = lambda t: t.repeat_interleave(W)  # noqa: E731

    layout = BeamKVLayout(RequestBlocks(torch.empty(B, 16, dtype=torch.int32, device=meta),
                                        torch.empty(B, dtype=torch.int64, device=meta), pos),
                          gamma, W, 16, 4096, 64, B)
    keys = NoiseKeys(greedy, seeds, pos + 1, any_sampled=True)
    c = draft_candidates(torch.empty(B, V, device=meta), temp, top_k, top_p, plan)
    state = beam_step(StepCandidates(c.logprobs[:, None], c.token_ids[:, None], V), None, W,
                      keys, 1, layout.row_beam_width)
    for t in range(2, gamma + 1):
        kv = layout.step(state.parents, t)
        assert kv.copy_src.shape == (B * W,) and kv.slot_mapping.shape == (B * W,)
        c = draft_candidates(torch.empty(B * W, V, device=meta), rep(temp), rep(top_k),
                             rep(top_p), plan)
        state = beam_step(StepCandidates(c.logprobs.view(B, W, -1), c.token_ids.view(B, W, -1),
                                         V), state, W, keys, t, layout.row_beam_width)
    assert state.tokens.shape == (B, W, gamma)
    out = mtad_accept(state.tokens[:, 0], state.token_logprobs[:, 0],
                      torch.empty(B, gamma + 1, V, device=meta), torch.empty(B, device=meta),
                      greedy, NoiseKeys(greedy, seeds, pos, any_sampled=True),
                      bonus=Bonus(torch.empty(B, device=meta),
                                  torch.empty(B, dtype=torch.int64, device=meta)))
    assert out.output_token_ids.shape == (B, gamma + 1)
    # And the check can fail: a host read on meta raises.
    with pytest.raises(Exception):
        bool(greedy.any())


def test_bad_noise_threshold_names_the_variable(monkeypatch):
    monkeypatch.setenv("VLLM_MTAD_NOISE_COMPILE_MIN_ELEMENTS", "lots")
    with pytest.raises(ValueError, match="VLLM_MTAD_NOISE_COMPILE_MIN_ELEMENTS='lots'"):
        envs.noise_compile_min_elements()
