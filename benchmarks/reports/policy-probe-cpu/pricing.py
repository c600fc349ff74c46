"""python benchmarks/reports/policy-probe-cpu/pricing.py TRACE.json[.gz] [--config C]

How well the policy priced what it chose, from a probe7_g0.py --trace log (diagnostics, not
the package):

1. per arm chosen: the steps, the tokens the policy expected of them, its predicted seconds
   and the measured seconds of the engine steps that drafted it (an engine step verifies the
   previous plan's drafts and drafts this plan's: in a run of one arm the two agree);
2. per cost line: each sample's measured seconds against what the line predicted for its
   size just before it (the line replayed sample by sample with the package's own
   LinearCost, as the engine fitted it), the median ratio per size (sizes with 3 samples or
   more, once the line has 8);
and, for the run, its tok/s, tokens, seconds and acceptance.
"""
import argparse
import gzip
import json
import os
import statistics as st
import sys
from collections import defaultdict

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
from vllm_mtad.core.policy import CostModel  # noqa: E402


def lines_of(log):
    """Replays the cost samples: {line: {size: [(measured, predicted)]}}."""
    m = CostModel()
    models = {"verify": m.verify, "first_pass": m.first_pass, "beam_step": m.beam_step,
              "rest": m.rest}
    out = defaultdict(lambda: defaultdict(list))
    for e in log:
        if e["kind"] != "sample" or e["model"] not in models:
            continue
        line = models[e["model"]]
        size = tuple(e["size"]) if isinstance(e["size"], list) else e["size"]
        if line.samples >= 8:
            out[e["model"]][size].append((e["s"], line.predict(size)))
        line.add(size, e["s"])
    return out


def plans_and_steps(log):
    """(plan, the engine step it was made in) pairs, in order."""
    pairs, plan = [], None
    for e in log:
        if e["kind"] == "plan":
            plan = e
        elif e["kind"] == "step" and plan is not None:
            pairs.append((plan, e["s"]))
            plan = None
    return pairs


def report(run):
    log = run["log"]
    print(f"== repeat {run['repeat']} {run['config']}: {run['tok_s']:.2f} tok/s, "
          f"{run['tokens']} tokens in {run['seconds']:.2f} s, acceptance {run.get('acceptance')}")
    by_arm = defaultdict(list)
    for plan, s in plans_and_steps(log):
        tok, pred = plan["arms"].get(plan["plan"], (None, None))
        by_arm[(plan["plan"], plan["explore"], plan["B"])].append((tok, pred, s))
    print("  arm (explore, B): steps, expected tokens, predicted s, measured s (medians)")
    for (arm, explore, B), v in sorted(by_arm.items(), key=lambda kv: -len(kv[1])):
        toks = [t for t, _, _ in v if t is not None]
        preds = [p for _, p, _ in v if p is not None]
        print(f"  {arm:6s} {'x' if explore else ' '} B={B:<3d} {len(v):4d}  "
              f"{st.median(toks) if toks else float('nan'):7.3f}  "
              f"{st.median(preds) if preds else float('nan'):.4f}  "
              f"{st.median(s for _, _, s in v):.4f}")
    print("  cost line, size: samples, median measured / predicted, median measured s")
    for name, sizes in lines_of(log).items():
        for size, v in sorted(sizes.items(), key=lambda kv: str(kv[0])):
            if len(v) < 3:
                continue
            ratios = [a / p for a, p in v if p > 0]
            print(f"  {name:10s} {str(size):10s} {len(v):4d}  {st.median(ratios):.3f}  "
                  f"{st.median(a for a, _ in v):.4f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--config", default=None)
    a = ap.parse_args()
    opener = gzip.open if a.trace.endswith(".gz") else open
    with opener(a.trace, "rt") as f:
        runs = json.load(f)["runs"]
    for run in runs:
        if "log" in run and (a.config is None or run["config"] == a.config):
            if any(e["kind"] == "plan" for e in run["log"]):
                report(run)


if __name__ == "__main__":
    main()
