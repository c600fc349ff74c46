"""python benchmarks/reports/policy-probe-cpu/probe5.py OUT.json [--batch 4] [--prompts 12]

What not drafting costs at one batch size, measured four ways on the real pair (T=1, top-k 10,
top-p 0.9, queued arrivals, 48 tokens a request): the target alone, and one MTAD adaptive engine
run with every step forced to no draft ("g0"), with one step in eight forced to no draft among
W=1, γ=3 drafts ("mix", the isolated no-draft steps the policy measures while it drafts), and
free ("adaptive"). Logged per step: the engine step's wall time (EngineCore.step) and, in the
MTAD engine, the step's verify part as the policy times it (from the runner's input preparation
to the plan), with the drafts it verified, its prefill tokens, the plan, and the policy's price
of a step without a draft at this batch size (the verify line at B decode tokens times
CostModel.no_draft's ratio). Each configuration is warmed up on other prompts, then the four run
interleaved (forward, then backward), twice."""
import json, os, sys, time
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
sys.path.insert(0, ROOT)
import argparse
from vllm import SamplingParams
from vllm.v1.engine import core as core_mod
from vllm_mtad import speculation as S
from benchmarks.common import environment, generate_queued
from benchmarks.policy_grid import PAPER, humaneval_prompts
from devtools.engine import build_llm, mtad_spec
from devtools.models import add_model_args, resolve_pair

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--prompts", type=int, default=12)
ap.add_argument("--tokens", type=int, default=48)
ap.add_argument("--repeats", type=int, default=2)
add_model_args(ap)
args = ap.parse_args()

LOG, cur = [], {"tag": None}
orig_step = core_mod.EngineCore.step
def step(self):
    t = time.perf_counter(); r = orig_step(self)
    LOG.append({"k": "step", "tag": cur["tag"], "s": time.perf_counter() - t}); return r
core_mod.EngineCore.step = step

orig_plan = S.SpeculationController.plan
def plan(self, classes, scheduled_tokens, *a, **kw):
    verify_s = (time.perf_counter() - self._step_start) if self._step_start is not None else None
    verified, B = self._verified_drafts, len(classes)
    p = orig_plan(self, classes, scheduled_tokens, *a, **kw)
    c = self.costs
    ratio = c.no_draft.get(B)
    LOG.append({"k": "plan", "tag": cur["tag"], "B": B, "sched": scheduled_tokens,
                "verified": verified, "verify_s": verify_s, "arm": [p.beam_width, p.num_tokens],
                "no_draft_price": c.verify.predict((B, 0)) * (ratio.value if ratio else 1.0),
                "ratio": [ratio.value, ratio.samples] if ratio else None,
                "verify_line": list(c.verify.coefficients())})
    return p
S.SpeculationController.plan = plan

target, draft, _ = resolve_pair(args)
common = dict(dtype="bfloat16", max_model_len=2048, max_num_seqs=args.batch,
              max_num_batched_tokens=4096, block_size=32, kv_cache_bytes=640 << 20,
              disable_log_stats=False, enable_prefix_caching=False)
engines = {"target": build_llm(target, None, **common),
           "mtad": build_llm(target, mtad_spec(draft, gamma=4, speculation_policy="adaptive"),
                             **common)}
FORCE = {"g0": [(1, 0)], "mix": [(1, 3)] * 7 + [(1, 0)], "adaptive": None}
prompts = humaneval_prompts(164)
timed, warm = prompts[:args.prompts], prompts[82:82 + args.prompts]

def run(config, chunk, tag):
    llm = engines["target" if config == "target" else "mtad"]
    if config != "target":
        llm.collective_rpc(S.force_plans(FORCE[config]))
    params = [SamplingParams(max_tokens=args.tokens, ignore_eos=True, seed=i, **PAPER)
              for i in range(len(chunk))]
    cur["tag"] = tag
    t = time.perf_counter()
    outs = generate_queued(llm, chunk, params, args.batch)
    s = time.perf_counter() - t
    cur["tag"] = None
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    LOG.append({"k": "run", "tag": tag, "config": config, "s": s, "tokens": tokens})
    print(f"{tag}: {tokens / s:.2f} tok/s", flush=True)

configs = ["target", "g0", "mix", "adaptive"]
for c in configs:
    run(c, warm, f"warm-{c}")
for r in range(args.repeats):
    for c in (configs if r % 2 == 0 else configs[::-1]):
        run(c, timed, f"{r}-{c}")
    json.dump({"env": environment(), "args": vars(args), "log": LOG}, open(args.out, "w"))
