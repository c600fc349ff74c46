"""python benchmarks/reports/policy-probe-cpu/probe4_summary.py probe4.json [OFFSET]

Per run of probe4.py: steps and seconds; for MTAD runs, per kind of step (drafting or not,
with a prefill chunk, with a catch-up) the plans' predicted seconds (the arm's step, its share
of what the draft owes, the prompts' rate) against the engine steps' wall time, and expected
tokens against the tokens produced. A plan made in step i is verified in step i + OFFSET (1)."""
import collections, json, sys

log = json.load(open(sys.argv[1]))["log"]
off = int(sys.argv[2]) if len(sys.argv) > 2 else 1
runs = collections.defaultdict(lambda: {"steps": [], "plans": {}, "acc": {}, "s": 0.0})
idx = collections.Counter()
for e in log:
    t = e.get("tag")
    if t is None:
        continue
    r = runs[t]
    if e["k"] == "step":
        r["steps"].append(e["s"]); idx[t] += 1
    elif e["k"] == "plan":
        r["plans"][idx[t]] = e
    elif e["k"] == "acc":
        # accepted: k* per row, or (since f2470f5) each row's k* of every prefix (last: k*)
        e["accepted"] = [x[-1] if isinstance(x, list) else x for x in e["accepted"]]
        r["acc"][idx[t]] = e
    elif e["k"] == "run":
        r["s"] = e["s"]
for tag in sorted(runs):
    r = runs[tag]
    print(f"{tag:22s} {r['s']:6.2f} s  steps {len(r['steps'])}  in steps {sum(r['steps']):6.2f} s")
    if not r["plans"]:
        continue
    kinds = collections.defaultdict(lambda: collections.Counter())
    match = total = 0
    for i, p in r["plans"].items():
        w, g = p["arm"]
        k = ("draft" if g else "g0 ") + (" +prefill" if p["other"] else "") + (
            " +catch" if p["catch"] else "")
        c = kinds[k]
        c["n"] += 1
        c["wall"] += r["steps"][i] if i < len(r["steps"]) else 0.0
        c["pred_step"] += p["step_s"]
        c["pred_owed"] += p["owed_s"] * p["share"]
        c["owed_full"] += p["owed_s"]
        c["pred_prompt"] += p["prompt_s"]
        c["exp_tok"] += p["exp_tok"]
        c["explore"] += p["explore"]
        a = r["acc"].get(i + off)
        if g:
            total += 1
            if a is not None and max(a["drafted"]) == min(g, max(a["drafted"])) and max(a["drafted"]) > 0:
                match += 1
        real = sum(1 + x for x in a["accepted"]) if (g and a is not None) else p["B"]
        c["real_tok"] += real
        c[f"W{w}g{g}"] += 1
    print(f"   drafting plans whose verified drafts are as long: {match}/{total}")
    for k, c in sorted(kinds.items()):
        arms = {a: v for a, v in c.items() if a.startswith("W")}
        print(f"   {k:22s} n {c['n']:3d} wall {c['wall']:6.2f}  pred step {c['pred_step']:6.2f} "
              f"+owed {c['pred_owed']:5.2f} (full {c['owed_full']:5.2f}) +prompt {c['pred_prompt']:5.2f}"
              f"  tok exp {c['exp_tok']:6.1f} real {c['real_tok']:5d}  explored {c['explore']} {arms}")

# Per arm, over every MTAD run: the decode steps (no prefill chunk) where every row's verified
# draft had the arm's length: expected against produced tokens a row.
arm = collections.defaultdict(lambda: [0, 0.0, 0, 0])
for tag, r in runs.items():
    for i, p in r["plans"].items():
        w, g = p["arm"]
        a = r["acc"].get(i + off)
        if (not g or p["other"] or a is None or len(a["drafted"]) != p["B"]
                or any(d != g for d in a["drafted"])):
            continue
        c = arm[(w, g)]
        c[0] += 1; c[1] += p["exp_tok"]; c[2] += sum(1 + x for x in a["accepted"]); c[3] += p["B"]
print("arm      steps  rows  tokens a row: expected  produced")
for (w, g), (n, e, real, rows) in sorted(arm.items()):
    print(f"W{w} γ{g:<3d} {n:6d} {rows:5d}  {e / rows:21.2f} {real / rows:9.2f}")
