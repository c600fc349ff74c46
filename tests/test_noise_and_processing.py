"""The counter-based noise generator and the shared processed-distribution helper."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers import chi2_sf, chi_square_pvalue
from vllm_mtad.core import noise
from vllm_mtad.core.processing import processed_logprobs

pytestmark = pytest.mark.unit


def test_chi2_sf_against_table_values():
    # Standard table: 95th percentiles of chi-square with 1 and 10 degrees of freedom.
    assert chi2_sf(3.841, 1) == pytest.approx(0.05, abs=1e-4)
    assert chi2_sf(18.307, 10) == pytest.approx(0.05, abs=1e-4)
    assert chi2_sf(2.0, 2) == pytest.approx(math.exp(-1), rel=1e-9)


def test_mix32_is_a_bijection_on_a_sample_and_stays_32_bit():
    x = torch.arange(0, 1 << 20, dtype=torch.int64) * 4093 + 17
    h = noise.mix32(x & 0xFFFFFFFF)
    assert h.min() >= 0 and h.max() < 2**32
    assert h.unique().numel() == x.numel()


def test_uniform_is_uniform_and_independent_across_rows_and_columns():
    keys = noise.row_keys(torch.arange(200), torch.full((200,), 5), 1, noise.STREAM_DRAFT)
    u = noise.uniform(keys, 5000)  # 1M values
    assert u.min() > 0 and u.max() < 1
    counts = torch.histc(u.float(), bins=100, min=0, max=1)
    p = chi_square_pvalue({i: int(c) for i, c in enumerate(counts)},
                          {i: 0.01 for i in range(100)}, u.numel())
    assert p > 1e-4
    # Neighbouring rows and columns are uncorrelated (|r| < 5 sigma of 1/sqrt(n)).
    r_rows = torch.corrcoef(torch.stack([u[:-1].flatten(), u[1:].flatten()]))[0, 1]
    r_cols = torch.corrcoef(torch.stack([u[:, :-1].flatten(), u[:, 1:].flatten()]))[0, 1]
    assert abs(r_rows) < 5 / math.sqrt(u.numel()) and abs(r_cols) < 5 / math.sqrt(u.numel())


def test_keys_depend_on_every_field():
    base = noise.row_keys(torch.tensor([7]), torch.tensor([3]), 2, noise.STREAM_DRAFT)
    for other in (noise.row_keys(torch.tensor([8]), torch.tensor([3]), 2, noise.STREAM_DRAFT),
                  noise.row_keys(torch.tensor([7 + (1 << 40)]), torch.tensor([3]), 2, noise.STREAM_DRAFT),
                  noise.row_keys(torch.tensor([7]), torch.tensor([4]), 2, noise.STREAM_DRAFT),
                  noise.row_keys(torch.tensor([7]), torch.tensor([3]), 3, noise.STREAM_DRAFT),
                  noise.row_keys(torch.tensor([7]), torch.tensor([3]), 2, noise.STREAM_EXTRA_TOKEN)):
        assert other.item() != base.item()
    again = noise.row_keys(torch.tensor([7]), torch.tensor([3]), 2, noise.STREAM_DRAFT)
    assert again.item() == base.item()


def test_an_int_step_keys_as_the_same_step_in_a_tensor():
    """row_keys keeps an int step on the host (a tensor made from it would be a copy a CUDA
    graph cannot capture); the keys are the ones a [B] tensor of that step gives, for steps
    past 32 bits too."""
    seeds, pos = torch.tensor([7, 1 << 40, 3]), torch.tensor([3, 9, 1 << 33])
    import numpy as np

    for step in (0, 2, 7, (1 << 32) + 5):
        as_int = noise.row_keys(seeds, pos, step, noise.STREAM_DRAFT)
        as_tensor = noise.row_keys(seeds, pos, torch.full((3,), step), noise.STREAM_DRAFT)
        assert torch.equal(as_int, as_tensor)
        assert torch.equal(as_int, noise.row_keys(seeds, pos, np.int64(step), noise.STREAM_DRAFT))
        assert torch.equal(as_int, noise.row_keys(seeds, pos, torch.tensor(step),
                                                  noise.STREAM_DRAFT))  # a 0-d tensor
    assert not torch.equal(noise.row_keys(seeds, pos, 2, noise.STREAM_DRAFT),
                           noise.row_keys(seeds, pos, 3, noise.STREAM_DRAFT))


def test_gumbel_moments():
    g = noise.gumbel(noise.row_keys(torch.arange(100), torch.zeros(100, dtype=torch.int64), 1, 1),
                     10_000).double()
    # Standard Gumbel: mean = Euler-Mascheroni constant, variance = pi^2 / 6.
    assert g.mean().item() == pytest.approx(0.5772, abs=0.01)
    assert g.var().item() == pytest.approx(math.pi ** 2 / 6, rel=0.02)


# --- processed_logprobs against a row-by-row definition ------------------------------------

def definition(logits: list[float], temp: float, top_k: int, top_p: float, min_p: float):
    """vLLM's processing written out for one row with Python lists."""
    V = len(logits)
    if temp < 1e-5:
        scaled = list(logits)
    else:
        scaled = [x / temp for x in logits]
        keep = [True] * V
        probs = torch.tensor(scaled, dtype=torch.float64).softmax(0).tolist()
        if min_p > 0:
            keep = [keep[i] and probs[i] >= min_p * max(probs) for i in range(V)]
        if 0 < top_k < V:
            kth = sorted((scaled[i] for i in range(V) if keep[i]), reverse=True)
            kth = sorted(scaled, reverse=True)[top_k - 1]
            keep = [keep[i] and scaled[i] >= kth for i in range(V)]
        if top_p < 1:
            live = sorted((i for i in range(V) if keep[i]), key=lambda i: scaled[i])  # ascending
            p = torch.tensor([scaled[i] for i in live], dtype=torch.float64).softmax(0).tolist()
            cum = 0.0
            for j, i in enumerate(live[:-1]):
                cum += p[j]
                if cum <= 1 - top_p:
                    keep[i] = False
        scaled = [scaled[i] if keep[i] else -math.inf for i in range(V)]
    return torch.tensor(scaled, dtype=torch.float64).log_softmax(0).tolist()


def test_processed_logprobs_match_definition():
    gen = torch.Generator().manual_seed(0)
    rows = []
    for i in range(60):
        V = 12
        logits = (3 * torch.randn(V, generator=gen)).round(decimals=1)  # rounding creates ties
        rows.append((logits, [0.0, 0.5, 1.0, 1.7][i % 4], [0, 1, 3, 12, 20][i % 5],
                     [1.0, 0.9, 0.5, 0.05][i % 4 if i % 3 else 0], [0.0, 0.1][i % 2]))
    logits = torch.stack([r[0] for r in rows])
    got = processed_logprobs(logits, torch.tensor([r[1] for r in rows]),
                             torch.tensor([r[2] for r in rows]),
                             torch.tensor([r[3] for r in rows]), torch.tensor([r[4] for r in rows]))
    for b, (lg, t, k, p, m) in enumerate(rows):
        want = torch.tensor(definition(lg.tolist(), t, k, p, m), dtype=torch.float32)
        assert torch.equal(torch.isinf(got[b]), torch.isinf(want)), f"row {b}: support differs"
        fin = torch.isfinite(want)
        assert torch.allclose(got[b][fin], want[fin], atol=1e-5), f"row {b}"


def test_greedy_rows_are_unprocessed():
    logits = torch.randn(2, 20)
    out = processed_logprobs(logits, torch.tensor([0.0, 0.0]), torch.tensor([2, 2]),
                             torch.tensor([0.5, 0.5]), torch.tensor([0.3, 0.3]))
    assert torch.allclose(out, logits.log_softmax(-1))
