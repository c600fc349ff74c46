"""The acceptance rule against a brute-force oracle, and the extra token's distribution.

Each check is also run on a deliberately wrong rule, which it must reject: a check that cannot
fail proves nothing.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from tests.helpers import chi_square_pvalue
from vllm_mtad.core import NoiseKeys, acceptance
from vllm_mtad.core.acceptance import accepted_lengths, extra_tokens, mtad_accept

pytestmark = pytest.mark.unit

NEG_INF = float("-inf")


def oracle_k(draft, draft_lp, target_lp, tau, exact):
    """k* by the definition, in float64 Python arithmetic."""
    n = next((i for i, t in enumerate(draft) if t < 0), len(draft))  # chain ends at a -1
    if exact:
        k = 0
        while k < n and draft[k] == max(range(len(target_lp[k])), key=lambda v: target_lp[k][v]):
            k += 1
        return k
    best = 0
    for k in range(1, n + 1):
        s = sum(target_lp[i][draft[i]] - draft_lp[i] for i in range(k))
        if s >= math.log(tau):
            best = k  # the largest passing k, not the first failure
    return best


def random_cases(seed: int, num: int = 400, vocab: int = 6):
    """Rows (draft, draft_lp, target_lp, tau, greedy, exact) covering the edge cases by design."""
    rng = random.Random(seed)
    cases = []
    for i in range(num):
        gamma = rng.randint(1, 5)
        kind = i % 8
        target = torch.randn(gamma + 1, vocab, generator=torch.Generator().manual_seed(seed * 7919 + i))
        target = (2.5 * target)
        if kind == 3:  # target probability 0 for some tokens (top-k style truncation)
            target[:, : vocab // 2] = NEG_INF
        target_lp = target.log_softmax(-1).double().tolist()
        draft = [rng.randrange(vocab) for _ in range(gamma)]
        if kind == 3:
            draft = [rng.randrange(vocab) for _ in range(gamma)]  # some land on p = 0
        draft_lp = [math.log(rng.uniform(0.05, 1.0)) for _ in range(gamma)]
        tau = rng.choice([0.5, 0.1, 0.9, 1.0, 1e-30, 0.3])
        if kind == 0:  # everything accepted: draft log-prob far below the target's
            draft_lp = [target_lp[j][draft[j]] - 1.0 for j in range(gamma)]
        elif kind == 1:  # nothing accepted
            draft_lp = [0.0] * gamma
            target_lp = [[v - 50.0 if v > NEG_INF else v for v in row] for row in target_lp]
            tau = 0.9
        elif kind == 2 and gamma >= 2:  # S_1 fails, S_2 passes: longest prefix beats first failure
            draft_lp = [target_lp[0][draft[0]] + 1.0, target_lp[1][draft[1]] - 2.0] + \
                [target_lp[j][draft[j]] + 5.0 for j in range(2, gamma)]
            tau = 0.5
        elif kind == 4:  # invalid (-1) positions end the chain
            cut = rng.randrange(gamma)
            draft = draft[:cut] + [-1] * (gamma - cut)
        elif kind == 5:  # tau = 1 with p == q exactly
            draft_lp = [target_lp[j][draft[j]] for j in range(gamma)]
            tau = 1.0
        elif kind == 6:  # greedy exact: drafts that follow the target's argmax for a while
            draft = [max(range(vocab), key=lambda v: target_lp[j][v]) for j in range(gamma)]
            if gamma > 1:
                draft[rng.randrange(1, gamma)] = rng.randrange(vocab)
        greedy = kind in (6, 7) or rng.random() < 0.2
        exact = greedy and (kind == 6 or rng.random() < 0.5)
        cases.append((draft, draft_lp, target_lp, tau, greedy, exact))
    return cases


def far_from_threshold(case) -> bool:
    """Exclude ties with log τ closer than float32 resolution (the comparison is exact)."""
    draft, draft_lp, target_lp, tau, _, _ = case
    s = 0.0
    for i, t in enumerate(draft):
        if t < 0:
            break
        s += target_lp[i][t] - draft_lp[i]
        if math.isfinite(s) and 0 < abs(s - math.log(tau)) < 1e-4:
            return False
    return True


def as_batch(cases):
    """Pad rows to the largest γ in the batch with -1 drafts (the chain ends there)."""
    gamma = max(len(c[0]) for c in cases)
    vocab = len(cases[0][2][0])
    B = len(cases)
    draft = torch.full((B, gamma), -1, dtype=torch.int64)
    draft_lp = torch.zeros(B, gamma)
    target = torch.full((B, gamma + 1, vocab), -5.0)
    for b, (d, dl, tl, _, _, _) in enumerate(cases):
        draft[b, : len(d)] = torch.tensor(d)
        draft_lp[b, : len(d)] = torch.tensor(dl)
        target[b, : len(tl)] = torch.tensor(tl)
        # positions past this row's own γ+1 are never read for the accepted length
    tau = torch.tensor([c[3] for c in cases], dtype=torch.float64)
    greedy = torch.tensor([c[4] for c in cases])
    exact = torch.tensor([c[5] for c in cases])
    return draft, draft_lp, target, tau, greedy, exact


def check_lengths_match_oracle(lengths_fn, seed: int = 0) -> None:
    cases = [c for c in random_cases(seed) if far_from_threshold(c)]
    draft, draft_lp, target, tau, greedy, exact = as_batch(cases)
    got = lengths_fn(draft, draft_lp, target, tau, greedy & exact).tolist()
    want = [oracle_k(c[0], c[1], c[2], c[3], c[4] and c[5]) for c in cases]
    bad = [(i, got[i], want[i]) for i in range(len(cases)) if got[i] != want[i]]
    assert not bad, f"{len(bad)} rows differ from the oracle, e.g. (row, got, want) {bad[:5]}"


# --- Deliberately wrong rules, each must be rejected by the checks. ---------------------------

def wrong_first_failure(draft, draft_lp, target, tau, exact):
    """Stops at the first failing prefix (the tempting wrong version)."""
    B, gamma = draft.shape
    tgt = target[:, :gamma].gather(2, draft.clamp(min=0)[:, :, None])[:, :, 0]
    ratio = torch.where(draft >= 0, tgt - draft_lp, torch.full_like(tgt, NEG_INF))
    passes = ratio.cumsum(1) >= torch.log(tau.float())[:, None]
    first = passes.to(torch.int64).cumprod(1).sum(1)
    right = accepted_lengths(draft, draft_lp, target, tau, exact)
    return torch.where(exact, right, first)


def wrong_ignores_invalid(draft, draft_lp, target, tau, exact):
    """Treats -1 drafts as token 0 instead of ending the chain."""
    return accepted_lengths(draft.clamp(min=0), draft_lp, target, tau, exact)


def test_accepted_lengths_match_oracle():
    for seed in range(3):
        check_lengths_match_oracle(accepted_lengths, seed)


@pytest.mark.parametrize("wrong", [wrong_first_failure, wrong_ignores_invalid])
def test_oracle_check_rejects_wrong_rules(wrong):
    with pytest.raises(AssertionError, match="differ from the oracle"):
        check_lengths_match_oracle(wrong)


def prefix_lengths(draft, draft_lp, target, tau, exact):
    """The rule's k* of every prefix ([B, γ]), through the function the sampler runs."""
    lp, argmax = acceptance.DenseTarget(target).at_drafts(draft)
    return acceptance.prefix_accepted_lengths_from(draft, draft_lp, lp, argmax, tau, exact)


def wrong_prefixes_clipped(draft, draft_lp, target, tau, exact):
    """min(k*, g): what pooling drafts of every length assumed (a later pass not undone)."""
    k = accepted_lengths(draft, draft_lp, target, tau, exact)
    return k[:, None].clamp(max=torch.arange(1, draft.shape[1] + 1)[None, :])


def check_prefixes_match_oracle(prefix_fn, seed: int = 0) -> None:
    cases = [c for c in random_cases(seed) if far_from_threshold(c)]
    draft, draft_lp, target, tau, greedy, exact = as_batch(cases)
    got = prefix_fn(draft, draft_lp, target, tau, greedy & exact).tolist()
    bad = []
    for b, c in enumerate(cases):
        row, lps = draft[b].tolist(), draft_lp[b].tolist()
        want = [oracle_k(row[:g], lps[:g], c[2], c[3], c[4] and c[5])
                for g in range(1, draft.shape[1] + 1)]
        if got[b] != want:
            bad.append((b, got[b], want))
    assert not bad, f"{len(bad)} rows differ from the oracle, e.g. (row, got, want) {bad[:3]}"


def test_prefix_accepted_lengths_match_the_rule_on_each_prefix_alone():
    """Column g-1 is k* of a draft of the first g tokens (what the policy's per-length
    statistics count); its last column is the row's k*, and mtad_accept returns both."""
    for seed in range(3):
        check_prefixes_match_oracle(prefix_lengths, seed)
    with pytest.raises(AssertionError, match="differ from the oracle"):
        check_prefixes_match_oracle(wrong_prefixes_clipped)
    draft, draft_lp, target, tau, greedy, exact = as_batch(random_cases(5))
    B = draft.shape[0]
    res = mtad_accept(draft, draft_lp, target, tau.float(), exact,
                      NoiseKeys(greedy, torch.zeros(B, dtype=torch.int64),
                                torch.zeros(B, dtype=torch.int64)))
    assert torch.equal(res.prefix_accepted[:, -1], res.num_accepted)
    assert torch.equal(res.prefix_accepted, prefix_lengths(draft, draft_lp, target, tau.float(),
                                                           greedy & exact))
    # The case the per-length counts exist for: S_1 fails, S_2 passes. A draft of two tokens
    # has both accepted, a draft of its first token alone none.
    lp = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    q = torch.log(torch.tensor([[0.8, 0.1]]))
    got = prefix_lengths(torch.tensor([[0, 1]]), q, lp.expand(1, 3, 4).clone(),
                         torch.tensor([0.9]), torch.tensor([False]))
    assert got.tolist() == [[0, 2]]


def test_edge_cases_explicitly():
    V = 4
    lp = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    target = lp.expand(1, 4, V).clone()
    draft = torch.tensor([[0, 1, 2]])
    tau = lambda x: torch.tensor([x])  # noqa: E731
    no = torch.tensor([False])
    # p == q, tau = 1: all 3 accepted
    q = lp[[0, 1, 2]][None]
    assert accepted_lengths(draft, q, target, tau(1.0), no).item() == 3
    # S_1 = log(0.4/0.8) < log 0.9, S_2 = S_1 + log(0.3/0.1) > log 0.9 -> k* = 2 (not 0)
    q = torch.log(torch.tensor([[0.8, 0.1, 0.9]]))
    assert accepted_lengths(draft, q, target, tau(0.9), no).item() == 2
    # p = 0 at position 2 kills every k >= 2, whatever comes after
    t0 = target.clone()
    t0[0, 1, 1] = NEG_INF
    q = torch.log(torch.tensor([[0.1, 0.1, 1e-6]]))
    assert accepted_lengths(draft, q, t0, tau(0.5), no).item() == 1
    # tiny tau accepts everything with nonzero target probability
    q = torch.zeros(1, 3)
    assert accepted_lengths(draft, q, target, tau(1e-30), no).item() == 3
    # -1 at position 2 ends the chain
    assert accepted_lengths(torch.tensor([[0, -1, 2]]), q, target, tau(1e-30), no).item() == 1


def test_output_format_and_greedy_extra_token():
    B, gamma, V = 64, 4, 9
    gen = torch.Generator().manual_seed(1)
    target = (3 * torch.randn(B, gamma + 1, V, generator=gen)).log_softmax(-1)
    draft = torch.randint(0, V, (B, gamma), generator=gen)
    draft_lp = torch.log(torch.rand(B, gamma, generator=gen) * 0.9 + 0.05)
    tau = torch.rand(B, generator=gen) * 0.9 + 0.05  # per-row τ
    greedy = torch.arange(B) % 2 == 0
    exact = torch.arange(B) % 4 == 0
    res = mtad_accept(draft, draft_lp, target, tau, exact,
                      NoiseKeys(greedy, seeds=torch.arange(B), positions=torch.full((B,), 10)))
    out = res.output_token_ids
    assert out.dtype == torch.int32 and out.shape == (B, gamma + 1)
    for b in range(B):
        k = int(res.num_accepted[b])
        want_k = oracle_k(draft[b].tolist(), draft_lp[b].tolist(), target[b].double().tolist(),
                          float(tau[b]), bool(greedy[b] and exact[b]))
        assert k == want_k
        assert out[b, :k].tolist() == draft[b, :k].tolist()
        assert (out[b, k + 1:] == -1).all()
        if greedy[b]:
            assert int(out[b, k]) == int(target[b, k].argmax())
        else:
            assert torch.isfinite(target[b, k, out[b, k]])


def _extra_token_frequencies(extra_fn, target_row: torch.Tensor, k: int, num: int):
    B = num
    target = target_row.expand(B, -1, -1)
    tokens = extra_fn(target, torch.full((B,), k), torch.zeros(B, dtype=torch.bool),
                      torch.arange(B) * 7 + 3, torch.full((B,), 100))
    return torch.bincount(tokens, minlength=target_row.shape[-1])


def check_extra_token_distribution(extra_fn) -> None:
    """The extra token at position k*+1 must follow the target's processed distribution p̃."""
    V, gamma, k, num = 6, 3, 1, 60_000
    probs = torch.tensor([[0.3, 0.25, 0.2, 0.15, 0.1, 0.0]] * (gamma + 1))
    probs[k] = torch.tensor([0.05, 0.4, 0.3, 0.15, 0.1, 0.0])  # the row that must be used
    counts = _extra_token_frequencies(extra_fn, probs.log(), k, num)
    p = chi_square_pvalue({v: int(c) for v, c in enumerate(counts) if c},
                          {v: float(probs[k, v]) for v in range(V) if probs[k, v] > 0}, num)
    # Fixed seeds make this deterministic; 1e-4 keeps the false-alarm rate negligible while a
    # wrong distribution (differences of several percentage points, 60k samples) gives p ~ 0.
    assert p > 1e-4, f"extra-token frequencies {counts.tolist()} do not follow p̃ (p={p:.2e})"


def wrong_residual_extra(target, k, greedy, seeds, positions):
    """Samples the extra token from norm(max(p - q, 0)) like standard speculative sampling,
    with a fixed stand-in draft q (uniform)."""
    V = target.shape[-1]
    p = target.gather(1, k[:, None, None].expand(-1, 1, V))[:, 0].exp()
    resid = (p - 1.0 / V).clamp(min=0)
    return extra_tokens(resid.log()[:, None].expand(-1, target.shape[1], -1), torch.zeros_like(k),
                        greedy, seeds, positions)


def wrong_position_extra(target, k, greedy, seeds, positions):
    """Samples from the bonus position γ+1 instead of k*+1."""
    return extra_tokens(target, torch.full_like(k, target.shape[1] - 1), greedy, seeds, positions)


def test_extra_token_follows_target_distribution():
    check_extra_token_distribution(extra_tokens)


@pytest.mark.parametrize("wrong", [wrong_residual_extra, wrong_position_extra])
def test_extra_token_check_rejects_wrong_distributions(wrong):
    with pytest.raises(AssertionError, match="do not follow"):
        check_extra_token_distribution(wrong)


def test_extra_token_reproducible_per_seed_and_position():
    target = torch.randn(1, 3, 50).log_softmax(-1).expand(4, -1, -1)
    k = torch.tensor([1, 1, 1, 1])
    g = torch.zeros(4, dtype=torch.bool)
    a = extra_tokens(target, k, g, torch.tensor([5, 5, 6, 5]), torch.tensor([9, 9, 9, 9]))
    b = extra_tokens(target[:1], k[:1], g[:1], torch.tensor([5]), torch.tensor([9]))
    assert a[0] == a[1] == a[3] == b[0]
    many = extra_tokens(target[:1].expand(64, -1, -1), torch.ones(64, dtype=torch.int64),
                        torch.zeros(64, dtype=torch.bool), torch.arange(64), torch.full((64,), 9))
    assert len(set(many.tolist())) > 5  # different seeds, different samples
    assert acceptance.PLACEHOLDER_TOKEN_ID == -1
