"""Speed across batch sizes and temperatures: the target alone, vLLM's speculative decoding and
MTAD, side by side in one run, on equal samplers.

    python -m benchmarks.speed                      # the verdict for this machine
    python -m benchmarks.speed --target DIR --draft DIR     # your own pair
    python -m benchmarks.speed --preset grid        # the long grid (batch 1-48, every MTAD form)
    python -m benchmarks.speed --tiny --tokens 8    # a minute, on a tiny random pair (tests)

Cells: T=1 (top-k 10, top-p 0.9, the paper's setting) and T=0 (greedy; MTAD runs both greedy
rules, "joint" and "exact", while the target alone and vLLM SD are the same runs for both), at
every ``--batches`` size. Configurations (benchmarks.lib.engines.CONFIGS): by default the
target alone, vLLM SD (probabilistic drafts) and MTAD as a user gets it (adaptive policy, W ≤ 4,
γ ≤ 4). Every engine samples top-k/top-p by the same k-selection (equal samplers: the same
tokens as vLLM's sort); with ``--sampler both`` the target alone and vLLM SD also run with
vLLM's own sampler at T=1 ("as shipped"), on the same engines, so that both ratios come from
one run and the sampler's own share is measured (target alone selecting / as shipped).

Method: the engines (the target alone, vLLM SD, MTAD: one per family, every configuration of
a family on its engine) live in this process for the whole run where they fit in memory
(``--instances run``); where they do not (three float32 engines of the real pair), every repeat
runs each family in a process of its own, in an order turned round from one repeat to the next
(``family``; one warm-up run per engine and (cell, batch), on other prompts, with half the
tokens); ``repeat`` builds every repeat's engines afresh in a process of their own (two engines
of one model differ by up to ~10 %, which one instance per configuration carries into every
repeat). ``auto`` (the verdict's) picks ``run`` or ``family`` by the memory available. With
``run`` and ``repeat`` every configuration is warmed up on other prompts at each (cell, batch).
The configurations are interleaved (benchmarks.lib.runner.run_order) and repeated ``--repeats``
times; each run generates ``--tokens`` tokens (ignore_eos) for HumanEval prompts, ``batch`` at
a time, at least ``--min-prompts`` prompts. The real pair runs in bfloat16 where the CPU has
AVX-512 BF16 or AMX, in float32 elsewhere (``--dtype``). Reported: median output tokens/s with
[min, max], mean acceptance length (tokens per target pass, the extra token included), MTAD's
policy choices, the ratios, and per run how many sampling calls took the k-selection.
Output in --out (default benchmarks/results/speed/): speed.json (machine, CPU model and flags,
code version, every run), speed.md (the table), speed.png; vLLM's log in --log.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from benchmarks.lib.engines import (CONFIGS, SHIPPED, EngineSet, engine_of, prepare,
                                    select_everywhere, selection_counts)
from benchmarks.lib.prompts import GREEDY, HALF, PAPER, humaneval_prompts
from benchmarks.lib.report import RESULTS, code_commit, code_version, environment, write_outputs
from benchmarks.lib.runner import (generate_in_batches, in_own_process, per_request_acceptance,
                                   run_order)
from benchmarks.lib.stats import summary
from devtools.console import output_to, tail
from devtools.engine import close, default_dtype
from devtools.models import add_model_args, resolve_pair

PRESETS = {
    # The README's headline table: batch 1 and a loaded batch, both temperatures, the three
    # engines a user chooses between, vLLM's own sampler beside the selection at T=1.
    "verdict": dict(batches=[1, 16], tokens=32, repeats=2, min_prompts=2,
                    configs=["target", "vllm_sd", "mtad"], sampler="both", instances="auto"),
    # Every MTAD form at four loads, each repeat on fresh engines (hours on a 2-core CPU).
    "grid": dict(batches=[1, 4, 16, 48], tokens=48, repeats=2, min_prompts=4,
                 configs=["target", "vllm_sd", "mtad", "mtad_fixed", "mtad_g8"],
                 sampler="equal", instances="repeat"),
}
CELLS = {"T=1": PAPER, "T=0": GREEDY}


def cell_configs(cell: str, configs: list[str], sampler: str) -> list[str]:
    """The runs of a cell: at T=0 every MTAD configuration once per greedy rule; at T=1 with
    ``sampler == "both"``, the target alone and vLLM SD once more with vLLM's own sampler."""
    out = []
    for c in configs:
        if cell == "T=0" and c.startswith("mtad"):
            out += [f"{c} joint", f"{c} exact"]
            continue
        out.append(c)
        if cell == "T=1" and sampler == "both" and not c.startswith("mtad"):
            out.append(c + SHIPPED)
    return out


def run_one(llm, config: str, cell: str, batch: int, prompts: list, tokens: int,
            gamma: int, seed: int) -> dict:
    """One timed run of ``config`` on ``llm``."""
    from vllm import SamplingParams

    from vllm_mtad.proposer import drafter_stats

    selection0 = prepare(llm, config, gamma)
    is_mtad = engine_of(config) == "mtad"
    mode = config.split(" ")[1] if is_mtad and " " in config else None
    extra = {"greedy_acceptance": mode} if mode in ("joint", "exact") else None
    params = [SamplingParams(max_tokens=tokens, ignore_eos=True, seed=seed + i, **CELLS[cell],
                             extra_args=extra) for i in range(len(prompts))]
    chosen0 = llm.collective_rpc(drafter_stats)[0]["policy_chosen"] if is_mtad else {}
    t0 = time.perf_counter()
    outs = generate_in_batches(llm, prompts, params, batch)
    seconds = time.perf_counter() - t0
    out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    drafts, accepted = per_request_acceptance(outs)
    chosen = {}
    if is_mtad:
        now = llm.collective_rpc(drafter_stats)[0]["policy_chosen"]
        chosen = {k: v - chosen0.get(k, 0) for k, v in now.items() if v - chosen0.get(k, 0)}
    selection = {k: v - selection0[k] for k, v in selection_counts(llm).items()}
    return {"tokens": out_tokens, "seconds": seconds, "tok_s": out_tokens / seconds,
            "acceptance": 1 + accepted / drafts if drafts else None, "chosen": chosen,
            "selection": selection}


def prompt_sets(prompts: list, batch: int, min_prompts: int) -> tuple[list, list]:
    """(warm-up prompts, timed prompts) of a run of ``batch`` requests at a time: a batch, at
    least ``min_prompts``, from HumanEval's second half and first half."""
    n = max(batch, min_prompts)
    return prompts[HALF: HALF + n], prompts[:n]


def timed_runs(report, llm_of, configs: list[str], cell: str, batch: int, r: int,
               timed: list, tokens: int, gamma: int) -> list:
    """Repeat ``r``'s timed runs of ``configs`` in run_order, each on ``llm_of(config)``:
    [(config, result), ...]; ``report(1)`` after each."""
    out = []
    for config in run_order(configs, r):
        out.append((config, run_one(llm_of(config), config, cell, batch, timed, tokens, gamma,
                                    0)))
        report(1)
    return out


def repeat(report, engines: dict | None, spec: EngineSet, cell: str, batch: int, r: int,
           configs: list[str], warm: list | None, timed: list, tokens: int) -> list:
    """Repeat ``r`` of a (cell, batch) pair: every configuration warmed up on ``warm`` (None:
    not), then timed on ``timed`` in run_order. ``engines`` None: built here (and closed)."""
    own = engines is None
    if own:
        names = sorted({engine_of(c) for c in configs})
        engines = {n: spec.build(n, mtad_gamma(spec, configs)) for n in
                   (names if r % 2 == 0 else names[::-1])}
    try:
        for config in configs if warm is not None else []:  # untimed, on other prompts
            run_one(engines[engine_of(config)], config, cell, batch, warm, tokens, spec.gamma,
                    1000)
            report(1)
        return timed_runs(report, lambda c: engines[engine_of(c)], configs, cell, batch, r,
                          timed, tokens, spec.gamma)
    finally:
        if own:
            for llm in engines.values():
                close(llm)


def mtad_gamma(spec: EngineSet, configs: list[str]) -> int:
    """The MTAD engine's γ: the long bound where mtad_g8 runs, the default γ otherwise."""
    return max(spec.gamma, spec.long_gamma) if any(c.startswith("mtad_g8") for c in configs) \
        else spec.gamma


def family_repeat(report, spec: EngineSet, family: str, plan: list, r: int, tokens: int,
                  min_prompts: int, prompts: list) -> list:
    """Repeat ``r`` of one engine family (--instances family): its engine built here, then at
    every (cell, batch) of ``plan`` one warm-up run on other prompts (half the tokens) and its
    configurations timed in run_order. [(cell, batch, config, result), ...]."""
    llm = spec.build(family, mtad_gamma(spec, [c for _, _, cs in plan for c in cs]))
    try:
        out = []
        for cell, batch, configs in plan:
            mine = [c for c in configs if engine_of(c) == family]
            if not mine:
                continue
            warm, timed = prompt_sets(prompts, batch, min_prompts)
            run_one(llm, mine[0], cell, batch, warm, max(tokens // 2, 1), spec.gamma, 1000)
            report(1)
            out += [(cell, batch, config, res) for config, res in timed_runs(
                report, lambda _: llm, mine, cell, batch, r, timed, tokens, spec.gamma)]
        return out
    finally:
        close(llm)


def instances_for(choice: str, spec: EngineSet, families: list[str]) -> str:
    """``auto``: every engine alive in this process ("run") where they fit in the memory
    available now with 2 GiB to spare, one engine family at a time ("family") otherwise."""
    if choice != "auto":
        return choice
    import psutil

    need = spec.memory_bytes(families) + (2 << 30)
    return "run" if need <= psutil.virtual_memory().available else "family"


def main(argv=None) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # PyTorch's large allocations (the weights) on huge pages: two engines of one model then
    # ran 1.02x apart instead of 1.10x.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--preset", choices=PRESETS, default="verdict",
                    help="the defaults of the options below (default: %(default)s)")
    ap.add_argument("--batches", type=int, nargs="+")
    ap.add_argument("--tokens", type=int, help="output tokens per request")
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--min-prompts", type=int, help="prompts per run at least")
    ap.add_argument("--cells", nargs="+", choices=CELLS, default=list(CELLS))
    ap.add_argument("--configs", nargs="+", choices=CONFIGS)
    ap.add_argument("--sampler", choices=("equal", "both"),
                    help="equal: every engine samples by the k-selection; both: also vLLM's own "
                         "sampler for the target alone and vLLM SD at T=1")
    ap.add_argument("--instances", choices=("auto", "run", "repeat", "family"),
                    help="run: one engine per family for the whole run, all alive in this "
                         "process; repeat: fresh engines for every repeat of a (cell, batch), "
                         "in a process of their own; family: every repeat runs each engine "
                         "family in a process of its own, in an order turned round from one "
                         "repeat to the next (what fits where three engines do not); auto: run "
                         "where the engines fit in memory, family otherwise")
    ap.add_argument("--dtype", help="the real pair's dtype (default: bfloat16 where the CPU "
                                    "has AVX-512 BF16 or AMX, float32 elsewhere)")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--out", type=Path, default=RESULTS / "speed")
    ap.add_argument("--log", type=Path, help="vLLM's log (default: OUT/vllm.log)")
    ap.add_argument("--verbose", action="store_true", help="vLLM's log on the terminal")
    args = ap.parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if max(max(args.batches), args.min_prompts) > HALF:
        ap.error(f"a run needs at most {HALF} prompts (HumanEval's 164, half for warm-ups)")
    from tqdm import tqdm

    select_everywhere()
    target, draft, tiny = resolve_pair(args)
    env = environment() | {"commit": code_commit(), "code_version": code_version()}
    args.dtype = args.dtype or ("float32" if tiny else default_dtype(env.get("cpu_flags", [])))
    spec = EngineSet(target, draft, tiny, max(args.batches), args.dtype, args.gamma)
    prompts = humaneval_prompts(2 * HALF)
    plan = [(cell, b, cell_configs(cell, args.configs, args.sampler))
            for b in args.batches for cell in CELLS if cell in args.cells]
    families = sorted({engine_of(c) for _, _, cs in plan for c in cs})
    args.instances = instances_for(args.instances, spec, families)
    env["dtype"], env["instances"] = args.dtype, args.instances
    log = None if args.verbose else (args.log or args.out / "vllm.log")
    print(f"target {target}\ndraft  {draft} ({args.dtype})\n{env.get('cpu_model', '?')}, "
          f"{env['cpus']} CPUs, flags {' '.join(env.get('cpu_flags', []))}; vLLM {env['vllm']}; "
          f"code {env['code_version']}; engines: {args.instances}"
          + (f"\nvLLM's log: {log}" if log else ""), file=sys.stderr)
    if args.instances == "family":
        total = args.repeats * sum(len(c) + len({engine_of(x) for x in c}) for _, _, c in plan)
    else:
        warm_ups = args.repeats if args.instances == "repeat" else 1
        total = sum(len(c) * (warm_ups + args.repeats) for _, _, c in plan)
    runs, started = [], time.time()
    with output_to(log) as terminal:
        bar = tqdm(total=total, unit="run", desc="runs", file=terminal)
        engines = None
        try:
            if args.instances == "family":
                for r in range(args.repeats):
                    for family in (families if r % 2 == 0 else families[::-1]):
                        bar.set_postfix_str(f"repeat {r + 1}: {family}")
                        measured = in_own_process(
                            family_repeat, (spec, family, plan, r, args.tokens,
                                            args.min_prompts, prompts),
                            bar.update, f"repeat {r} of {family}")
                        runs += [{"cell": cell, "batch": batch, "config": c, "repeat": r} | res
                                 for cell, batch, c, res in measured]
                        write_report(args, target, draft, env, runs, time.time() - started)
            else:
                if args.instances == "run":
                    engines = {n: spec.build(n, mtad_gamma(spec, args.configs))
                               for n in families}
                warm_ups = args.repeats if args.instances == "repeat" else 1
                for cell, batch, configs in plan:
                    warm, timed = prompt_sets(prompts, batch, args.min_prompts)
                    for r in range(args.repeats):
                        bar.set_postfix_str(f"{cell} batch {batch} repeat {r + 1}")
                        rep_args = (engines, spec, cell, batch, r, configs,
                                    warm if r < warm_ups else None, timed, args.tokens)
                        measured = (in_own_process(repeat, rep_args, bar.update,
                                                   f"repeat {r} of {cell} batch {batch}")
                                    if engines is None else repeat(bar.update, *rep_args))
                        runs += [{"cell": cell, "batch": batch, "config": c, "repeat": r}
                                 | res for c, res in measured]
                    write_report(args, target, draft, env, runs, time.time() - started)
        except BaseException:
            if log is not None:
                print(f"--- the end of {log}:\n{tail(log)}", file=terminal)
            raise
        finally:
            for llm in (engines or {}).values():
                close(llm)
            bar.close()
    print(write_report(args, target, draft, env, runs, time.time() - started))
    print(f"\nwritten to {args.out} in {(time.time() - started) / 60:.1f} min", file=sys.stderr)


def cells_of(runs: list[dict]) -> list[dict]:
    """Per (cell, batch, configuration): median tok/s, [min, max], acceptance, choices."""
    out = {}
    for r in runs:
        out.setdefault((r["cell"], r["batch"], r["config"]), []).append(r)
    rows = []
    for (cell, batch, config), rs in out.items():
        acc = [x["acceptance"] for x in rs if x["acceptance"] is not None]
        chosen = {}
        for x in rs:
            for k, v in x["chosen"].items():
                chosen[k] = chosen.get(k, 0) + v
        rows.append({"cell": cell, "batch": batch, "config": config,
                     **summary([x["tok_s"] for x in rs]),
                     "acceptance": summary(acc)["median"] if acc else None,
                     "chosen": " ".join(f"{k}:{v}" for k, v in sorted(
                         chosen.items(), key=lambda kv: -kv[1])[:3])})
    return rows


def headline(rows: list[dict]) -> list[dict]:
    """The verdict's rows: per (cell and greedy rule, batch), the target alone, vLLM SD and MTAD
    (default) with MTAD's ratios on equal samplers, and as shipped where measured."""
    at = {(r["cell"], r["batch"], r["config"]): r for r in rows}
    out = []
    for (cell, batch, config), r in at.items():
        if config.split(" ")[0] != "mtad":  # the default MTAD, one row per greedy rule at T=0
            continue
        mode = config.split(" ")[1] if " " in config else None
        tgt, sd = at.get((cell, batch, "target")), at.get((cell, batch, "vllm_sd"))
        row = {"cell": cell + (f" {mode}" if mode else ""), "batch": batch, "target": tgt,
               "vllm_sd": sd, "mtad": r}
        for name, base in (("vs_sd", sd), ("vs_target", tgt)):
            row[name] = r["median"] / base["median"] if base else None
        shipped_sd = at.get((cell, batch, "vllm_sd" + SHIPPED))
        shipped_tgt = at.get((cell, batch, "target" + SHIPPED))
        row["shipped_vs_sd"] = r["median"] / shipped_sd["median"] if shipped_sd else None
        row["shipped_vs_target"] = r["median"] / shipped_tgt["median"] if shipped_tgt else None
        row["sampler_gain"] = (tgt["median"] / shipped_tgt["median"]
                               if tgt and shipped_tgt else None)
        out.append(row)
    order = {"T=1": 0, "T=0 joint": 1, "T=0 exact": 2}
    return sorted(out, key=lambda x: (x["batch"], order.get(x["cell"], 9)))


def _tok(r: dict | None) -> str:
    if r is None:
        return "–"
    acc = f" ({r['acceptance']:.2f})" if r.get("acceptance") else ""
    return f"{r['median']:.1f} [{r['min']:.1f}, {r['max']:.1f}]{acc}"


def _x(v) -> str:
    return "–" if v is None else f"{v:.2f}x"


def markdown(rows: list[dict], env: dict, minutes: float) -> str:
    """The headline table, then every configuration's cell, then the sampler's own share."""
    lines = ["| cell | batch | target alone | vLLM SD (acc.) | MTAD default (acc.) | "
             "MTAD / SD | MTAD / target | as shipped: MTAD / SD, / target |",
             "|---|---|---|---|---|---|---|---|"]
    heads = headline(rows)
    for h in heads:
        shipped = ("–" if h["shipped_vs_sd"] is None
                   else f"{_x(h['shipped_vs_sd'])}, {_x(h['shipped_vs_target'])}")
        lines.append(f"| {h['cell']} | {h['batch']} | {_tok(h['target'])} | "
                     f"{_tok(h['vllm_sd'])} | {_tok(h['mtad'])} | {_x(h['vs_sd'])} | "
                     f"{_x(h['vs_target'])} | {shipped} |")
    gains = [f"batch {h['batch']}: {_x(h['sampler_gain'])}" for h in heads
             if h["sampler_gain"] is not None]
    lines += ["", "tok/s: median [min, max] of the repeats; acc.: tokens per target pass. Equal "
              "samplers: every engine draws top-k/top-p by the same k-selection (the same "
              "tokens as vLLM's sort)."]
    if gains:
        lines.append("The sampler alone (the target alone selecting / with vLLM's own sort, "
                     "T=1): " + ", ".join(gains) + ".")
    lines += ["", f"{env.get('cpu_model', '?')} ({env['cpus']} CPUs; flags "
              f"{' '.join(env.get('cpu_flags', []))}), vLLM {env['vllm']}, torch "
              f"{env['torch']}, code {env['code_version']} (commit {env['commit'][:12]}), "
              f"{env['date']}, {minutes:.1f} min.", "",
              "| cell | batch | configuration | tok/s | min | max | acceptance | MTAD chose "
              "(steps) |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["batch"], r["cell"], r["config"])):
        acc = f"{r['acceptance']:.2f}" if r["acceptance"] else "–"
        lines.append(f"| {r['cell']} | {r['batch']} | {r['config']} | {r['median']:.2f} | "
                     f"{r['min']:.2f} | {r['max']:.2f} | {acc} | {r['chosen']} |")
    return "\n".join(lines)


def write_report(args, target, draft, env, runs, seconds) -> str:
    rows = cells_of(runs)
    table = markdown(rows, env, seconds / 60)
    payload = {"environment": env, "args": {k: str(v) if isinstance(v, Path) else v
                                            for k, v in vars(args).items()},
               "target": str(target), "draft": str(draft), "minutes": seconds / 60,
               "headline": [{k: (v["median"] if isinstance(v, dict) else v)
                             for k, v in h.items()} for h in headline(rows)],
               "cells": rows, "runs": runs}
    write_outputs("speed", payload, table, args.out)
    _plot(rows, args.out / "speed.png")
    return table


def _plot(rows, path) -> None:
    """tok/s against batch, one panel per cell, one line per configuration."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    cells = list(dict.fromkeys(r["cell"] for r in rows))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    fig, axes = plt.subplots(1, len(cells), figsize=(5.5 * len(cells), 4), squeeze=False)
    for ax, cell in zip(axes[0], cells):
        for i, config in enumerate(configs):
            pts = sorted((r["batch"], r["median"], r["min"], r["max"]) for r in rows
                         if r["cell"] == cell and r["config"] == config)
            if not pts:
                continue
            xs, ys, lo, hi = zip(*pts)
            ax.errorbar(xs, ys, yerr=[[y - a for y, a in zip(ys, lo)],
                                      [b - y for y, b in zip(ys, hi)]], marker="o", capsize=3,
                        label=config, color=f"C{i % 10}",
                        linestyle="--" if config.endswith(SHIPPED) else "-")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch (requests at once)")
        ax.set_ylabel("output tokens/s")
        ax.set_title(cell)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
