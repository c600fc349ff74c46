"""python benchmarks/reports/policy-probe-cpu/probe2.py BATCH TOKENS PROMPTS [MODE [CONFIGS]]
(e.g. 4 48 12 joint). Per step: the chosen arm's expected tokens and predicted seconds vs realized (accepted
counts from record_acceptance in the next step; wall time of the engine step)."""
import os, sys, time, json, statistics
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")))
from vllm.v1.engine import core as core_mod
from vllm_mtad import speculation as S
from vllm_mtad.core import policy as P
LOG = []; cur = {"tag": None, "force": None}
orig_step = core_mod.EngineCore.step
def step(self):
    t = time.perf_counter(); r = orig_step(self)
    LOG.append({"k": "step", "tag": cur["tag"], "s": time.perf_counter() - t}); return r
core_mod.EngineCore.step = step
orig_choose = P.choose
def choose(batch, costs, stats, bounds, step, **kw):
    plan = orig_choose(batch, costs, stats, bounds, step, **kw)
    if cur["force"]:
        plan = P.Plan(*cur["force"])
    w, g = plan.beam_width, plan.num_tokens
    tok = P.expected_tokens(batch, stats, w, g)
    sec = costs.step_time(batch, w, g, 0.0)
    g0 = costs.step_time(batch, 1, 0)
    LOG.append({"k": "plan", "tag": cur["tag"], "B": batch.size, "other": batch.other_tokens,
                "catch": batch.catch_up_tokens, "arm": (w, g), "exp_tok": tok, "pred_s": sec,
                "g0_s": g0, "short": len(batch.short), "explore": plan.explore})
    return plan
P.choose = choose
orig_rec = S.SpeculationController.record_acceptance
def rec(self, classes, widths, drafted, accepted):
    LOG.append({"k": "acc", "tag": cur["tag"], "drafted": drafted.tolist(), "accepted": accepted.tolist()})
    return orig_rec(self, classes, widths, drafted, accepted)
S.SpeculationController.record_acceptance = rec
import argparse
from benchmarks.policy_grid import humaneval_prompts
from devtools.engine import build_llm, mtad_spec
from devtools.models import resolve_pair
from vllm import SamplingParams
from vllm_mtad.speculation import force_plans
target, draft, _ = resolve_pair(argparse.Namespace(tiny=False, target=None, draft=None))
B, TOK, N = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
MODE = sys.argv[4] if len(sys.argv) > 4 else None
common = dict(dtype="bfloat16", max_model_len=2048, max_num_seqs=B, max_num_batched_tokens=4096,
              block_size=32, kv_cache_bytes=640 << 20, disable_log_stats=False, enable_prefix_caching=False)
eng = {"target": build_llm(target, None, **common),
       "mtad": build_llm(target, mtad_spec(draft, gamma=4, speculation_policy="adaptive"), **common)}
prompts = humaneval_prompts(2 * N)
samp = dict(temperature=0.0) if MODE else dict(temperature=1.0, top_k=10, top_p=0.9)
def run(cfg, chunk, tag):
    llm = eng["target" if cfg == "target" else "mtad"]
    cur["force"] = {"w1": (1, 4), "g0": (1, 0), "adaptive": None, "target": None}[cfg]
    extra = {"greedy_acceptance": MODE} if MODE and cfg != "target" else None
    params = [SamplingParams(max_tokens=TOK, ignore_eos=True, seed=i, extra_args=extra, **samp) for i in range(len(chunk))]
    cur["tag"] = tag; t = time.perf_counter()
    outs = llm.generate(chunk, params, use_tqdm=False); s = time.perf_counter() - t; cur["tag"] = None
    return sum(len(o.outputs[0].token_ids) for o in outs) / s
cfgs = sys.argv[5].split(",") if len(sys.argv) > 5 else ["target", "g0", "w1", "adaptive"]
for c in cfgs: run(c, prompts[N:], f"warm-{c}")
res = {c: [] for c in cfgs}
for r in range(2):
    for c in (cfgs if r % 2 == 0 else cfgs[::-1]):
        res[c].append(run(c, prompts[:N], f"{c}-{r}")); print(c, r, round(res[c][-1], 2), flush=True)
print(res)
json.dump({"res": res, "log": LOG}, open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"probe2_b{B}_n{N}_{MODE or 't1'}.json"), "w"))
