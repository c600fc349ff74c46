"""Diagnostic probe (not a benchmark; kept with its outputs): per-step wall time and the
adaptive policy's pricing on the real pair at T=1 (top-k 10, top-p 0.9).

    python benchmarks/reports/policy-probe-cpu/trace.py BATCH TOKENS CONFIGS [PROMPTS [MODE]]
    e.g. ... trace.py 16 48 target,g0,w1g1,w1,adaptive
         ... trace.py 4 48 target,g0,w1,adaptive 12 joint   (T=0, greedy "joint")

PROMPTS (default BATCH) go to one LLM.generate with max_num_seqs = BATCH: more prompts than
BATCH queue, and a finished request's slot is refilled at once (a server held at BATCH in
flight). MODE: "joint" or "exact" runs T=0 with that greedy acceptance (default: T=1).

CONFIGS: target (alone), adaptive, fixed (forced W=4, γ=4), w1 (W=1, γ=4), g0 (γ=0), w1g1, w4g1,
w1g2. Wraps vLLM's EngineCore.step (wall time per step) and vllm_mtad.core.policy.choose and
LinearCost.add (the batch, every arm's expected tokens and seconds, the choice, every cost
sample; samples of forced runs are added when the policy next plans, so their tags lag). Each
configuration is warmed up on other prompts, then all run interleaved, twice. Writes
trace_b{BATCH}_t{TOKENS}_{CONFIGS}.json beside this file."""
import os, sys, time, json, statistics
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..", "..", "..")))
B = int(sys.argv[1]) if len(sys.argv) > 1 else 16
TOK = int(sys.argv[2]) if len(sys.argv) > 2 else 48
from vllm.v1.engine import core as core_mod
from vllm_mtad import speculation as S
from vllm_mtad.core import policy as P
sys.path.insert(0, HERE)
from probe_hooks import plan_record  # noqa: E402
LOG = []
cur = {"tag": None}
orig_step = core_mod.EngineCore.step
def step(self):
    t0 = time.perf_counter(); r = orig_step(self)
    LOG.append({"kind": "step", "tag": cur["tag"], "s": time.perf_counter() - t0})
    return r
core_mod.EngineCore.step = step
orig_choose = P.choose
def choose(batch, costs, stats, bounds, step, **kw):
    plan = orig_choose(batch, costs, stats, bounds, step, **kw)
    LOG.append({"tag": cur["tag"]} | plan_record(P, batch, costs, stats, bounds, plan))
    return plan
P.choose = choose
orig_add = P.LinearCost.add
NAMES = {}
def add(self, size, seconds):
    LOG.append({"kind": "sample", "tag": cur["tag"], "model": NAMES.get(id(self), "?"), "size": size, "s": seconds})
    return orig_add(self, size, seconds)
P.LinearCost.add = add
from benchmarks.policy_grid import humaneval_prompts
from devtools.engine import build_llm, mtad_spec
from devtools.models import resolve_pair
import argparse
from vllm import SamplingParams
from vllm_mtad.speculation import force_plans
from vllm_mtad.proposer import drafter_stats
ns = argparse.Namespace(tiny=False, target=None, draft=None)
try:
    target, draft, tiny = resolve_pair(ns)
except Exception as e:
    print(e); raise
common = dict(dtype="bfloat16", max_model_len=2048, max_num_seqs=B, max_num_batched_tokens=4096,
              block_size=32, kv_cache_bytes=640 << 20, disable_log_stats=False,
              enable_prefix_caching=False)
eng = {"target": build_llm(target, None, **common),
       "mtad": build_llm(target, mtad_spec(draft, gamma=4, speculation_policy="adaptive"), **common)}
N = int(sys.argv[4]) if len(sys.argv) > 4 else B
prompts = humaneval_prompts(2 * N)
def name_models(worker):
    c = worker.model_runner.drafter.speculation.costs
    return {id(c.verify): "verify", id(c.first_pass): "first_pass", id(c.beam_step): "beam_step", id(c.rest): "rest"}
NAMES.update(eng["mtad"].collective_rpc(name_models)[0])
MODE = sys.argv[5] if len(sys.argv) > 5 else None
samp = dict(temperature=0.0) if MODE else dict(temperature=1.0, top_k=10, top_p=0.9)
def run(cfg, chunk, tag):
    llm = eng["mtad" if cfg != "target" else "target"]
    if cfg != "target":
        llm.collective_rpc(force_plans({"fixed": [(4, 4)], "w1": [(1, 4)], "g0": [(1, 0)], "w1g1": [(1, 1)], "w1g2": [(1, 2)], "w4g1": [(4, 1)], "adaptive": None}[cfg]))
    extra = {"greedy_acceptance": MODE} if MODE and cfg != "target" else None
    params = [SamplingParams(max_tokens=TOK, ignore_eos=True, seed=i, extra_args=extra, **samp)
              for i in range(len(chunk))]
    cur["tag"] = tag
    t0 = time.perf_counter()
    outs = llm.generate(chunk, params, use_tqdm=False)
    s = time.perf_counter() - t0
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    cur["tag"] = None
    return n / s
cfgs = sys.argv[3].split(",") if len(sys.argv) > 3 else ["target", "adaptive", "fixed", "w1"]
for c in cfgs:
    run(c, prompts[N:2 * N], f"warm-{c}")
if "adaptive" in cfgs:  # the policy's own warm-up again, after the forced configurations
    run("adaptive", prompts[N:2 * N], "warm2-adaptive")
res = {c: [] for c in cfgs}
for r in range(2):
    for c in cfgs[r:] + cfgs[:r]:
        res[c].append(run(c, prompts[:N], f"{c}-{r}"))
print({c: [round(x, 1) for x in v] for c, v in res.items()})
print(json.dumps(eng["mtad"].collective_rpc(drafter_stats)[0], default=str)[:3000])
suffix = (f"_n{N}" if N != B else "") + (f"_{MODE}" if MODE else "")
json.dump({"res": res, "log": LOG},
          open(os.path.join(HERE, f"trace_b{B}_t{TOK}_{'-'.join(cfgs)}{suffix}.json"), "w"))
