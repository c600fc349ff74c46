"""The speculation policy's choices on a simulated engine: how close to the best arm it drafts,
fresh and after a history that mismeasured an arm (no model, no timing: exact cost lines and
acceptance drawn from known rates, so the best arm is known).

Each step asks ``vllm_mtad.policy.choose`` for (W, γ) with the code it imports, then
records what a draft of that width and length would have had accepted, every position passing
with the scenario's rate for that width (seeded). Reported per scenario, start and window of
steps: the mean over seeds of the chosen arm's true goodput over the best arm's (1 = always the
best arm). Scenarios:

- ``free b1``: batch 1, beam rows free, more beams accept more (0.85, 0.87, 0.9, 0.92 a
  position for W = 1..4): four beams, γ = 4 are the best;
- ``tie b1``: the same with the widths within 2 % of each other;
- ``costly b4``: batch 4, each beam row costs 8 ms a beam step: one beam or a short draft;
- ``burst b1-b16-b1``: ``free b1``'s rates, 2 ms a beam row, batch 1 for 300 steps, 16 for
  200, then 1 again (the load change a server sees): does the policy find batch 1's best arm
  again after the burst?

Starts: ``fresh`` (no statistics; the first 8 steps draft the configured W = 4, γ = 4, as the
engine does before its cost lines are ready), ``unlucky`` (the same, but those 8 drafts are
all rejected at their first token, as a warm-up request's opening can be: the start that froze
the policy on γ = 1 in the verdict, docs/policy-decisions.md#cold-start-measures-the-long-arm)
and ``history`` (one beam measured on 400 drafts at 0.85; four beams on 8 early drafts that had
1 of 4 tokens accepted: the case in benchmarks/reports/README.md, history-b4-then-b1). Only ``choose`` and
``AcceptanceStats.record_batch`` are used, so the script runs on earlier commits too (put
that commit's tree first on PYTHONPATH) to compare policies.

    python -m benchmarks.policy_sim --out DIR           # a few seconds
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections import Counter

from benchmarks.lib.report import markdown_table, write_outputs

SCENARIOS = {  # name: (acceptance rate a position by W, seconds a beam row costs, batch)
    "free b1": ({1: 0.85, 2: 0.87, 3: 0.9, 4: 0.92}, 0.0, 1),
    "tie b1": ({1: 0.88, 2: 0.885, 3: 0.89, 4: 0.895}, 0.0, 1),
    "costly b4": ({1: 0.85, 2: 0.87, 3: 0.9, 4: 0.92}, 0.008, 4),
    "burst b1-b16-b1": ({1: 0.85, 2: 0.87, 3: 0.9, 4: 0.92}, 0.002, 1),
}
# Batch size by step where a scenario's load changes: (first step, batch) in order.
SCHEDULES = {"burst b1-b16-b1": ((1, 1), (301, 16), (501, 1))}
STARTS = ("fresh", "unlucky", "history")
WINDOWS = ((0, 100), (100, 300), (300, 500), (500, 600), (600, 1000))


def _line(policy, intercept, slope, prefill=None):
    """A cost line fitted on exact samples over varied sizes (as the engine's own are)."""
    dims = 1 if prefill is None else 2
    m = policy.LinearCost(dims=dims)
    for i in range(40):
        x = (1, 4, 16, 48, 80)[i % 5]
        p = (0, 0, 150, 0, 600)[i % 5]
        m.add(x if dims == 1 else (x, p), intercept + slope * x + (prefill or 0.0) * p)
    return m


def costs(policy, beam_row: float):
    return policy.CostModel(verify=_line(policy, 0.1, 0.004, 0.004),
                            first_pass=_line(policy, 0.03, 0.001, 0.001),
                            beam_step=_line(policy, 0.03, beam_row),
                            rest=_line(policy, 0.001, 0.0))


def batch_at(scenario: str, step: int) -> int:
    """The scenario's batch size at ``step``."""
    size = SCENARIOS[scenario][2]
    for first, b in SCHEDULES.get(scenario, ()):
        if step >= first:
            size = b
    return size


def run(scenario: str, start: str, seed: int, steps: int = 1000) -> list[float]:
    """Per step: the chosen arm's true goodput over the best arm's at that step's batch."""
    from vllm_mtad import policy

    rates, beam_row, _ = SCENARIOS[scenario]
    c = costs(policy, beam_row)
    for B in {batch_at(scenario, s) for s in range(1, steps + 1)}:
        for _ in range(3):  # steps without a draft measured at this batch size
            c.no_draft_ratio(B).add(1.0, 1.0)

    def true_goodput(B, w, g):
        tokens = B * (1 + sum(rates[w] ** i for i in range(1, g + 1)))
        return tokens / c.step_time(policy.Batch({"sampled": B}), w, g)

    best = {B: max(true_goodput(B, w, g) for w in rates for g in range(5))
            for B in {batch_at(scenario, s) for s in range(1, steps + 1)}}
    stats = policy.new_stats(4, 4)
    if start == "history":
        r = 0.85
        stats["sampled"].record_batch(4, [(4, 1, 8)])
        stats["sampled"].record_batch(1, [(4, k, round(400 * (r ** k * (1 - r) if k < 4
                                                              else r ** 4))) for k in range(5)])
    truth = random.Random(1000 + seed)
    # The controller's exploration budget (vllm_mtad.policy.controller), where the code has one.
    budget = policy.ExplorationBudget() if hasattr(policy, "ExplorationBudget") else None
    out = []
    for step in range(1, steps + 1):
        B = batch_at(scenario, step)
        batch = policy.Batch({"sampled": B})
        if start in ("fresh", "unlucky") and step <= 8:
            w, g = 4, 4
        else:
            extra = {"budget": budget.seconds} if budget is not None else {}
            plan = policy.choose(batch, c, stats, policy.Bounds(4, 4), step=step, **extra)
            if budget is not None:
                budget.after(plan)
            w, g = plan.beam_width, plan.num_tokens
        out.append(true_goodput(B, w, g) / best[B])
        if g:
            cells = Counter()
            for _ in range(B):
                k = 0
                while k < g and truth.random() < rates[w] and not (start == "unlucky"
                                                                   and step <= 8):
                    k += 1
                cells[k] += 1
            stats["sampled"].record_batch(w, [(g, k, n) for k, n in cells.items()])
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--label", default="", help="a name for the code measured (the table's)")
    ap.add_argument("--out", default=None, help="output folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    rows = []
    for scenario in SCENARIOS:
        for start in STARTS:
            runs = [run(scenario, start, s) for s in range(args.seeds)]
            row = {"code": args.label, "scenario": scenario, "start": start}
            for lo, hi in WINDOWS:
                row[f"steps {lo + 1}-{hi}"] = statistics.mean(
                    statistics.mean(r[lo:hi]) for r in runs)
            rows.append(row)
            print(row, flush=True)
    cols = [("code", "code"), ("scenario", "scenario"), ("start", "start")] + [
        (f"steps {lo + 1}-{hi}", f"steps {lo + 1}-{hi}") for lo, hi in WINDOWS]
    table = markdown_table(rows, cols)
    write_outputs("policy_sim", {"args": vars(args), "scenarios": {
        k: {"rates": v[0], "beam_row_seconds": v[1], "batch": v[2]}
        for k, v in SCENARIOS.items()}, "rows": rows}, table, args.out)
    print(table)


if __name__ == "__main__":
    main()
