"""A/B, real pair, batch 4, T=0, 64 tokens: the target alone against MTAD forced to skip drafting
(γ=0) at every step, interleaved 4 times; per-step wall time, then a cProfile of one run each.
    python benchmarks/reports/policy-probe-cpu/ab.py"""
import os, sys, time, json, statistics, cProfile, pstats, io
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")))
from vllm.v1.engine import core as core_mod
STEPS = []
orig = core_mod.EngineCore.step
def step(self):
    t = time.perf_counter(); r = orig(self); STEPS.append(time.perf_counter() - t); return r
core_mod.EngineCore.step = step
import argparse
from benchmarks.policy_grid import humaneval_prompts
from devtools.engine import build_llm, mtad_spec
from devtools.models import resolve_pair
from vllm import SamplingParams
from vllm_mtad.speculation import force_plans
target, draft, _ = resolve_pair(argparse.Namespace(tiny=False, target=None, draft=None))
B, TOK = 4, 64
common = dict(dtype="bfloat16", max_model_len=2048, max_num_seqs=B, max_num_batched_tokens=4096,
              block_size=32, kv_cache_bytes=640 << 20, disable_log_stats=False, enable_prefix_caching=False)
eng = {"target": build_llm(target, None, **common),
       "g0": build_llm(target, mtad_spec(draft, gamma=4, speculation_policy="adaptive"), **common)}
eng["g0"].collective_rpc(force_plans([(1, 0)]))
prompts = humaneval_prompts(2 * B)
def run(c, chunk, prof=None):
    params = [SamplingParams(max_tokens=TOK, ignore_eos=True, seed=i, temperature=0.0) for i in range(len(chunk))]
    STEPS.clear()
    if prof: prof.enable()
    t = time.perf_counter(); eng[c].generate(chunk, params, use_tqdm=False); s = time.perf_counter() - t
    if prof: prof.disable()
    dec = sorted(STEPS[1:])
    return s, statistics.median(dec), sum(STEPS[1:])
for c in eng: run(c, prompts[B:])
res = {c: [] for c in eng}
for r in range(4):
    for c in (list(eng) if r % 2 == 0 else list(eng)[::-1]):
        res[c].append(run(c, prompts[:B]))
for c, v in res.items():
    print(c, "total", [round(x[0], 2) for x in v], "median step", [round(x[1], 4) for x in v], "decode sum", [round(x[2], 2) for x in v])
for c in eng:
    p = cProfile.Profile(); run(c, prompts[:B], p)
    s = io.StringIO(); pstats.Stats(p, stream=s).sort_stats("tottime").print_stats(25); print("=== PROFILE", c); print(s.getvalue()[:6000])
