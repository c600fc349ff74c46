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
