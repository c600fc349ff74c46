"""The benchmarks' statistics, as small tested functions.

- ``summary``: median, min and max of a configuration's repeats (the speed tables' cells).

- ``pass_at_k``: the unbiased estimator of pass@k from n samples of which c pass (Chen et al.,
  2021, "Evaluating Large Language Models Trained on Code", eq. 1): 1 − C(n−c, k) / C(n, k).
- ``bootstrap_mean``: a configuration's mean over problems with a 95 % percentile interval from
  resampling the problems.
- ``paired_bootstrap_diff``: the difference of two configurations' means over the *same*
  problems, resampling problems jointly (the pairing removes the between-problem variance that
  two independent intervals would count twice).
- ``pareto_frontier``: the points no other point beats on both speed and quality.
- ``ratio_interval``: the ratio of two configurations' means over paired measurements (the
  same requests), with a 95 % percentile interval from resampling the pairs.
"""

from __future__ import annotations

import random
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples drawn without replacement from the n passes), unbiased."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # 1 − Π_{i=n−c+1}^{n} (1 − k/i): the ratio of binomials without overflowing.
    fail = 1.0
    for i in range(n - c + 1, n + 1):
        fail *= 1.0 - k / i
    return 1.0 - fail


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def bootstrap_mean(values: Sequence[float], reps: int = 2000, seed: int = 0,
                   level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the mean over problems and its percentile bootstrap interval."""
    if not values:
        raise ValueError("bootstrap_mean needs at least one value")
    return paired_bootstrap_diff(values, [0.0] * len(values), reps, seed, level)


def paired_bootstrap_diff(a: Sequence[float], b: Sequence[float], reps: int = 2000,
                          seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """(mean(a − b), low, high) over paired per-problem values a[i], b[i]."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired values need equal, non-zero lengths, got {len(a)} and {len(b)}")
    diffs = [x - y for x, y in zip(a, b)]
    n = len(diffs)
    rng = random.Random(seed)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(reps))
    tail = (1.0 - level) / 2
    return sum(diffs) / n, _percentile(means, tail), _percentile(means, 1.0 - tail)


def pareto_frontier(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points (speed, quality) that no other point matches or beats on both with
    at least one strictly better, ordered by speed."""
    keep = []
    for i, (s, q) in enumerate(points):
        dominated = any((s2 >= s and q2 >= q) and (s2 > s or q2 > q)
                        for j, (s2, q2) in enumerate(points) if j != i)
        if not dominated:
            keep.append(i)
    return sorted(keep, key=lambda i: points[i][0])


def summary(values: list[float]) -> dict:
    """{"median", "min", "max", "n"} of ``values`` (a configuration's repeats)."""
    import statistics

    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def ratio_interval(a: Sequence[float], b: Sequence[float], reps: int = 2000, seed: int = 0,
                   level: float = 0.95) -> tuple[float, float, float]:
    """(mean(a) / mean(b), low, high) over paired values a[i], b[i] (the same request in the
    same repeat, timed on two configurations), resampling the pairs jointly."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired values need equal, non-zero lengths, got {len(a)} and {len(b)}")
    n = len(a)
    rng = random.Random(seed)
    ratios = []
    for _ in range(reps):
        idx = [rng.randrange(n) for _ in range(n)]
        den = sum(b[i] for i in idx)
        ratios.append(sum(a[i] for i in idx) / den if den else float("inf"))
    ratios.sort()
    tail = (1.0 - level) / 2
    return (sum(a) / sum(b), _percentile(ratios, tail), _percentile(ratios, 1.0 - tail))


def tokens_per_pass(records: list[dict]) -> float:
    """Tokens per target pass pooled over records with "steps" (verify steps with a draft) and
    "accepted" (draft tokens accepted): (accepted + steps) / steps, the bonus token counted."""
    steps = sum(r["steps"] for r in records)
    return (sum(r["accepted"] for r in records) + steps) / max(steps, 1)
