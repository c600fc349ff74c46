"""The policy grid against issue 19's targets: one line per (cell, batch) of a policy_grid.json.

    python -m benchmarks.grid_targets benchmarks/reports/policy-grid-cpu/grid-b1fc3b7

Per cell and batch: the target alone's, vLLM SD's and MTAD adaptive's (the default) median
tok/s with [min, max]; adaptive over the best of the other two; adaptive over vLLM SD; and the
targets that apply to the cell. A comparison "within the run's measured noise" reads: "met"
where adaptive's median is at least the other's, "within noise" where it is not but their
[min, max] ranges overlap (the repeats do not separate them), "NOT met" where adaptive's
fastest repeat is slower than the other's slowest.

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

from benchmarks.common import markdown_table, write_outputs

SD = {"T=1 SD greedy": "vllm_sd_greedy"}  # the cell's vLLM SD configuration; else "vllm_sd"


def judge(cells: list[dict]) -> list[dict]:
    """One row per (cell, batch) of policy_grid.json's cells, with the targets that apply."""
    by = {}
    for c in cells:
        by.setdefault((c["cell"], c["batch"]), {})[c["config"]] = c
    rows = []
    for (cell, batch), configs in by.items():
        target, adaptive = configs.get("target"), configs.get("mtad_adaptive")
        sd = configs.get(SD.get(cell, "vllm_sd"))
        if not (target and adaptive and sd):
            continue
        best = max((target, sd), key=lambda c: c["tok_s"])
        row = {"cell": cell, "batch": batch,
               "target": _cell(target), "vllm_sd": _cell(sd), "adaptive": _cell(adaptive),
               "best": "target" if best is target else "vllm_sd",
               "vs_best": adaptive["tok_s"] / best["tok_s"],
               "vs_sd": adaptive["tok_s"] / sd["tok_s"],
               "chose": adaptive.get("chosen", "")}
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


def at_least(a: dict, b: dict) -> str:
    """Whether configuration ``a`` is at least as fast as ``b`` (cells with tok_s, min, max)."""
    if a["tok_s"] >= b["tok_s"]:
        return MET
    return NOISE if a["max"] >= b["min"] else NOT_MET


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
              "targets": ", ".join(f"{k}: {v}" for k, v in r["checks"].items()),
              "chose": r["chose"]} for r in rows]
    return markdown_table(lines, [
        ("cell", "cell"), ("batch", "batch"), ("target", "target alone"),
        ("vllm_sd", "vLLM SD"), ("adaptive", "MTAD adaptive"),
        ("vs_best", "adaptive / best"), ("vs_sd", "adaptive / SD"),
        ("acceptance", "acceptance: adaptive / fixed / SD (T=0 exact)"),
        ("targets", "targets"), ("chose", "adaptive chose (steps)")])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("grid", help="a folder holding policy_grid.json")
    args = ap.parse_args(argv)
    with open(os.path.join(args.grid, "policy_grid.json")) as f:
        grid = json.load(f)
    rows = judge(grid["cells"])
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
