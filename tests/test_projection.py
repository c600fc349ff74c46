"""The step-cost model behind the GPU projection (benchmarks/lib/projection.py)."""

from __future__ import annotations

import pytest

from benchmarks.lib.projection import (fit_linear_costs, gpu_costs, linear_costs,
                                       step_seconds, tokens_per_second)

pytestmark = pytest.mark.unit


def test_step_is_one_target_pass_a_first_draft_pass_and_the_beam_steps():
    costs = linear_costs((1.0, 0.01), (0.2, 0.001))
    # B=4, W=2, γ=3: target over 16 tokens, draft first pass over 4 rows, 2 steps of 8 rows.
    assert step_seconds(costs, 4, 2, 3) == pytest.approx(1.16 + 0.204 + 2 * 0.208)
    assert step_seconds(costs, 4, 2, 0) == pytest.approx(1.04)  # the target alone
    assert tokens_per_second(costs, 4, 2, 3, 2.5) == pytest.approx(10 / 1.78)


def test_gpu_model_is_flat_up_to_its_bounds():
    gpu = gpu_costs(0.1, flat_tokens=512, free_rows=64)
    assert gpu.target(1) == gpu.target(512) == 1.0 and gpu.target(1024) == 2.0
    assert gpu.draft(1) == gpu.draft(64) == pytest.approx(0.1)
    assert gpu.draft(128) == pytest.approx(0.2)
    # Batch 1, γ=8: W=4 beams cost no more than one chain; the ratio is tokens per pass.
    assert step_seconds(gpu, 1, 4, 8) == step_seconds(gpu, 1, 1, 8) == pytest.approx(1.8)


def test_fit_recovers_the_lines_it_was_made_from():
    truth = linear_costs((0.30, 0.004), (0.05, 0.002))
    grid = [(b, w, g) for b in (1, 4) for w in (1, 4) for g in (4, 8)]
    fitted = fit_linear_costs([(b, w, g, step_seconds(truth, b, w, g)) for b, w, g in grid])
    for b, w, g in grid + [(16, 8, 8)]:
        assert step_seconds(fitted, b, w, g) == pytest.approx(step_seconds(truth, b, w, g))
    with pytest.raises(ValueError, match=">= 4 measured steps"):
        fit_linear_costs([(1, 1, 4, 1.0)] * 3)
