"""Beam drafting: exact distributions of beam sampling, beam search against references and
brute force, dead beams, mixed batches and reproducibility."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from tests.helpers import (ToyLM, brute_force_best, chi_square_pvalue, core_draft,
                           ordered_draw_probability, set_draw_probabilities)
from vllm_mtad.core import BeamState, NoiseKeys, beam_step, best_beam, keep_rows

pytestmark = pytest.mark.unit

# --- One sampled step: empirical frequencies against the exact probabilities ----------------

PREV_SCORES = [math.log(0.7), math.log(0.2)]  # two beams from an earlier step
STEP_PROBS = [[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]]  # q̃(v | beam) for V = 3
NUM_SAMPLES = 120_000


def _one_step_state(B: int) -> BeamState:
    scores = torch.tensor(PREV_SCORES).expand(B, 2).clone()
    tokens = torch.tensor([[[7], [8]]]).expand(B, 2, 1).clone()
    return BeamState(scores=scores, tokens=tokens, token_logprobs=scores[:, :, None].clone(),
                     parents=torch.zeros(B, 2, dtype=torch.int64))


def sample_one_step(step_fn, beam_width: int, B: int = NUM_SAMPLES):
    lp = torch.tensor(STEP_PROBS).log().expand(B, 2, 3)
    keys = NoiseKeys(torch.zeros(B, dtype=torch.bool), torch.arange(B, dtype=torch.int64),
                     torch.full((B,), 3))
    state = step_fn(lp, _one_step_state(B), beam_width, keys, 2)
    return state


def exact_weights() -> list[float]:
    """Joint probability of each flattened (beam, token) candidate."""
    return [math.exp(PREV_SCORES[b]) * STEP_PROBS[b][v] for b in range(2) for v in range(3)]


def check_sampled_step_distribution(step_fn, beam_width: int = 3) -> None:
    state = sample_one_step(step_fn, beam_width)
    flat = (state.parents * 3 + state.tokens[:, :, -1]).tolist()
    # Unordered sets: the defining property of drawing W candidates without replacement.
    sets = Counter(frozenset(row) if len(set(row)) == len(row) else ("dup", tuple(row))
                   for row in flat)
    probs = set_draw_probabilities(exact_weights(), beam_width)
    p_set = chi_square_pvalue(sets, probs, NUM_SAMPLES)
    # The order of selection follows successive sampling too (Gumbel-top-k's known property).
    ordered = Counter(tuple(row) for row in flat)
    probs_ordered = {o: ordered_draw_probability(exact_weights(), o)
                     for o in map(tuple, {tuple(r) for r in flat}) if len(set(o)) == len(o)}
    p_ord = chi_square_pvalue(ordered, probs_ordered, NUM_SAMPLES) if probs_ordered else 0.0
    # Deterministic (fixed seeds); 1e-4 is far below what the right sampler produces and far
    # above what a wrong one does at 120k samples.
    assert p_set > 1e-4 and p_ord > 1e-4, (
        f"beam sampling does not match drawing without replacement (p_set={p_set:.2e}, "
        f"p_ordered={p_ord:.2e})")
    # History re-parenting: the carried token is the parent's.
    assert torch.equal(state.tokens[:, :, 0], torch.where(state.parents == 0, 7, 8))
    assert torch.allclose(state.scores, state.token_logprobs.sum(-1))


def wrong_with_replacement(lp, state, beam_width, keys, step):
    """Draws W candidates independently (with replacement)."""
    B, W_in, V = lp.shape
    cand = (state.scores[:, :, None] + lp).reshape(B, -1)
    gen = torch.Generator().manual_seed(0)
    chosen = torch.multinomial(cand.softmax(-1), beam_width, replacement=True, generator=gen)
    return _state_from_choice(state, lp, cand, chosen)


def wrong_last_step_score(lp, state, beam_width, keys, step):
    """Ranks candidates by the step's log q̃ alone, not the cumulative beam score."""
    if state is None:
        return beam_step(lp, state, beam_width, keys, step)
    zeroed = BeamState(torch.zeros_like(state.scores), state.tokens, state.token_logprobs,
                       state.parents)
    new = beam_step(lp, zeroed, beam_width, keys, step)
    parent_scores = state.scores.gather(1, new.parents)
    return BeamState(new.scores + parent_scores, new.tokens, new.token_logprobs, new.parents)


def _state_from_choice(state, lp, cand, chosen):
    B, W_in, V = lp.shape
    parents, tokens = chosen // V, chosen % V
    idx = parents[:, :, None]
    return BeamState(cand.gather(1, chosen),
                     torch.cat([state.tokens.gather(1, idx), tokens[:, :, None]], 2),
                     torch.cat([state.token_logprobs.gather(1, idx),
                                lp.reshape(B, -1).gather(1, chosen)[:, :, None]], 2), parents)


@pytest.mark.parametrize("beam_width", [1, 2, 3])
def test_sampled_step_matches_exact_without_replacement(beam_width):
    check_sampled_step_distribution(beam_step, beam_width)


@pytest.mark.parametrize("wrong", [wrong_with_replacement, wrong_last_step_score])
def test_sampling_check_rejects_wrong_samplers(wrong):
    with pytest.raises(AssertionError, match="does not match"):
        check_sampled_step_distribution(wrong)


def test_first_step_distribution():
    """Step 1: W distinct tokens from q̃(· | c) without replacement."""
    B, probs = 100_000, [0.4, 0.3, 0.2, 0.1]
    lp = torch.tensor(probs).log().expand(B, 1, 4)
    state = beam_step(lp, None, 2, NoiseKeys(torch.zeros(B, dtype=torch.bool), torch.arange(B),
                                             torch.zeros(B, dtype=torch.int64)), 1)
    sets = Counter(frozenset(r) for r in state.tokens[:, :, 0].tolist())
    assert chi_square_pvalue(sets, set_draw_probabilities(probs, 2), B) > 1e-4
    assert torch.equal(state.parents, torch.zeros_like(state.parents))


# --- Greedy: beam search ------------------------------------------------------------------

def reference_beam_search(lm: ToyLM, context, gamma, beam_width):
    """Textbook beam search with lists: keep the W best (score, tokens) at each step."""
    beams = [(0.0, [])]
    for _ in range(gamma):
        cands = [(s + lm.logprob(context + toks, v), toks + [v])
                 for s, toks in beams for v in range(lm.vocab_size)]
        beams = sorted(cands, key=lambda c: -c[0])[:beam_width]
    return max(beams, key=lambda c: c[0])


GREEDY_CASES = [(5, 3, 1), (5, 3, 2), (7, 4, 4), (4, 5, 8)]


def check_greedy_matches_reference(step_fn, vocab, gamma, width) -> None:
    lm = ToyLM(vocab, seed=vocab * 10 + gamma)
    contexts = [[1, 2], [3], [0, 0, 4], [2]]
    tokens, lps, state = core_draft(lm, contexts, gamma, width, [0.0] * 4, [0, 1, 2, 3],
                                    step_fn=step_fn)
    for b, ctx in enumerate(contexts):
        score, want = reference_beam_search(lm, ctx, gamma, width)
        assert tokens[b].tolist() == want, (
            f"beam search differs from the reference: got {tokens[b].tolist()}, want {want}")
        assert lps[b].sum().item() == pytest.approx(score, abs=1e-4)
        assert lps[b].tolist() == pytest.approx(
            [lm.logprob(ctx + want[:i], want[i]) for i in range(gamma)], abs=1e-5)


@pytest.mark.parametrize("vocab,gamma,width", GREEDY_CASES)
def test_greedy_matches_reference_beam_search(vocab, gamma, width):
    check_greedy_matches_reference(beam_step, vocab, gamma, width)


def test_reference_check_rejects_non_cumulative_score():
    with pytest.raises(AssertionError, match="differs from the reference"):
        for case in GREEDY_CASES:
            check_greedy_matches_reference(wrong_last_step_score, *case)


def check_greedy_exact_by_enumeration(step_fn) -> None:
    """With W >= V^(γ-1) beam search keeps every prefix, so it must find the global argmax."""
    for seed in range(4):
        lm = ToyLM(3, seed=100 + seed, scale=1.5)
        tokens, _, _ = core_draft(lm, [[seed]], 3, 9, [0.0], [0], step_fn=step_fn)
        best, _ = brute_force_best(lm, [seed], 3)
        assert tokens[0].tolist() == best, (
            f"beam search missed the best sequence: got {tokens[0].tolist()}, want {best}")


def test_greedy_wide_beam_equals_brute_force():
    check_greedy_exact_by_enumeration(beam_step)


# --- Dead beams, mixed batches, row beam limits --------------------------------------------

def test_fewer_valid_candidates_than_beams():
    lm = ToyLM(6, seed=3)
    # top-k 2 with W = 4: two live beams after step 1; never a dead beam chosen later.
    tokens, lps, state = core_draft(lm, [[1]] * 200, 3, 4, [1.0] * 200, list(range(200)),
                                    top_k=[2] * 200)
    first = lm.logits([1]).topk(2).indices.tolist()
    assert set(tokens[:, 0].tolist()) <= set(first)
    assert torch.isfinite(lps).all()
    assert torch.isfinite(state.scores).all()  # 2 live beams x 2 tokens = 4 live again
    s1 = beam_step(torch.tensor([[[0.0, -math.inf, -math.inf, -math.inf]]]), None, 3,
                   NoiseKeys(torch.tensor([False]), torch.tensor([0]), torch.tensor([0])), 1)
    assert s1.scores[0, 0] == 0 and torch.isinf(s1.scores[0, 1:]).all()
    assert best_beam(s1)[0].tolist() == [[0]]


def test_more_beams_than_candidates():
    state = beam_step(torch.zeros(2, 1, 2).log_softmax(-1), None, 4,
                      NoiseKeys(torch.tensor([True, False]), torch.tensor([0, 1]),
                                torch.tensor([0, 0])), 1)
    assert state.scores.shape == (2, 4)
    assert torch.isfinite(state.scores[:, :2]).all() and torch.isinf(state.scores[:, 2:]).all()


def test_mixed_batch_rows_follow_their_own_rules():
    lm = ToyLM(8, seed=5)
    ctx = [[1, 2]] * 4
    temps, top_k = [0.0, 1.0, 0.7, 0.0], [0, 3, 0, 0]
    tokens, _, _ = core_draft(lm, ctx, 3, 2, temps, [9, 9, 9, 9], top_k=top_k,
                              top_p=[1.0, 1.0, 0.9, 1.0])
    greedy_tokens, _, _ = core_draft(lm, [[1, 2]], 3, 2, [0.0], [123])
    assert tokens[0].tolist() == tokens[3].tolist() == greedy_tokens[0].tolist()
    assert tokens[1, 0].item() in lm.logits([1, 2]).topk(3).indices.tolist()


def test_row_beam_width_limits_a_row_to_one_beam():
    lm = ToyLM(6, seed=8)
    B = 300
    narrow = torch.tensor([1, 4] * (B // 2))
    step = lambda lp, st, w, keys, k: beam_step(lp, st, w, keys, k,  # noqa: E731
                                                 row_beam_width=narrow)
    tokens, lps, state = core_draft(lm, [[2]] * B, 3, 4, [1.0] * B, list(range(B)), step_fn=step)
    assert torch.isinf(state.scores[0::2, 1:]).all() and torch.isfinite(state.scores[1::2]).all()
    assert torch.isfinite(lps).all()


# --- Reproducibility --------------------------------------------------------------------------

def test_same_seed_and_position_give_same_draft_in_any_batch():
    lm = ToyLM(10, seed=1)
    a, _, _ = core_draft(lm, [[1, 2, 3]], 4, 4, [1.0], [42], positions=[3])
    b, _, _ = core_draft(lm, [[5], [1, 2, 3], [7, 7]], 4, 4, [0.8, 1.0, 1.0], [1, 42, 3],
                         positions=[1, 3, 2])
    assert a[0].tolist() == b[1].tolist()


def test_different_seeds_or_positions_give_different_drafts():
    lm = ToyLM(10, seed=1, scale=0.5)  # flat distributions: many plausible drafts
    B = 32
    by_seed, _, _ = core_draft(lm, [[1, 2, 3]] * B, 4, 4, [1.0] * B, list(range(B)),
                               positions=[3] * B)
    by_pos, _, _ = core_draft(lm, [[1, 2, 3]] * B, 4, 4, [1.0] * B, [0] * B,
                              positions=list(range(B)))
    assert len({tuple(t) for t in by_seed.tolist()}) > B // 2
    assert len({tuple(t) for t in by_pos.tolist()}) > B // 2


def test_rows_kept_after_their_last_step_draft_as_a_shorter_search():
    """Near max_model_len a row drafts fewer steps than the batch: keep_rows must leave it
    exactly where a search of its own length ends (same tokens, log-probs, chosen beam)."""
    lm = ToyLM(12, seed=3, scale=1.0)
    contexts = [[1, 2, 3], [4, 5], [6], [7, 8, 9], [2, 2]]
    steps = [4, 2, 1, 3, 0]  # 0: the row drafts only the first (unbatched) step's token
    temps, seeds = [1.0, 0.0, 1.0, 0.0, 1.0], [5, 6, 7, 8, 9]
    limit = torch.tensor(steps)

    def step_fn(lp, state, W, keys, step):
        new = beam_step(lp, state, W, keys, step)
        return new if state is None else keep_rows(new, state, step > limit)

    tokens, lps, _ = core_draft(lm, contexts, 4, 3, temps, seeds, step_fn=step_fn)
    for b, n in enumerate(steps):
        alone, alone_lps, _ = core_draft(lm, [contexts[b]], max(n, 1), 3, [temps[b]],
                                         [seeds[b]])
        assert tokens[b, :n].tolist() == alone[0, :n].tolist(), b
        assert torch.allclose(lps[b, :n], alone_lps[0, :n]), b
    # Without keep_rows the longer search picks other beams for some row: the check can fail.
    full, _, _ = core_draft(lm, contexts, 4, 3, temps, seeds)
    assert any(full[b, :n].tolist() != tokens[b, :n].tolist() for b, n in enumerate(steps))
