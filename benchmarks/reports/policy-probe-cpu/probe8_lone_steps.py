"""Diagnostic probe (not a benchmark): one target-alone engine, 4 HumanEval prompts at T=0, TOK
tokens each; per 50 decode steps the median step, the process's user and system CPU seconds, and
/proc/vmstat's compaction stalls, THP faults and page faults during the steps. Run:
TOK=300 THP_MEM_ALLOC_ENABLE=1 python benchmarks/reports/policy-probe-cpu/probe8_lone_steps.py
(probe8_lone_steps.txt: its output with THP_MEM_ALLOC_ENABLE=1, then =0.)"""
import os, time, statistics as st, sys, json
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
from vllm.v1.engine import core as core_mod
STEPS=[]
import resource
def vm():
    d=dict(l.split() for l in open('/proc/vmstat'))
    return int(d['compact_stall']), int(d['thp_fault_alloc']), int(d['pgfault'])
orig=core_mod.EngineCore.step
def step(self):
    ru=resource.getrusage(resource.RUSAGE_SELF); v=vm(); a=time.perf_counter(); r=orig(self); b=time.perf_counter()-a; ru2=resource.getrusage(resource.RUSAGE_SELF); v2=vm(); STEPS.append((b, ru2.ru_utime-ru.ru_utime, ru2.ru_stime-ru.ru_stime, v2[0]-v[0], v2[1]-v[1], v2[2]-v[2])); return r
core_mod.EngineCore.step=step
from devtools.engine import build_llm
from devtools.models import resolve_pair
import argparse
from vllm import SamplingParams
from benchmarks.policy_grid import humaneval_prompts
t, d, _ = resolve_pair(argparse.Namespace(tiny=False, target=None, draft=None))
llm = build_llm(t, None, dtype="bfloat16", max_model_len=2048, max_num_seqs=4, max_num_batched_tokens=4096, block_size=32, kv_cache_bytes=640<<20, enable_prefix_caching=False)
pr = humaneval_prompts(8)
sp = SamplingParams(max_tokens=int(os.environ.get('TOK','300')), ignore_eos=True, temperature=0)
llm.generate(pr[4:8], SamplingParams(max_tokens=16, ignore_eos=True))
print("pid", os.getpid(), flush=True)

STEPS.clear()
llm.generate(pr[:4], sp)

for i in range(0,len(STEPS),50):
    c=STEPS[i:i+50]
    print(i, 'med ms', round(1000*st.median(x[0] for x in c),1), 'user', round(sum(x[1] for x in c),2), 'sys', round(sum(x[2] for x in c),2), 'stalls', sum(x[3] for x in c), 'thp', sum(x[4] for x in c), 'pgfault', sum(x[5] for x in c), flush=True)
