"""python benchmarks/reports/policy-probe-cpu/probe6.py OUT_DIR [--batch 48] [--tokens 24] [--mtad-first]
    [--two-targets] [--no-profile]

What an MTAD engine that does not draft costs beyond the target alone, at one batch size: the
real pair, T=1 (top-k 10, top-p 0.9), ``batch`` HumanEval prompts at once, ``tokens`` tokens each
(ignore_eos); the target alone against one MTAD adaptive engine forced to no draft at every
step. Each engine warmed up on other prompts, then two interleaved timed runs each (tok/s, and
the engine steps' wall time; four with --two-targets, two target-alone engines instead), then
one run each under cProfile (OUT_DIR/profile_<config>.txt:
the functions by own time and by cumulative time). Both engines live in one process, built one
after the other: the target alone first, or with --mtad-first the MTAD engine first."""
import cProfile, io, json, os, pstats, sys, time
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
sys.path.insert(0, ROOT)
import argparse
from vllm import SamplingParams
from vllm.v1.engine import core as core_mod
from vllm_mtad import speculation as S
from benchmarks.common import environment
from benchmarks.policy_grid import PAPER, humaneval_prompts
from devtools.engine import build_llm, mtad_spec
from devtools.models import add_model_args, resolve_pair

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--batch", type=int, default=48)
ap.add_argument("--tokens", type=int, default=24)
ap.add_argument("--mtad-first", action="store_true", help="build the MTAD engine first")
ap.add_argument("--no-profile", action="store_true")
ap.add_argument("--two-targets", action="store_true",
                help="two target-alone engines instead (what one engine instance differs from another)")
add_model_args(ap)
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)

STEPS, cur = [], {"tag": None}
orig_step = core_mod.EngineCore.step
def step(self):
    t = time.perf_counter(); r = orig_step(self)
    STEPS.append((cur["tag"], time.perf_counter() - t)); return r
core_mod.EngineCore.step = step

target, draft, _ = resolve_pair(args)
common = dict(dtype="bfloat16", max_model_len=2048, max_num_seqs=args.batch,
              max_num_batched_tokens=4096, block_size=32, kv_cache_bytes=640 << 20,
              disable_log_stats=False, enable_prefix_caching=False)
build = {"target": lambda: build_llm(target, None, **common),
         "mtad_g0": lambda: build_llm(target, mtad_spec(draft, gamma=4,
                                                        speculation_policy="adaptive"), **common)}
engines = {}
if args.two_targets:
    build["target2"] = build["target"]
names = ["target", "target2"] if args.two_targets else ["target", "mtad_g0"]
for name in (names[::-1] if args.mtad_first else names):
    engines[name] = build[name]()
if "mtad_g0" in engines:
    engines["mtad_g0"].collective_rpc(S.force_plans([(1, 0)]))
prompts = humaneval_prompts(164)
timed, warm = prompts[:args.batch], prompts[82:82 + args.batch]
params = [SamplingParams(max_tokens=args.tokens, ignore_eos=True, seed=i, **PAPER)
          for i in range(args.batch)]
res = []

def run(name, chunk, tag, profile=False):
    cur["tag"] = tag
    prof = cProfile.Profile() if profile else None
    t = time.perf_counter()
    if prof:
        prof.enable()
    outs = engines[name].generate(chunk, params[:len(chunk)], use_tqdm=False)
    if prof:
        prof.disable()
    s = time.perf_counter() - t
    cur["tag"] = None
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    steps = [x for g, x in STEPS if g == tag]
    res.append({"config": name, "tag": tag, "s": s, "tok_s": tokens / s, "steps": len(steps),
                "first_step_s": steps[0] if steps else None,
                "later_steps_s": sum(steps[1:])})
    print(f"{tag}: {tokens / s:.2f} tok/s, {len(steps)} steps, first {steps[0]:.2f} s, "
          f"later {sum(steps[1:]):.2f} s", flush=True)
    if prof:
        for key in ("tottime", "cumulative"):
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(40)
            with open(os.path.join(args.out, f"profile_{name}_{key}.txt"), "w") as f:
                f.write(buf.getvalue())

for name in engines:
    run(name, warm, f"warm-{name}")
for r, order in enumerate((names, names[::-1]) * (2 if args.two_targets else 1)):
    for name in order:
        run(name, timed, f"{r}-{name}")
for name in ([] if args.no_profile else engines):
    run(name, timed, f"prof-{name}", profile=True)
json.dump({"env": environment(), "args": vars(args), "runs": res},
          open(os.path.join(args.out, "probe6.json"), "w"), indent=1)
