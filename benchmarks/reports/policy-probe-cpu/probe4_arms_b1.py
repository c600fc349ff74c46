"""python benchmarks/reports/policy-probe-cpu/probe4_arms_b1.py PROBE4.json[.gz]

What the adaptive policy believed of a few arms at batch 1 in a probe4.py log (probe4 logs,
per plan, every arm's goodput, expected tokens and predicted seconds): the median over the
batch-1 plans of each arm's goodput, expected tokens a step (one standard error below, as the
policy chooses, and the point estimate) and predicted seconds."""
import gzip, json, statistics as st, sys

opener = gzip.open if sys.argv[1].endswith(".gz") else open
with opener(sys.argv[1], "rt") as f:
    log = json.load(f)["log"]
plans = [e for e in log if e.get("k") == "plan" and e.get("B") == 1 and "arm_tok" in e]
print("batch-1 plans:", len(plans))


def med(key, arm, i=None):
    v = [(e[key][arm][i] if i is not None else e[key][arm]) for e in plans if arm in e[key]]
    return st.median(v) if v else float("nan")


for arm in ("W1g4", "W4g4", "W1g3", "W4g1"):
    print(arm, "goodput %.2f" % med("arms", arm), "tokens (c=1) %.3f" % med("arm_tok", arm, 0),
          "tokens (point) %.3f" % med("arm_tok", arm, 1), "seconds %.4f" % med("arm_s", arm))
