"""python benchmarks/reports/policy-probe-cpu/probe3.py [joint|t1]: verify samples at (B, 0): steps without drafts, isolated (after drafting steps) vs sustained."""
import os, sys, time, json, statistics as st
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")))
from vllm_mtad.core import policy as P
LOG = []; cur = {"tag": None}
orig_add = P.LinearCost.add
def add(self, size, seconds):
    if isinstance(size, (tuple, list)) and self.dims == 2 and self._seen and True:
        LOG.append((cur["tag"], id(self), tuple(size), seconds))
    return orig_add(self, size, seconds)
P.LinearCost.add = add
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
llm = build_llm(target, mtad_spec(draft, gamma=4, speculation_policy="adaptive"), **common)
vid = llm.collective_rpc(lambda w: id(w.model_runner.drafter.speculation.costs.verify))[0]
prompts = humaneval_prompts(2 * B)
sched = {"g0": [(1, 0)], "w1": [(1, 4)], "iso": [(1, 4)] * 5 + [(1, 0)], "iso_t": [(4, 4)] * 5 + [(1, 0)]}
MODE = sys.argv[1] if len(sys.argv) > 1 else "joint"
samp = dict(temperature=0.0) if MODE != "t1" else dict(temperature=1.0, top_k=10, top_p=0.9)
extra = {"greedy_acceptance": MODE} if MODE != "t1" else None
def run(c, chunk):
    llm.collective_rpc(force_plans(sched[c])); cur["tag"] = c
    params = [SamplingParams(max_tokens=TOK, ignore_eos=True, seed=i, extra_args=extra, **samp) for i in range(len(chunk))]
    t = time.perf_counter(); llm.generate(chunk, params, use_tqdm=False); s = time.perf_counter() - t
    cur["tag"] = None; return s
for c in sched: run(c, prompts[B:])
for r in range(3):
    for c in (list(sched) if r % 2 == 0 else list(sched)[::-1]):
        run(c, prompts[:B])
for c in sched:
    nod = [s for t, m, z, s in LOG if t == c and m == vid and z == (B, 0)]
    big = [s for t, m, z, s in LOG if t == c and m == vid and z == (B * 5, 0)]
    print(c, "no-draft verify n=%d median %.4f [%s]" % (len(nod), st.median(nod) if nod else 0, ",".join("%.3f" % x for x in sorted(nod)[::max(1, len(nod)//8)])),
          "| 20-token verify n=%d median %.4f" % (len(big), st.median(big) if big else 0))
