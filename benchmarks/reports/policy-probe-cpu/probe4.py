"""python benchmarks/reports/policy-probe-cpu/probe4.py OUT.json [policy_grid arguments]

The policy grid itself (benchmarks.policy_grid.main, same engines, order and history), with
every MTAD step's plan logged beside the engine step's wall time and the tokens its drafts
produced: per plan the chosen arm, whether explored, the batch (rows, prefill tokens, catch-up
tokens), the arm's expected tokens and predicted seconds in parts (the step's decode work,
what it owes, the prompts' rate), and the goodput of every arm. Summary: probe4_summary.py."""
import json, os, sys, time
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")))
from vllm.v1.engine import core as core_mod
from vllm_mtad import speculation as S
from vllm_mtad.core import policy as P
import benchmarks.policy_grid as G

LOG, cur = [], {"tag": None, "force": None, "limit": None, "n": 0}
orig_step = core_mod.EngineCore.step
def step(self):
    t = time.perf_counter(); r = orig_step(self)
    LOG.append({"k": "step", "tag": cur["tag"], "s": time.perf_counter() - t}); return r
core_mod.EngineCore.step = step

orig_choose = P.choose
def choose(batch, costs, stats, bounds, step, **kw):
    plan = orig_choose(batch, costs, stats, bounds, step, **kw)
    w, g = plan.beam_width, plan.num_tokens
    tok = P.expected_tokens(batch, stats, w, g)
    share = 1.0 / max(1.0, batch.remaining_tokens / max(tok / max(batch.size, 1), 1.0))
    LOG.append({"k": "plan", "tag": cur["tag"], "B": batch.size, "other": batch.other_tokens,
                "catch": batch.catch_up_tokens, "arrive": batch.catch_up_arrival_tokens,
                "arm": (w, g), "explore": plan.explore, "exp_tok": tok,
                "step_s": costs.step_time(batch, w, g, 0.0),
                "owed_s": costs.owed_time(batch) if g else 0.0, "share": share,
                "prompt_s": costs.prompt_time(batch, tok) if g else 0.0,
                "reading_s": costs.reading_time(batch) if g else 0.0,
                "arms": {f"W{a}g{b}": P.goodput(batch, costs, stats, a, b, confidence=1.0)
                         for a, b in P.arms(bounds, batch)},
                # each arm's expected tokens (confidence 1, as chosen; and the point estimate)
                # and predicted seconds without what the draft owes
                "arm_tok": {f"W{a}g{b}": [P.expected_tokens(batch, stats, a, b, 1.0),
                                          P.expected_tokens(batch, stats, a, b)]
                            for a, b in P.arms(bounds, batch)},
                "arm_s": {f"W{a}g{b}": costs.step_time(batch, a, b, 0.0)
                          for a, b in P.arms(bounds, batch)}})
    return plan
P.choose = choose

orig_rec = S.SpeculationController.record_acceptance
def rec(self, classes, widths, drafted, accepted):
    LOG.append({"k": "acc", "tag": cur["tag"], "widths": list(widths),
                "drafted": drafted.tolist(), "accepted": accepted.tolist()})
    return orig_rec(self, classes, widths, drafted, accepted)
S.SpeculationController.record_acceptance = rec

orig_force, orig_limit = S.force_plans, S.limit_plans
def force_plans(plans):
    cur["force"] = plans; return orig_force(plans)
def limit_plans(n):
    cur["limit"] = n; return orig_limit(n)
S.force_plans, S.limit_plans = force_plans, limit_plans

orig_gen = G.generate_queued
def gen(llm, prompts, params, concurrency):
    spec = llm.llm_engine.vllm_config.speculative_config
    name = "target" if spec is None else (spec.method if spec.method != "mtad" else
            ("fixed" if cur["force"] else f"adaptive-g{cur['limit']}"))
    cur["n"] += 1
    cur["tag"] = f"{cur['n']:02d}-{name}"
    t = time.perf_counter()
    try:
        return orig_gen(llm, prompts, params, concurrency)
    finally:
        LOG.append({"k": "run", "tag": cur["tag"], "s": time.perf_counter() - t})
        cur["tag"] = None
        json.dump({"log": LOG}, open(sys.argv[1], "w"))
G.generate_queued = gen
G.main(sys.argv[2:])
