"""The quality benchmark's statistics (benchmarks/lib/stats.py) on known cases."""

from __future__ import annotations

import itertools
import random
from math import comb

import pytest

from benchmarks.lib.stats import (bootstrap_mean, paired_bootstrap_diff, pareto_frontier,
                                      pass_at_k)

pytestmark = pytest.mark.unit


def test_pass_at_k_known_cases():
    assert pass_at_k(5, 5, 1) == 1.0  # all pass
    assert pass_at_k(5, 0, 1) == 0.0  # none pass
    assert pass_at_k(3, 1, 3) == 1.0 and pass_at_k(3, 0, 3) == 0.0  # n = k: any pass or none
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the pass rate


def test_pass_at_k_equals_the_binomial_formula_and_brute_force():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1.0 - comb(n - c, k) / comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
    # brute force: the share of k-subsets of 6 samples (2 passing) with at least one pass
    samples = [True, True, False, False, False, False]
    subsets = list(itertools.combinations(samples, 3))
    assert pass_at_k(6, 2, 3) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


def test_pass_at_k_refuses_impossible_counts():
    for n, c, k in ((3, 4, 1), (3, 1, 0), (3, 1, 4), (3, -1, 1)):
        with pytest.raises(ValueError, match="pass_at_k needs"):
            pass_at_k(n, c, k)


def test_identical_configurations_differ_by_an_interval_containing_zero():
    rng = random.Random(1)
    a = [float(rng.random() < 0.6) for _ in range(164)]
    d, lo, hi = paired_bootstrap_diff(a, list(a))
    assert d == 0.0 and lo <= 0.0 <= hi


def test_a_real_difference_excludes_zero_and_a_noisy_one_does_not():
    rng = random.Random(2)
    base = [float(rng.random() < 0.5) for _ in range(164)]
    better = [1.0 if (b or rng.random() < 0.5) else 0.0 for b in base]  # ~+25 points
    d, lo, hi = paired_bootstrap_diff(better, base)
    assert d > 0.15 and lo > 0.0
    flip = [1.0 - b if i < 4 else b for i, b in enumerate(base)]  # 4 problems of 164 flipped
    d, lo, hi = paired_bootstrap_diff(flip, base)
    assert lo < 0.0 < hi


def test_bootstrap_mean_interval_brackets_the_mean_and_shrinks_with_more_problems():
    rng = random.Random(3)
    small = [float(rng.random() < 0.5) for _ in range(32)]
    large = [float(rng.random() < 0.5) for _ in range(640)]
    m, lo, hi = bootstrap_mean(small)
    assert lo <= m <= hi and m == sum(small) / len(small)
    m2, lo2, hi2 = bootstrap_mean(large)
    assert hi2 - lo2 < hi - lo
    assert bootstrap_mean([1.0] * 10) == (1.0, 1.0, 1.0)


def test_pareto_frontier():
    points = [(10, 0.5), (20, 0.4), (15, 0.6), (5, 0.6), (20, 0.3), (25, 0.1)]
    # (5, 0.6) is matched in quality by the faster (15, 0.6); (20, 0.3) by (20, 0.4)
    assert pareto_frontier(points) == [2, 1, 5]
    assert pareto_frontier([(1, 1), (1, 1)]) == [0, 1]  # ties dominate neither
