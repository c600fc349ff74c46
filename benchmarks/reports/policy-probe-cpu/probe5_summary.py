"""python benchmarks/reports/policy-probe-cpu/probe5_summary.py probe5.json[.gz]

Per run of probe5.py: engine steps, their seconds and the median of the steps under 0.5 s (the
decode steps where no draft is made); for MTAD runs, the verify part of the steps that verified
no drafts and read no prompt (what not drafting costs, as the policy times it), the policy's
price of such a step at batch 4 when each plan was made, and the plans chosen."""
import collections, gzip, json, statistics as st, sys

path = sys.argv[1]
log = json.load(gzip.open(path, "rt") if path.endswith(".gz") else open(path))["log"]
steps, plans, runs = collections.defaultdict(list), collections.defaultdict(list), {}
for e in log:
    if e["k"] == "step" and e["tag"]:
        steps[e["tag"]].append(e["s"])
    elif e["k"] == "plan" and e["tag"]:
        plans[e["tag"]].append(e)
    elif e["k"] == "run":
        runs[e["tag"]] = e
for tag, s in steps.items():
    small = [x for x in s if x < 0.5]
    r = runs.get(tag, {})
    line = (f"{tag:14s} {r.get('tokens', 0) / max(r.get('s', 1), 1e-9):6.2f} tok/s  steps "
            f"{len(s):4d}  {sum(s):6.2f} s  steps < 0.5 s: median {st.median(small) if small else 0:.3f}")
    p = plans.get(tag)
    if p:
        nd = [x["verify_s"] for x in p
              if x["verified"] == 0 and x["sched"] == x["B"] and x["verify_s"] is not None]
        price = [x["no_draft_price"] for x in p if x["B"] == 4]
        arms = collections.Counter(f"W{w}g{g}" for w, g in (x["arm"] for x in p))
        line += (f" | no-draft verify n {len(nd)} median {st.median(nd) if nd else 0:.3f}"
                 f" | price at 4 rows median {st.median(price) if price else 0:.3f}"
                 f" | {dict(arms.most_common(4))}")
    print(line)
