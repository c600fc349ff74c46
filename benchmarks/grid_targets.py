"""The policy grid against issue 19's targets: one line per (cell, batch) of a policy_grid.json.

    python -m benchmarks.grid_targets benchmarks/reports/policy-grid-cpu/grid-b1fc3b7

Per cell and batch: the target alone's, vLLM SD's and MTAD adaptive's (the default) median
tok/s with [min, max]; adaptive over the best of the other two; adaptive over vLLM SD; and the
targets that apply to the cell. A comparison "within the run's measured noise" reads: "met"
where adaptive's median is at least the other's; "within noise" where it is below by no more
than the pair's noise allows, "NOT met" where it is below by more. The pair's noise: the
spread of a repeat about its configuration's mean, relative, pooled over every configuration
of the (cell, batch) pair (the repeats run on fresh engines, so this holds the instances'
differences and the machine's drift), s with df degrees of freedom; adaptive's median may be
below the other's by up to t(0.95, df) · s · sqrt(1/n_a + 1/n_b) (a one-sided t test at 5 %,
n the repeats). Beside it, whether the two [min, max] ranges overlap: the rule this script
used first, and not a test of noise with two repeats: of four equally fast repeats, two of one
configuration and two of the other, the two of one are both slower than the other two with
probability 1/6 (checked in grid-7e68367's T=1 batch 48 pair: adaptive, drafting nothing, was
0.7 % and 1.1 % slower than the target alone, ranges disjoint, while the same adaptive engine
in the same repeat, making the same choices under its γ ≤ 8 bound, ran 1.7 % apart from it).

- every cell: adaptive >= the best of target alone and vLLM SD, within the noise;
- T=1 (either vLLM SD draft method), batch 1 and 4: adaptive >= 1.3x vLLM SD (medians);
- T=0 joint: adaptive >= 1.1x vLLM SD;
- T=0 exact: adaptive >= vLLM SD within the noise, and the draft it sends at least as good as
  vLLM SD's: acceptance (tokens per verified draft, bonus included) of MTAD fixed, which drafts
  that chain at vLLM SD's length every step, at least vLLM SD's. Adaptive's own acceptance is
  shown beside it but not judged: where it drafts shorter chains (its choice, where they are
  cheaper) it accepts fewer tokens a draft from the same chain.

Writes grid_targets.json and grid_targets.md into the grid's folder and prints the table.
Reads the grid as written after each cell, so a grid still running or cut short is judged on
what it has.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

from benchmarks.common import markdown_table, write_outputs

SD = {"T=1 SD greedy": "vllm_sd_greedy"}  # the cell's vLLM SD configuration; else "vllm_sd"


def judge(cells: list[dict], runs: list[dict]) -> list[dict]:
    """One row per (cell, batch) of policy_grid.json's cells, with the targets that apply,
    judged against the pair's noise as measured by its ``runs`` (policy_grid.json's runs)."""
    by = {}
    for c in cells:
        by.setdefault((c["cell"], c["batch"]), {})[c["config"]] = c
    noises = pair_noise(runs)
    repeats = defaultdict(int)
    for r in runs:
        repeats[(r["cell"], r["batch"], r["config"])] += 1
    rows = []
    for (cell, batch), configs in by.items():
        target, adaptive = configs.get("target"), configs.get("mtad_adaptive")
        sd = configs.get(SD.get(cell, "vllm_sd"))
        if not (target and adaptive and sd):
            continue
        best = max((target, sd), key=lambda c: c["tok_s"])
        noise = noises.get((cell, batch), (0.0, 0))
        row = {"cell": cell, "batch": batch,
               "target": _cell(target), "vllm_sd": _cell(sd), "adaptive": _cell(adaptive),
               "best": "target" if best is target else "vllm_sd",
               "vs_best": adaptive["tok_s"] / best["tok_s"],
               "vs_sd": adaptive["tok_s"] / sd["tok_s"],
               "noise": {"s": noise[0], "df": noise[1]},
               "ranges_overlap": adaptive["max"] >= best["min"],
               "chose": adaptive.get("chosen", "")}

        def at_least(a, b):
            n = (repeats[(cell, batch, a["config"])], repeats[(cell, batch, b["config"])])
            return at_least_within(a, b, noise, n)

        checks = {"never slower": at_least(adaptive, best)}
        if cell.startswith("T=1") and batch in (1, 4):
            checks[">= 1.3x SD"] = MET if row["vs_sd"] >= 1.3 else NOT_MET
        if cell == "T=0 joint":
            checks[">= 1.1x SD"] = MET if row["vs_sd"] >= 1.1 else NOT_MET
        if cell == "T=0 exact":
            checks[">= SD"] = at_least(adaptive, sd)
            acc, sd_acc = adaptive.get("acceptance"), sd.get("acceptance")
            fixed = configs.get("mtad_fixed", {}).get("acceptance")
            row["acceptance"] = {"adaptive": acc, "mtad_fixed": fixed, "vllm_sd": sd_acc}
            if fixed is not None and sd_acc is not None:
                checks["chain acceptance >= SD's"] = MET if fixed >= sd_acc else NOT_MET
        row["checks"] = checks
        rows.append(row)
    return rows


MET, NOISE, NOT_MET = "met", "within noise", "NOT met"


# Student's t, one-sided 95 % quantiles by degrees of freedom (between two: the smaller df's).
T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860,
       9: 1.833, 10: 1.812, 15: 1.753, 20: 1.725, 30: 1.697, 60: 1.671, 120: 1.658}


def t95(df: int) -> float:
    return T95[max(k for k in T95 if k <= df)]


def pair_noise(runs: list[dict]) -> dict:
    """(cell, batch) -> (s, df): a repeat's relative deviation from its configuration's mean,
    pooled over the pair's configurations (s: the root of the summed squares over df, df: the
    repeats less one per configuration)."""
    speeds = defaultdict(list)
    for r in runs:
        speeds[(r["cell"], r["batch"], r["config"])].append(r["tok_s"])
    squares, dfs = defaultdict(float), defaultdict(int)
    for (cell, batch, _), xs in speeds.items():
        if len(xs) > 1:
            mean = sum(xs) / len(xs)
            squares[(cell, batch)] += sum((x / mean - 1) ** 2 for x in xs)
            dfs[(cell, batch)] += len(xs) - 1
    return {pair: ((squares[pair] / df) ** 0.5, df) for pair, df in dfs.items()}


def at_least_within(a: dict, b: dict, noise: tuple, repeats: tuple) -> str:
    """Whether configuration ``a`` is at least as fast as ``b`` (cells with tok_s), within
    ``noise`` = (s, df) of the pair (pair_noise) for ``repeats`` = (n_a, n_b) repeats. Without
    a measured noise (df 0: one repeat each) only "met" or "NOT met"."""
    if a["tok_s"] >= b["tok_s"]:
        return MET
    s, df = noise
    if df < 1 or min(repeats) < 1:
        return NOT_MET
    allowed = t95(df) * s * (1 / repeats[0] + 1 / repeats[1]) ** 0.5
    return NOISE if 1 - a["tok_s"] / b["tok_s"] <= allowed else NOT_MET


def _cell(c: dict) -> dict:
    return {"tok_s": c["tok_s"], "min": c["min"], "max": c["max"]}


def _fmt(c: dict) -> str:
    return f"{c['tok_s']:.3g} [{c['min']:.3g}, {c['max']:.3g}]"


def table(rows: list[dict]) -> str:
    lines = [{"cell": r["cell"], "batch": r["batch"], "target": _fmt(r["target"]),
              "vllm_sd": _fmt(r["vllm_sd"]), "adaptive": _fmt(r["adaptive"]),
              "vs_best": f"{r['vs_best']:.2f}x {r['best']}", "vs_sd": f"{r['vs_sd']:.2f}x",
              "acceptance": " / ".join("-" if v is None else f"{v:.2f}"
                                       for v in r["acceptance"].values())
              if "acceptance" in r else "",
              "noise": f"{100 * r['noise']['s']:.1f} % ({r['noise']['df']})",
              "ranges": "overlap" if r["ranges_overlap"] else "disjoint",
              "targets": ", ".join(f"{k}: {v}" for k, v in r["checks"].items()),
              "chose": r["chose"]} for r in rows]
    return markdown_table(lines, [
        ("cell", "cell"), ("batch", "batch"), ("target", "target alone"),
        ("vllm_sd", "vLLM SD"), ("adaptive", "MTAD adaptive"),
        ("vs_best", "adaptive / best"), ("vs_sd", "adaptive / SD"),
        ("acceptance", "acceptance: adaptive / fixed / SD (T=0 exact)"),
        ("noise", "noise: s (df)"), ("ranges", "adaptive and best: ranges"),
        ("targets", "targets"), ("chose", "adaptive chose (steps)")])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("grid", help="a folder holding policy_grid.json")
    args = ap.parse_args(argv)
    with open(os.path.join(args.grid, "policy_grid.json")) as f:
        grid = json.load(f)
    rows = judge(grid["cells"], grid.get("runs", []))
    verdicts = [v for r in rows for v in r["checks"].values()]
    met = NOT_MET not in verdicts
    env = grid.get("environment", {})
    payload = {"grid": args.grid, "commit": env.get("commit"),
               "code_version": env.get("code_version"), "cpu_model": env.get("cpu_model"),
               "cells_judged": len(rows), "all_met_within_noise": met,
               "within_noise_only": verdicts.count(NOISE), "rows": rows}
    text = table(rows)
    write_outputs("grid_targets", payload, text, args.grid)
    print(text)
    print(f"{len(rows)} cells; targets {'all met' if met else 'NOT all met'} within the noise "
          f"({verdicts.count(NOISE)} of {len(verdicts)} only within it)", file=sys.stderr)


if __name__ == "__main__":
    main()
