import json, sys, statistics as st, collections
d = json.load(open(sys.argv[1])); log = d["log"]
# align: plan at step k -> the 'acc' event after the next 'step' event
by = collections.defaultdict(list)
pending = None; pstep = None
for e in log:
    if e["k"] == "plan":
        pending = e; pending["_wall"] = None
    elif e["k"] == "step":
        if pending is not None and pending.get("_wall") is None:
            pending["_wall"] = e["s"]
            by[e["tag"]].append(pending)
    elif e["k"] == "acc":
        # realized of the previous plan (the one whose drafts these are)
        for p in reversed(by[e["tag"]][-2:-1] or []):
            if "real" not in p:
                p["real"] = sum(1 + a for a in e["accepted"]); p["rows"] = len(e["accepted"])
for tag, ps in by.items():
    if tag is None: continue
    dec = [p for p in ps if p["other"] == 0 and p["catch"] == 0 and "real" in p and p["arm"][1] > 0 and p["short"] == 0]
    g0 = [p for p in ps if p["arm"][1] == 0 and p["other"] == 0]
    arms = collections.Counter(tuple(p["arm"]) for p in ps)
    out = f"{tag:16s} plans {len(ps)} arms {dict(arms)}"
    if dec:
        out += f" | draft decode n={len(dec)} exp_tok {st.mean(p['exp_tok'] for p in dec):.2f} real {st.mean(p['real'] for p in dec):.2f} pred_s {st.median(p['pred_s'] for p in dec):.4f} wall {st.median(p['_wall'] for p in dec):.4f} g0_pred {st.median(p['g0_s'] for p in dec):.4f}"
    if g0:
        out += f" | g0 n={len(g0)} pred_s {st.median(p['pred_s'] for p in g0):.4f} wall {st.median(p['_wall'] for p in g0):.4f}"
    print(out)
