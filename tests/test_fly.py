"""FLy's acceptance rule (vllm_mtad/core/fly.py, a comparison baseline) against a plain
reference of the rule as published (arXiv 2511.22972; vLLM 0.33's fly.md), on hand-made cases
and on random ones."""

from __future__ import annotations

import math

import pytest
import torch

from vllm_mtad.core.fly import (default_window, fly_accepted_lengths, top_k_entropy)

pytestmark = pytest.mark.unit


def reference_length(native, deferrable, entropy, n, window, threshold=0.3):
    """One row, position by position: accept natively; at a native rejection defer it when
    the target is uncertain there, the window fits in the draft and the next ``window``
    tokens are accepted natively; otherwise stop."""
    k = 0
    for i in range(n):
        if native[i]:
            k += 1
            continue
        fits = i + window < n
        if (deferrable[i] and entropy[i] >= threshold and fits
                and all(native[j] for j in range(i + 1, i + window + 1))):
            k += 1
            continue
        break
    return k


def lengths(native, deferrable, entropy, n, window, threshold=0.3):
    t = lambda x, dtype: torch.tensor([x], dtype=dtype)  # noqa: E731
    return int(fly_accepted_lengths(t(native, torch.bool), t(deferrable, torch.bool),
                                    t(entropy, torch.float32), torch.tensor([n]), window,
                                    threshold)[0])


HIGH, LOW = 0.9, 0.1  # entropies above and below the default threshold (0.3)


@pytest.mark.parametrize("case, native, entropy, n, window, want", [
    # A rejection at 1 with an uncertain target and the next two accepted: deferred, all 4 in.
    ("deferral holds", [1, 0, 1, 1], [LOW, HIGH, LOW, LOW], 4, 2, 4),
    # The same rejection, but the window's second token is rejected natively: it stays.
    ("window breaks", [1, 0, 1, 0], [LOW, HIGH, LOW, HIGH], 4, 2, 1),
    # A confident target (low entropy) rejecting: a rejection, whatever follows.
    ("low entropy stays rejected", [1, 0, 1, 1], [LOW, LOW, LOW, LOW], 4, 2, 1),
    # The window would leave the draft (1 + 3 >= 4): no deferral at 1.
    ("draft too short for the window", [1, 0, 1, 1], [LOW, HIGH, LOW, LOW], 4, 3, 1),
    # A deferral at 0 whose window holds, then a native rejection at 3 outside any window.
    ("deferral then a later rejection", [0, 1, 1, 0, 1], [HIGH, LOW, LOW, LOW, LOW], 5, 2, 3),
    # Two deferrals in one draft, each with its window natively accepted.
    ("two deferrals", [0, 1, 1, 0, 1, 1, 1], [HIGH, 0, 0, HIGH, 0, 0, 0], 7, 2, 7),
    # Positions past the row's own draft length are not read.
    ("short row", [1, 1, 1, 1], [LOW] * 4, 2, 1, 2),
])
def test_fly_on_hand_made_cases(case, native, entropy, n, window, want):
    deferrable = [True] * len(native)
    assert reference_length(native, deferrable, entropy, n, window) == want, case
    assert lengths(native, deferrable, entropy, n, window) == want, case


def test_a_token_the_target_rules_out_is_never_deferred():
    native, entropy = [1, 0, 1, 1], [LOW, HIGH, LOW, LOW]
    assert lengths(native, [True, False, True, True], entropy, 4, 2) == 1
    assert lengths(native, [True, True, True, True], entropy, 4, 2) == 4


def test_fly_matches_the_reference_on_random_rows():
    gen = torch.Generator().manual_seed(0)
    B, G = 400, 8
    native = torch.rand(B, G, generator=gen) < 0.7
    deferrable = torch.rand(B, G, generator=gen) < 0.9
    entropy = torch.rand(B, G, generator=gen)
    n = torch.randint(1, G + 1, (B,), generator=gen)
    for window in range(0, 7):
        got = fly_accepted_lengths(native, deferrable, entropy, n, window)
        want = [reference_length(native[b].tolist(), deferrable[b].tolist(),
                                 entropy[b].tolist(), int(n[b]), window) for b in range(B)]
        assert got.tolist() == want, window
    # FLy only ever adds to what standard speculative decoding accepts.
    native_only = native.to(torch.int64).cumprod(1).sum(1).clamp(max=n)
    assert bool((fly_accepted_lengths(native, deferrable, entropy, n, 2) >= native_only).all())


def test_top_k_entropy_is_over_the_top_tokens_only():
    probs = torch.tensor([[0.5, 0.3, 0.1, 0.1], [1.0, 0.0, 0.0, 0.0]])
    got = top_k_entropy(probs.log(), top_k=3)
    want = -(0.5 * math.log(0.5) + 0.3 * math.log(0.3) + 0.1 * math.log(0.1))
    assert got[0].item() == pytest.approx(want, rel=1e-6)
    assert got[1].item() == 0.0  # a certain target: ruled-out tokens add nothing


def test_default_window():
    assert [default_window(g) for g in (2, 4, 7, 8, 16)] == [1, 3, 6, 6, 6]
    with pytest.raises(ValueError, match="num_speculative_tokens >= 2"):
        default_window(1)


def test_greedy_fly_outputs_accepted_drafts_then_the_targets_argmax_or_the_bonus():
    """FLy at T=0 in vLLM's output format, on a dense target: row 0's rejection at 1 is
    deferred (uncertain target, window of 1 natively accepted), so all 3 drafts and the bonus
    come out; row 1's confident target keeps its rejection at 1: one draft, then the target's
    argmax there; row 2 has one real draft token, rejected."""
    from vllm_mtad.core.acceptance import DenseTarget
    from vllm_mtad.core.fly import fly_accept_greedy

    V = 6
    argmax = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [5, 0, 0, 0]])  # [B, γ+1]
    logits = torch.full((3, 4, V), -4.0).scatter(2, argmax[:, :, None], 4.0)
    drafts = torch.tensor([[1, 5, 3], [1, 5, 3], [2, -1, -1]])
    entropy = torch.tensor([[0.0, 0.9, 0.0], [0.0, 0.1, 0.0], [0.9, 0.0, 0.0]])
    out = fly_accept_greedy(drafts, DenseTarget(logits.log_softmax(-1)), entropy,
                            torch.tensor([3, 3, 1]), torch.tensor([7, 7, 7]), window=1)
    assert out.num_accepted.tolist() == [3, 1, 0]
    assert out.output_token_ids.tolist() == [[1, 5, 3, 7], [1, 2, -1, -1], [5, -1, -1, -1]]
    assert out.prefix_accepted.tolist() == [[1, 2, 3], [1, 1, 1], [0, 0, 0]]


# --- FLy's probabilistic form (T > 0): the p/q test, deferral, and the residual -------------

def reference_sampled(p, q, drafts, u, n, window, threshold=0.3):
    """One sampled row by the published rule, position by position (plain Python over dense
    distributions): native[i] = u[i] <= p_i(x_i)/q_i(x_i); a native rejection is deferred when
    x_i is possible under both, the target's top-3 entropy there reaches the threshold, the
    window fits in the draft and the next ``window`` tokens pass natively. Returns k and the
    distribution the next token is drawn from: the residual norm(max(p_k − q_k, 0)) after a
    rejection (p_k where it is all 0), p_n after a whole draft."""
    def native(i):
        return u[i] <= p[i][drafts[i]] / q[i][drafts[i]]

    def entropy(i):
        top = sorted(p[i], reverse=True)[:3]
        return -sum(x * math.log(x) for x in top if x > 0)

    k = 0
    for i in range(n):
        x = drafts[i]
        if native(i) or (p[i][x] > 0 and q[i][x] > 0 and entropy(i) >= threshold
                         and i + window < n
                         and all(native(j) for j in range(i + 1, i + window + 1))):
            k += 1
            continue
        break
    if k == n:
        return k, list(p[n])
    r = [max(a - b, 0.0) for a, b in zip(p[k], q[k])]
    total = sum(r)
    return k, [x / total for x in r] if total > 0 else list(p[k])


def _sampled_case(p, q, drafts, seeds, window, threshold=0.3, sparse_draft=False):
    """fly_accept on B sampled rows sharing p [γ+1, V] and q [γ, V] (probabilities)."""
    from vllm_mtad.core import noise
    from vllm_mtad.core.acceptance import Bonus, DenseTarget
    from vllm_mtad.core.fly import FlyDraft, FlyGate, fly_accept
    from vllm_mtad.core.noise import NoiseKeys
    from vllm_mtad.core.processing import Candidates

    B, G = drafts.shape
    p_lp = p.log()[None].expand(B, -1, -1)
    q_lp = q.log()[None].expand(B, -1, -1)
    draft_lp = q_lp.gather(2, drafts.clamp(min=0)[:, :, None])[:, :, 0]
    target = DenseTarget(p_lp)
    entropy = top_k_entropy(p_lp[:, :G])
    keys = NoiseKeys(torch.zeros(B, dtype=torch.bool), seeds, torch.full((B,), 7),
                     any_sampled=True)
    n = (drafts >= 0).sum(1)

    def draft_at(index, needed):
        rows = q_lp[torch.arange(B), index]  # [B, V]
        if not sparse_draft:
            return Candidates(rows, None, torch.zeros(B, dtype=torch.bool))
        ids = rows.argsort(dim=1, descending=True)[:, :3]  # q's support (3 tokens)
        return Candidates(rows.gather(1, ids), ids, torch.zeros(B, dtype=torch.bool))

    out = fly_accept(FlyDraft(drafts, draft_lp, draft_at), target, entropy,
                     Bonus(n, torch.full((B,), 99)), FlyGate(window, threshold), keys)
    u = noise.uniform(noise.row_keys(seeds, torch.full((B,), 7), 0, noise.STREAM_FLY), G)
    return out, u


def _dist(rows):
    t = torch.tensor(rows, dtype=torch.float64)
    return t / t.sum(dim=-1, keepdim=True)


# γ = 4 positions over V = 5 tokens; q's support is tokens 0..2 at every position.
Q = _dist([[6, 3, 1, 0, 0]] * 4)
CERTAIN = [1e-9, 1e-9, 1, 1e-9, 1e-9]  # a confident target (entropy ~0): prefers token 2
UNSURE = [1e-9, 1, 1, 1, 1e-9]  # uncertain (entropy ln 3 > 0.3), p(0) ~ 0


@pytest.mark.parametrize("case, p_rows, drafts, window, want_k", [
    # Draft token 0 everywhere: p(0)/q(0) ~ 1e-9 rejects at 0 unless deferred; position 0's
    # window (1) holds when position 1 passes natively.
    ("deferral holds", [UNSURE, [1, 1e-9, 1e-9, 1e-9, 1e-9], UNSURE, UNSURE, UNSURE],
     [0, 0, 1, 1], 1, 4),
    # The same, but the window's token is rejected natively too: the rejection stays.
    ("window breaks", [UNSURE, UNSURE, UNSURE, UNSURE, UNSURE], [0, 0, 1, 1], 1, 0),
    # A confident target rejecting: a rejection, whatever follows.
    ("low entropy stays rejected", [CERTAIN, [1, 1e-9, 1e-9, 1e-9, 1e-9], UNSURE, UNSURE,
                                    UNSURE], [0, 0, 1, 1], 1, 0),
    # The window does not fit (0 + 3 >= 3 drafts): no deferral.
    ("draft too short for the window", [UNSURE, [1, 1e-9, 1e-9, 1e-9, 1e-9], UNSURE, UNSURE,
                                        UNSURE], [0, 0, 1, -1], 3, 0),
])
def test_sampled_fly_on_hand_made_cases(case, p_rows, drafts, window, want_k):
    p = _dist(p_rows)
    d = torch.tensor([drafts] * 64)
    out, u = _sampled_case(p.float(), Q.float(), d, torch.arange(64), window)
    n = sum(x >= 0 for x in drafts)
    for b in range(64):
        k, _ = reference_sampled(p.tolist(), Q.tolist(), drafts, u[b].tolist(), n, window)
        assert k == want_k == int(out.num_accepted[b]), (case, b)


def test_sampled_fly_matches_the_reference_and_samples_its_residual():
    """Random p and q: the accepted length equals the reference's row by row, and the token
    after it follows the reference's distribution (residual or bonus position), by a
    chi-square test over 20,000 rows; with the draft's distribution sparse or dense."""
    gen = torch.Generator().manual_seed(1)
    G, V, B = 3, 5, 20_000
    p = torch.rand(G + 1, V, generator=gen, dtype=torch.float64) ** 3
    p = p / p.sum(-1, keepdim=True)
    q = torch.rand(G, V, generator=gen, dtype=torch.float64).mul(
        torch.tensor([1, 1, 1, 0, 0], dtype=torch.float64))  # q's support: tokens 0..2
    q = q / q.sum(-1, keepdim=True)
    drafts = torch.tensor([[0, 1, 2]] * B)
    for sparse in (False, True):
        out, u = _sampled_case(p.float(), q.float(), drafts, torch.arange(B) + 17, window=1,
                               threshold=0.5, sparse_draft=sparse)
        got_k = out.num_accepted.tolist()
        want = [reference_sampled(p.tolist(), q.tolist(), [0, 1, 2], u[b].tolist(), G, 1, 0.5)
                for b in range(B)]
        assert got_k == [k for k, _ in want]
        for k in set(got_k) - {G}:  # rejected rows: the token after k draws from the residual
            rows = [b for b in range(B) if got_k[b] == k]
            if len(rows) < 500:
                continue
            tokens = out.output_token_ids[rows, k].tolist()
            expect = torch.tensor(want[rows[0]][1]) * len(rows)
            seen = torch.bincount(torch.tensor(tokens), minlength=V).double()
            live = expect > 0
            assert float(seen[~live].sum()) == 0.0  # never a token the residual rules out
            chi2 = float(((seen[live] - expect[live]) ** 2 / expect[live]).sum())
            assert chi2 < 20.5, (sparse, k, chi2)  # df ≤ 4: p ≈ 0.0004


def test_sampled_fly_reads_the_draft_distribution_only_where_it_draws_the_residual():
    """A mixed batch: a sampled row rejected at 0 (the only row that reads q̃), a greedy row,
    a row in its prefill step (no draft), a row whose drafts are not the drafter's (-1 within
    its count: nothing rejected, the target's own token) and a sampled row accepted whole.
    q̃ of the rows not read is NaN: it must not reach any output."""
    from vllm_mtad.core.acceptance import Bonus, DenseTarget
    from vllm_mtad.core.fly import FlyDraft, FlyGate, fly_accept
    from vllm_mtad.core.noise import NoiseKeys
    from vllm_mtad.core.processing import Candidates

    p = _dist([CERTAIN] * 5).float()  # the target is sure of token 2 everywhere
    drafts = torch.tensor([[0, 0, 1, 1], [2, 2, 2, 2], [-1] * 4, [-1] * 4, [2, 2, 2, 2]])
    n = torch.tensor([4, 4, 0, 4, 4])
    B, G = drafts.shape
    p_lp = p.log()[None].expand(B, -1, -1)
    q_lp = Q.float().log()
    draft_lp = torch.where(drafts >= 0, q_lp[0][drafts.clamp(min=0)], 0.0)
    seen = []

    def draft_at(index, needed):
        seen.append(needed.tolist())
        rows = q_lp[index].clone()
        rows[~needed] = float("nan")
        return Candidates(rows, None, torch.zeros(B, dtype=torch.bool))

    greedy = torch.tensor([False, True, False, False, False])
    keys = NoiseKeys(greedy, torch.arange(B), torch.full((B,), 3), any_sampled=True)
    out = fly_accept(FlyDraft(drafts, draft_lp, draft_at), DenseTarget(p_lp),
                     top_k_entropy(p_lp[:, :G]), Bonus(n, torch.full((B,), 99)),
                     FlyGate(1, 0.3), keys)
    assert seen == [[True, False, False, False, False]]
    assert out.num_accepted.tolist() == [0, 4, 0, 0, 4]
    # rejected at 0: the residual max(p̃ − q̃, 0) is all on token 2; no draft: the bonus;
    # drafts not the drafter's: the target's own token; accepted whole: the bonus
    assert out.output_token_ids[:, 0].tolist() == [2, 2, 99, 2, 2]
    assert out.output_token_ids[[1, 4], 4].tolist() == [99, 99]


def test_sampled_fly_without_deferral_is_lossless():
    """With an unreachable entropy threshold FLy is standard speculative sampling: a draft
    sampled from q, the p/q test and the residual give the target's own distribution at the
    first position (chi-square over 40,000 rows)."""
    gen = torch.Generator().manual_seed(2)
    V, B = 6, 40_000
    p = torch.rand(2, V, generator=gen, dtype=torch.float64) ** 2
    p = p / p.sum(-1, keepdim=True)
    q = torch.rand(1, V, generator=gen, dtype=torch.float64) ** 2
    q = q / q.sum(-1, keepdim=True)
    drafts = torch.multinomial(q[0], B, replacement=True, generator=gen)[:, None]
    out, _ = _sampled_case(p.float(), q.float(), drafts, torch.arange(B), window=0,
                           threshold=math.inf)
    seen = torch.bincount(out.output_token_ids[:, 0], minlength=V).double()
    expect = p[0] * B
    chi2 = float(((seen - expect) ** 2 / expect).sum())
    assert chi2 < 25.7, chi2  # df 5: p ≈ 0.0001


def test_residual_sparse_and_dense_agree():
    from vllm_mtad.core.fly import residual
    from vllm_mtad.core.processing import Candidates

    gen = torch.Generator().manual_seed(3)
    V = 7
    p = torch.rand(2, V, generator=gen).softmax(-1)
    q = torch.rand(2, V, generator=gen).mul(torch.tensor([1, 1, 1, 1, 0, 0, 0])).add(1e-30)
    q = q / q.sum(-1, keepdim=True)
    none = torch.zeros(2, dtype=torch.bool)
    want = (p - q).clamp(min=0)
    ids = torch.tensor([[6, 0, 2, 1, 3, 4, 5]] * 2)
    qids = torch.tensor([[3, 1, 0, 2]] * 2)
    for target, draft in (
            (Candidates(p.log(), None, none), Candidates(q.log(), None, none)),
            (Candidates(p.log(), None, none), Candidates(q.log().gather(1, qids), qids, none)),
            (Candidates(p.log().gather(1, ids), ids, none), Candidates(q.log(), None, none)),
            (Candidates(p.log().gather(1, ids), ids, none),
             Candidates(q.log().gather(1, qids), qids, none))):
        r = residual(target, draft)
        dense = r.logprobs.exp() if r.token_ids is None else torch.zeros(2, V).scatter(
            1, r.token_ids, r.logprobs.exp())
        assert torch.allclose(dense, want, atol=1e-6)
    same = residual(Candidates(p.log(), None, none), Candidates(p.log(), None, none))
    assert torch.allclose(same.logprobs.exp(), p)  # p ≤ q everywhere: p itself
