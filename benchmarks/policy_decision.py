"""What one decision of the speculation policy costs on the host (no model; vLLM only for the
environment record).

The policy prices every (W, γ) arm before each step (``vllm_mtad.core.policy.choose``). This
times one decision at a few batch sizes on cost lines and acceptance statistics fed synthetic
samples shaped like the real pair's (a target pass ~0.1 s + 4 ms a token, a draft pass ~30 ms),
requests of the paper's sampling class with 1–48 tokens left, W ≤ 4, γ ≤ 4: the step the
engine would pay before it runs anything.

    python -m benchmarks.policy_decision                # B = 1, 4, 16, 48
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from benchmarks.common import environment, markdown_table, write_outputs


def fed_policy(batch_size: int, seed: int = 0):
    """(costs, stats, bounds, batch) after 64 cost samples and 200 recorded drafts."""
    from vllm_mtad.core import policy

    rng = random.Random(seed)
    B = batch_size
    costs = policy.CostModel()
    for _ in range(64):
        n = rng.randint(1, 5) * B
        costs.verify.add((n, rng.randint(0, 50)), 0.1 + 0.004 * n)
        costs.first_pass.add((n, rng.randint(0, 50)), 0.03 + 0.001 * n)
        costs.beam_step.add(B * rng.randint(1, 4), 0.03 + 0.001 * B)
        costs.rest.add(B, 0.005)
    for _ in range(4):
        costs.no_draft_ratio(B).add(0.3, 0.28)
    stats = policy.new_stats(4, 4)
    for _ in range(200):
        g = rng.randint(1, 4)
        stats["sampled"].record(rng.randint(1, 4), g, rng.randint(0, g))
    bounds = policy.Bounds(4, 4, 1, 0)
    left = [rng.randint(1, 48) for _ in range(B)]
    batch = policy.Batch.from_step(["sampled"] * B, B, 0, 0.0, tokens_left=left, horizon=4,
                                   prompt_tokens=[150] * B, max_tokens=[48] * B)
    return costs, stats, bounds, batch


def time_decisions(batch_size: int, seconds: float) -> float:
    """Mean seconds of one ``choose`` (a step that does not explore: step numbers 1, 2, ...
    skip every 16th), decisions repeated for ``seconds``."""
    from vllm_mtad.core import policy

    costs, stats, bounds, batch = fed_policy(batch_size)
    policy.choose(batch, costs, stats, bounds, 1)  # warm-up
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        n += 1
        policy.choose(batch, costs, stats, bounds, n if n % 16 else n + 1)
    return (time.perf_counter() - start) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 48])
    ap.add_argument("--seconds", type=float, default=0.5, help="per batch size and repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for B in args.batches:
        ms = [time_decisions(B, args.seconds) * 1e3 for _ in range(args.repeats)]
        rows.append({"batch": B, "ms_median": statistics.median(ms), "ms_min": min(ms),
                     "ms_max": max(ms)})
    table = markdown_table(rows, [("batch", "batch"), ("ms_median", "ms a decision (median)"),
                                  ("ms_min", "min"), ("ms_max", "max")])
    out = write_outputs("policy_decision", {"benchmark": "policy_decision",
                                            "environment": environment(), "args": vars(args),
                                            "rows": rows}, table, args.out)
    print(table)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
