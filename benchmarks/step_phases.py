"""Where one speculative step's time goes: vLLM's speculative decoding against MTAD, per phase.

    python -m benchmarks.step_phases                      # the real pair, T=0 "exact", batch 1
    python -m benchmarks.step_phases --cell "T=1" --batch 16
    python -m benchmarks.step_phases --tiny --tokens 16   # a minute (tests)

Two engines, in-process, built once: vLLM ``draft_model`` (greedy draft tokens at T=0,
probabilistic at T=1) and MTAD with the fixed policy (at T=0 "exact" it drafts one beam: the
same draft tokens as vLLM's greedy drafts, verified by the same rule). Both draft γ tokens with
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

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_MTAD_PHASE_TIMERS", "1")

from benchmarks.common import (environment, generate_in_batches, markdown_table,  # noqa: E402
                               write_outputs)
from benchmarks.policy_grid import CELLS, humaneval_prompts  # noqa: E402
from devtools.engine import build_llm, close, draft_model_spec, mtad_spec  # noqa: E402
from devtools.models import add_model_args, resolve_pair  # noqa: E402


def main(argv=None) -> None:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(ap)
    ap.add_argument("--cell", default="T=0 exact", choices=[c[0] for c in CELLS])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--mtad-first", action="store_true",
                    help="build the MTAD engine first (does the build order matter?)")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)

    from vllm import SamplingParams

    from vllm_mtad.timing import PHASES, phase_times, reset_phase_times

    target, draft, tiny = resolve_pair(args)
    _, sampling, mode = next(c for c in CELLS if c[0] == args.cell)
    common = dict(dtype="float32" if tiny else "bfloat16", max_model_len=2048,
                  max_num_seqs=max(args.batch, 1), max_num_batched_tokens=4096, block_size=32,
                  kv_cache_bytes=(256 << 20) if tiny else (640 << 20),
                  enable_prefix_caching=False)  # repeats reuse their prompts
    sd_extra = {"draft_sample_method": "greedy"} if mode else {}
    specs = {"vllm_sd": draft_model_spec(draft, args.gamma, **sd_extra),
             "mtad": mtad_spec(draft, gamma=args.gamma, greedy_acceptance=mode)}
    order = ["mtad", "vllm_sd"] if args.mtad_first else ["vllm_sd", "mtad"]
    engines = {name: build_llm(target, specs[name], **common) for name in order}
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
        for name in (list(engines) if r % 2 == 0 else list(engines)[::-1]):
            runs.append(run(name, timed) | {"repeat": r})
            print(f"repeat {r} {name}: {runs[-1]['tok_s']:.2f} tok/s", file=sys.stderr)
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
               "draft": str(draft), "built": order, "rows": rows, "runs": runs}
    out = write_outputs("step_phases", payload, table, args.out)
    print(table)
    print(f"written to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
