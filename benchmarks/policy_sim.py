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
- ``requests b1 g8``: batch 1, γ ≤ 8, 2 ms a beam row, a stream of 160-token requests, each
  code or chat at random (0.97–0.985 and 0.90–0.93 a position for W = 1..4): rates change
  with the request, so a length measured on one or two requests (a cold start) is not what
  it is worth over many (the verdict's trace at 9bcfb7d). This scenario's figure is the
  chosen arms' goodput over the best *fixed* arm's, on the same states (expected tokens and
  time summed over each window's steps).

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
    "requests b1 g8": ({1: 0.97, 2: 0.975, 3: 0.98, 4: 0.985}, 0.002, 1),
}
# Scenarios of requests whose acceptance varies: (rates of the other kind, request length); a
# request is either kind, at random.
REQUESTS = {"requests b1 g8": ({1: 0.9, 2: 0.91, 3: 0.92, 4: 0.93}, 160)}
MAX_TOKENS = {"requests b1 g8": 8}  # γ bound where not 4
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


class _Requests:
    """The stream of requests a ``REQUESTS`` scenario's one row works through."""

    def __init__(self, scenario: str, rng: random.Random):
        self.code = SCENARIOS[scenario][0]
        self.chat, self.length = REQUESTS[scenario]
        self.rng = rng
        self.number = -1  # of the current request
        self._next()

    def _next(self) -> None:
        self.kind = self.code if self.rng.random() < 0.5 else self.chat
        self.done = 0  # tokens of the request made so far
        self.number += 1

    def left(self) -> int:
        return self.length - self.done

    def rates(self, w: int, g: int) -> list[float]:
        """The acceptance rates of the next ``g`` draft positions (none past the end)."""
        return [self.kind[w]] * min(g, self.left() - 1)

    def advance(self, tokens: int) -> None:
        self.done += tokens
        if self.done >= self.length:
            self._next()


def _expected_tokens(rates: list[float]) -> float:
    """1 + E[accepted] of a draft whose positions pass at ``rates`` until one fails."""
    total, p = 1.0, 1.0
    for r in rates:
        p *= r
        total += p
    return total


def _draw(rng: random.Random, rates: list[float]) -> int:
    k = 0
    while k < len(rates) and rng.random() < rates[k]:
        k += 1
    return k


def _best_fixed_arm(policy, c, scenario: str, G: int, steps: int = 20000) -> tuple:
    """The fixed (W, γ) with the highest long-run goodput on the scenario's requests."""
    best, value = None, -1.0
    for w in SCENARIOS[scenario][0]:
        for g in range(G + 1):
            if g == 0 and w > 1:
                continue
            rng = random.Random(7)
            stream, tokens, seconds = _Requests(scenario, rng), 0, 0.0
            for _ in range(steps):
                k = 1 + _draw(rng, stream.rates(w, g)) if g else 1
                tokens += k
                seconds += c.step_time(policy.Batch({"sampled": 1}), w, g)
                stream.advance(k)
            if tokens / seconds > value:
                best, value = (w, g), tokens / seconds
    return best


_FIXED: dict = {}  # scenario -> its best fixed arm (the same for every seed and start)


def run(scenario: str, start: str, seed: int, steps: int = 1000) -> list[tuple]:
    """Per step: (expected tokens, seconds) of the chosen arm and of the best arm, at that
    step's batch (``REQUESTS`` scenarios: the best fixed arm, in the step's state)."""
    from vllm_mtad import policy

    rates, beam_row, _ = SCENARIOS[scenario]
    G = MAX_TOKENS.get(scenario, 4)
    c = costs(policy, beam_row)
    for B in {batch_at(scenario, s) for s in range(1, steps + 1)}:
        for _ in range(3):  # steps without a draft measured at this batch size
            c.no_draft_ratio(B).add(1.0, 1.0)
    truth = random.Random(1000 + seed)
    stream = _Requests(scenario, truth) if scenario in REQUESTS else None

    def priced(B, w, g):
        """(expected tokens, seconds) of (W, γ) at batch B in the current state."""
        r = stream.rates(w, g) if stream else [rates[w]] * g
        return B * _expected_tokens(r), c.step_time(policy.Batch({"sampled": B}), w, g)

    if stream:
        if scenario not in _FIXED:
            _FIXED[scenario] = _best_fixed_arm(policy, c, scenario, G)
        fixed = _FIXED[scenario]
    else:
        best = {B: max(((w, g) for w in rates for g in range(G + 1)),
                       key=lambda a: priced(B, *a)[0] / priced(B, *a)[1])
                for B in {batch_at(scenario, s) for s in range(1, steps + 1)}}
    stats = policy.new_stats(4, G)
    if start == "history":
        r = 0.85
        stats["sampled"].record_batch(4, [(4, 1, 8)])
        stats["sampled"].record_batch(1, [(4, k, round(400 * (r ** k * (1 - r) if k < 4
                                                              else r ** 4))) for k in range(5)])
        if hasattr(stats["sampled"], "long_requests"):  # a history of many requests: no cold start
            stats["sampled"].long_requests = 400
    # The controller's exploration budget (vllm_mtad.policy.controller), where the code has one.
    budget = policy.ExplorationBudget() if hasattr(policy, "ExplorationBudget") else None
    out, long_requests = [], set()  # the requests that drafted the longest length
    for step in range(1, steps + 1):
        B = batch_at(scenario, step)
        if start in ("fresh", "unlucky") and step <= 8:
            w, g = 4, G
        else:
            batch = policy.Batch({"sampled": B})
            if stream and stream.left() <= G:  # what the engine tells the policy of a row
                batch = policy.Batch({"sampled": B}, remaining_tokens=float(stream.left()),
                                     short=((("sampled", stream.left()), B),))
            elif stream:
                batch = policy.Batch({"sampled": B}, remaining_tokens=float(stream.left()))
            extra = {"budget": budget.seconds} if budget is not None else {}
            plan = policy.choose(batch, c, stats, policy.Bounds(4, G), step=step, **extra)
            if budget is not None:
                budget.after(plan)
            w, g = plan.beam_width, plan.num_tokens
        out.append(priced(B, w, g) + priced(B, *(fixed if stream else best[B])))
        if g == G and hasattr(stats["sampled"], "long_requests"):  # as the controller counts
            # (without a stream of requests, each step's draws are independent: a request each)
            long_requests.add(stream.number if stream else step)
            stats["sampled"].long_requests = max(stats["sampled"].long_requests,
                                                 len(long_requests))
        if g:
            cells = Counter()
            for _ in range(B):
                r = stream.rates(w, g) if stream else [rates[w]] * g
                k = 0 if start == "unlucky" and step <= 8 else _draw(truth, r)
                cells[k] += 1
                if stream:
                    stream.advance(1 + k)
            stats["sampled"].record_batch(w, [(g, k, n) for k, n in cells.items()])
        elif stream:
            stream.advance(B)
    return out


def window_figure(scenario: str, steps: list[tuple]) -> float:
    """The chosen arms' goodput over the best arm's in ``steps``: the mean of the steps'
    ratios, or (``REQUESTS`` scenarios, whose steps' states differ) the ratio of the sums."""
    if scenario in REQUESTS:
        return (sum(s[0] for s in steps) / sum(s[1] for s in steps)) / (
            sum(s[2] for s in steps) / sum(s[3] for s in steps))
    return statistics.mean((t / s) / (bt / bs) for t, s, bt, bs in steps)


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
                    window_figure(scenario, r[lo:hi]) for r in runs)
            rows.append(row)
            print(row, flush=True)
    cols = [("code", "code"), ("scenario", "scenario"), ("start", "start")] + [
        (f"steps {lo + 1}-{hi}", f"steps {lo + 1}-{hi}") for lo, hi in WINDOWS]
    table = markdown_table(rows, cols)
    write_outputs("policy_sim", {"args": vars(args), "scenarios": {
        k: {"rates": v[0], "beam_row_seconds": v[1], "batch": v[2],
            "max_tokens": MAX_TOKENS.get(k, 4), "requests": REQUESTS.get(k)}
        for k, v in SCENARIOS.items()}, "rows": rows}, table, args.out)
    print(table)


if __name__ == "__main__":
    main()
