"""Speed across batch sizes, temperatures, prompt kinds and request lengths: the target alone,
vLLM's speculative decoding and MTAD, side by side in one run, on equal samplers, timing
decoding apart from prefill.

    python -m benchmarks.speed                      # the verdict for this machine (≤ 15 min)
    python -m benchmarks.speed --target DIR --draft DIR     # your own pair
    python -m benchmarks.speed --preset study       # the study grid (hours): every cell, the
                                                    # default against forced arms
    python -m benchmarks.speed --tiny --lengths 8 4 # a minute, on a tiny random pair (tests)
    python -m benchmarks.speed rules ...            # the acceptance rules (FLy, MTAD W, γ) on
                                                    # equal samplers: speed rules --help

Cells: T=1 (top-k 10, top-p 0.9, the paper's setting) and T=0 (greedy; MTAD runs both greedy
rules, "joint" and "exact", while the target alone and vLLM SD are the same runs for both), at
every ``--batches`` size. Configurations (benchmarks.lib.engines.CONFIGS): by default the
target alone, vLLM SD (probabilistic drafts, γ = ``--gamma``) and MTAD as a user gets it
(adaptive policy, W <= 4, γ <= ``--mtad-gamma``); the study adds forced MTAD arms (W 1 and 4 ×
γ 4 and 8) on an MTAD engine of their own. Every engine samples top-k/top-p by the same
k-selection (equal samplers: the same tokens as vLLM's sort); ``--sampler both`` also runs the
target alone and vLLM SD with vLLM's own sampler at T=1 ("as shipped").

A run of a configuration at batch B sends one workload: for every prompt set (``--prompt-sets``:
HumanEval, chat) and every request length (``--lengths``, output tokens, ignore_eos), B / (sets
× lengths) requests (at least one), B at a time. Per request (vLLM's own request timestamps,
as ``vllm bench`` reports TTFT and TPOT): the **decode rate**, output tokens after the first over
the time after the first token, and the **end-to-end rate**, output tokens over time to first
token plus decoding. Per run: **CPU-seconds per output token** (this process's user + system
time over the tokens it made; the engines run in this process) and tokens per target pass.

Method: every engine is warmed up once per batch size on other prompts (lengths halved) before
timing; the configurations are interleaved (benchmarks.lib.runner.run_order) and repeated,
repeats outermost; after ``--repeats`` rounds more rounds run (up to ``--max-repeats``) while a
headline ratio's 95 % interval (pairs of the same request and repeat, resampled) is wider than
±``--until`` and the next round fits in ``--max-minutes``. Engines (``--instances``): ``run``
keeps one engine per family alive in this process; ``family`` runs each family in a process of
its own per round (where three engines do not fit in memory, as float32 on AVX2); ``repeat``
builds fresh engines for every round of a (cell, batch) (the study: the default's engine then
serves that cell only). ``auto`` picks ``run`` or ``family`` by the memory available. A run
may be made in parts of one round each, the later parts with ``--first-round`` 1, 2, ... (the
order turns with the round's index), put together by ``--report-only --merge PART ... --out
DIR``; a report says where a cell's rounds ran in one order only.
Output in --out (default benchmarks/results/speed/): speed.json (machine, CPU model and flags,
code version, every run and request), speed.md (the tables), speed.png; vLLM's log in --log.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

from benchmarks.lib.engines import (CONFIGS, SHIPPED, EngineSet, build, close, configurations,
                                    default_dtype, engine_dtype, engine_of, prepare,
                                    prepare_rule, release_memory, sampling_params,
                                    select_everywhere, selection_counts)
from benchmarks.lib.models import add_model_args, grid_parser, number_list, parse_grid, resolve_pair
from benchmarks.lib.projection import (fit_linear_costs, gpu_costs, sd_vocab_row_seconds,
                                       step_seconds, t0_tokens_per_pass, tokens_per_second,
                                       vocab_rows)
from benchmarks.lib.prompts import GREEDY, HALF, PAPER, chat_prompts, humaneval_prompts
from benchmarks.lib.report import RESULTS, code_commit, code_version, environment, write_outputs
from benchmarks.lib.runner import (generate_in_batches, in_own_process, output_to,
                                   per_request_acceptance, recording, run_order, tail)
from benchmarks.lib.stats import ratio_interval, summary

PRESETS = {
    # The README's table: batch 1 and a loaded batch, both temperatures, both prompt kinds, a
    # short request (mostly prefill, what earlier verdicts timed) and a longer one (mostly
    # decoding), the three engines a user chooses between.
    "verdict": dict(batches=[1, 16], lengths=[32, 64], prompt_sets=["humaneval", "chat"],
                    repeats=2, max_repeats=3, max_minutes=15.0,
                    configs=["target", "vllm_sd", "mtad"], sampler="equal", instances="auto"),
    # Every cell of the study grid, the default against forced arms on an engine of their own,
    # fresh engines every round (hours on a 2-core CPU).
    "study": dict(batches=[1, 4, 16], lengths=[32, 256], prompt_sets=["humaneval", "chat"],
                  repeats=2, max_repeats=4, max_minutes=None,
                  configs=["target", "vllm_sd", "mtad", "mtad_w1g4", "mtad_w4g4", "mtad_w1g8",
                           "mtad_w4g8"], sampler="equal", instances="repeat"),
}
CELLS = {"T=1": PAPER, "T=0": GREEDY}
CELL_ORDER = {"T=1": 0, "T=0 joint": 1, "T=0 exact": 2}  # the tables' order of cells
PROMPT_SETS = ("humaneval", "chat")


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


def prompt_pool(name: str) -> list[str]:
    """A prompt set's prompts, each once: HumanEval's 164, chatterbot-corpus's opening
    lines."""
    pool = humaneval_prompts(2 * HALF) if name == "humaneval" else chat_prompts(64)
    return list(dict.fromkeys(pool))


def workload(pools: dict, batch: int, lengths: list[int], warm: bool = False) -> list[dict]:
    """The requests of one run at ``batch``: per prompt set and length, batch / (sets ×
    lengths) requests (at least one), each on a prompt of its own; timed runs use each pool's
    first half, warm-ups (``warm``: lengths halved) its second."""
    per = max(1, batch // (len(pools) * len(lengths)))
    out = []
    for name, pool in pools.items():
        half = len(pool) // 2
        if per * len(lengths) > half:
            raise ValueError(f"batch {batch} needs {per * len(lengths)} {name} prompts a run, "
                             f"the set has {half} to time (and as many for warm-ups)")
        for j, length in enumerate(lengths):
            for i in range(per):
                k = j * per + i
                prompt = pool[half + k % half] if warm else pool[k % half]
                out.append({"set": name, "length": max(length // 2, 1) if warm else length,
                            "prompt": prompt})
    return out


def run_one(llm, config: str, cell: str, batch: int, requests: list[dict], seed: int) -> dict:
    """One timed run of ``config`` on ``llm``: the run's totals and, per request, its decode
    and end-to-end rates (vLLM's request timestamps; ``disable_log_stats=False``)."""
    from vllm_mtad.worker_rpc import drafter_stats

    selection0 = prepare(llm, config)
    is_mtad = engine_of(config).startswith("mtad")
    params = [request_params(cell, config, r["length"], seed + i)
              for i, r in enumerate(requests)]
    chosen0 = llm.collective_rpc(drafter_stats)[0]["policy_chosen"] if is_mtad else {}
    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    outs = generate_in_batches(llm, [r["prompt"] for r in requests], params, batch)
    seconds = time.perf_counter() - t0
    cpu = _cpu_seconds() - cpu0
    per_request = [request_times(r, o) for r, o in zip(requests, outs)]
    tokens = sum(r["tokens"] for r in per_request)
    drafts = sum(r["drafts"] for r in per_request)
    accepted = sum(r["accepted"] for r in per_request)
    chosen = {}
    if is_mtad:
        now = llm.collective_rpc(drafter_stats)[0]["policy_chosen"]
        chosen = {k: v - chosen0.get(k, 0) for k, v in now.items() if v - chosen0.get(k, 0)}
    selection = {k: v - selection0[k] for k, v in selection_counts(llm).items()}
    return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds,
            "cpu_s_per_token": cpu / max(tokens, 1),
            "acceptance": 1 + accepted / drafts if drafts else None, "chosen": chosen,
            "selection": selection, "requests": per_request}


def request_params(cell: str, config: str, length: int, seed: int):
    """A request's SamplingParams in ``cell`` for ``config`` ("mtad joint"/"mtad exact": that
    greedy rule): ``length`` tokens, ignore_eos, ``seed``."""
    from vllm import SamplingParams

    mode = config.split(" ")[1] if " " in config else None
    extra = {"greedy_acceptance": mode} if mode in ("joint", "exact") else None
    return SamplingParams(max_tokens=length, ignore_eos=True, seed=seed, **CELLS[cell],
                          extra_args=extra)


def _cpu_seconds() -> float:
    """User + system CPU time of this process (every thread of the in-process engine)."""
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def request_times(request: dict, out) -> dict:
    """A finished request's tokens, time to first token, decode time (first to last token,
    engine-core timestamps) and rates, and its verify steps and accepted draft tokens."""
    tokens = len(out.outputs[0].token_ids)
    m = out.metrics
    ttft = m.first_token_latency
    decode = max(m.last_token_ts - m.first_token_ts, 1e-9)
    spec = out.outputs[0].spec_decode_metrics
    drafts = sum(spec.histogram) if spec is not None else 0
    accepted = sum(j * n for j, n in enumerate(spec.histogram)) if spec is not None else 0
    return {"set": request["set"], "length": request["length"], "tokens": tokens,
            "ttft_s": ttft, "decode_s": decode,
            "decode_tok_s": (tokens - 1) / decode if tokens > 1 else None,
            "e2e_tok_s": tokens / max(ttft + decode, 1e-9), "drafts": drafts,
            "accepted": accepted}


def round_runs(report, llm_of, configs: list[str], cell: str, batch: int, r: int,
               requests: list[dict]) -> list:
    """Round ``r``'s timed runs of ``configs`` in run_order, each on ``llm_of(config)``:
    [(config, result), ...]; ``report(1)`` after each."""
    out = []
    for config in run_order(configs, r):
        out.append((config, run_one(llm_of(config), config, cell, batch, requests, 0)))
        report(1)
    return out


def warm_up(report, llm, served: list[tuple[str, str]], batch: int, pools: dict,
            lengths: list[int]) -> None:
    """One untimed run on other prompts, lengths halved, its requests taking turns at the
    (cell, configuration) pairs ``served`` (each request class the engine will time, so that
    the MTAD policy's cold start for each class falls here too, as far as the warm-up
    reaches)."""
    requests = workload(pools, batch, lengths, warm=True)
    prepare(llm, served[0][1])
    params = [request_params(*served[i % len(served)], r["length"], 1000 + i)
              for i, r in enumerate(requests)]
    generate_in_batches(llm, [r["prompt"] for r in requests], params, batch)
    report(1)


def served_by(plan: list, engine: str, batch: int) -> list[tuple[str, str]]:
    """The (cell, configuration) pairs ``plan`` times on ``engine`` at ``batch``."""
    return [(cell, c) for cell, b, cs in plan if b == batch for c in cs
            if engine_of(c) == engine]


def fresh_round(report, spec: EngineSet, cell: str, batch: int, r: int, configs: list[str],
                lengths: list[int], prompt_sets: list[str]) -> list:
    """Round ``r`` of one (cell, batch) on engines built here for it (``--instances
    repeat``), each warmed up first, then closed."""
    pools = {name: prompt_pool(name) for name in prompt_sets}
    names = sorted({engine_of(c) for c in configs})
    engines = {n: spec.build(n) for n in (names if r % 2 == 0 else names[::-1])}
    try:
        for name, llm in engines.items():
            warm_up(report, llm, served_by([(cell, batch, configs)], name, batch), batch,
                    pools, lengths)
        return round_runs(report, lambda c: engines[engine_of(c)], configs, cell, batch, r,
                          workload(pools, batch, lengths))
    finally:
        for llm in engines.values():
            close(llm)


# What a real-pair engine takes beyond its weights and KV (measured: the study's four engines
# in one process reached 24 GB resident where weights and KV make 18, and were killed).
ENGINE_OVERHEAD = 3 << 29  # 1.5 GiB


def memory_groups(spec: EngineSet, configs: list[str]) -> list[list[str]]:
    """A fresh round's configurations in groups whose engines fit in memory together, each
    group in a process of its own: all at once where they fit; else the target alone apart
    and the speculators together (the ratios between speculators stay interleaved), or, where
    those do not fit either, one engine family a group."""
    import psutil

    def fits(families):
        need = spec.memory_bytes(families) + ENGINE_OVERHEAD * len(families) + (2 << 30)
        return need <= psutil.virtual_memory().available

    families = sorted({engine_of(c) for c in configs})
    if fits(families):
        return [configs]
    rest = [f for f in families if f != "target"]
    groups = [[f] for f in families if f == "target"]
    groups += [rest] if rest and fits(rest) else [[f] for f in rest]
    return [[c for c in configs if engine_of(c) in g] for g in groups]


def family_round(report, spec: EngineSet, family: str, plan: list, r: int,
                 lengths: list[int], prompt_sets: list[str]) -> list:
    """Round ``r`` of one engine family (``--instances family``): its engine built here,
    warmed up at each batch size, then its configurations timed at every (cell, batch) of
    ``plan`` in run_order. [(cell, batch, config, result), ...]."""
    pools = {name: prompt_pool(name) for name in prompt_sets}
    llm = spec.build(family)
    try:
        out, warmed = [], set()
        for cell, batch, configs in plan:
            mine = [c for c in configs if engine_of(c) == family]
            if not mine:
                continue
            if batch not in warmed:
                warm_up(report, llm, served_by(plan, family, batch), batch, pools, lengths)
                warmed.add(batch)
            out += [(cell, batch, config, res) for config, res in round_runs(
                report, lambda _: llm, mine, cell, batch, r, workload(pools, batch, lengths))]
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


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--preset", choices=PRESETS, default="verdict",
                    help="the defaults of the options below (default: %(default)s)")
    ap.add_argument("--batches", type=int, nargs="+")
    ap.add_argument("--lengths", type=int, nargs="+", help="output tokens per request")
    ap.add_argument("--prompt-sets", nargs="+", choices=PROMPT_SETS)
    ap.add_argument("--repeats", type=int, help="rounds at least")
    ap.add_argument("--max-repeats", type=int, help="rounds at most")
    ap.add_argument("--until", type=float, default=0.05,
                    help="more rounds while a headline ratio's 95%% interval is wider than "
                         "± this share of the ratio (default: %(default)s)")
    ap.add_argument("--max-minutes", type=float,
                    help="no round starts that would end after this (0: no limit)")
    ap.add_argument("--cells", nargs="+", choices=CELLS, default=list(CELLS))
    ap.add_argument("--configs", nargs="+", choices=CONFIGS)
    ap.add_argument("--sampler", choices=("equal", "both"),
                    help="equal: every engine samples by the k-selection; both: also vLLM's own "
                         "sampler for the target alone and vLLM SD at T=1")
    ap.add_argument("--instances", choices=("auto", "run", "repeat", "family"),
                    help="run: one engine per family for the whole run, all alive in this "
                         "process; repeat: fresh engines for every round of a (cell, batch), "
                         "in a process of their own; family: every round runs each engine "
                         "family in a process of its own, in an order turned round from one "
                         "round to the next; auto: run where the engines fit in memory, "
                         "family otherwise")
    ap.add_argument("--dtype", help="the real pair's dtype (default: bfloat16 where the CPU "
                                    "has AVX-512 BF16 or AMX, float32 elsewhere)")
    ap.add_argument("--gamma", type=int, default=4, help="vLLM SD's γ (default: %(default)s)")
    ap.add_argument("--mtad-gamma", type=int, default=8,
                    help="the MTAD engines' num_speculative_tokens: the default's bound "
                         "(default: %(default)s)")
    ap.add_argument("--out", type=Path, default=RESULTS / "speed")
    ap.add_argument("--log", type=Path, help="vLLM's log (default: OUT/vllm.log)")
    ap.add_argument("--verbose", action="store_true", help="vLLM's log on the terminal")
    ap.add_argument("--trace-policy", action="store_true",
                    help="record every decision of the MTAD default's policy (inputs, plan, "
                         "time, acceptance) to OUT/policy-trace.jsonl.gz; read it with "
                         "`python -m devtools.policy_trace explain` (--instances run only)")
    ap.add_argument("--report-only", action="store_true",
                    help="no engine runs: OUT's tables and plot again from OUT/speed.json "
                         "(its runs, machine, code version and lengths)")
    ap.add_argument("--first-round", type=int, default=0,
                    help="the first round's index (default: %(default)s). The order of the "
                         "configurations and of building the engines turns with the index "
                         "(run_order): with one round per run, a later run with "
                         "--first-round 1 runs them in the reversed order, and --merge puts "
                         "the two together (one order alone can favour whatever runs first)")
    ap.add_argument("--merge", nargs="+", default=[],
                    help="with --report-only: these folders' runs (their speed.json) in one "
                         "report in OUT, a folder of its own (the same pair, machine, "
                         "versions, dtype, engines, γ, lengths and prompt sets; rounds of "
                         "different indices)")
    args = ap.parse_args(argv)
    if args.merge and not args.report_only:
        ap.error("--merge needs --report-only")
    if any(Path(m).resolve() == args.out.resolve() for m in args.merge):
        ap.error("--merge writes into --out: a folder of its own, not one of those merged")
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.max_repeats = max(args.max_repeats, args.repeats)
    if max(args.batches) > 2 * HALF:
        ap.error(f"a run needs at most {2 * HALF} prompts")
    return args


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["rules"]:
        return rules_main(argv[1:])
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # PyTorch's large allocations (the weights) on huge pages: two engines of one model then
    # ran 1.02x apart instead of 1.10x.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    args = parse_args(argv)
    if args.report_only:
        return report_again(args)
    from tqdm import tqdm

    select_everywhere()
    target, draft, tiny = resolve_pair(args)
    env = environment() | {"commit": code_commit(), "code_version": code_version()}
    args.dtype = args.dtype or ("float32" if tiny else default_dtype(env.get("cpu_flags", [])))
    spec = EngineSet(target, draft, tiny, max(args.batches), args.dtype, args.gamma,
                     args.mtad_gamma)
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
    per_round = sum(len(c) for _, _, c in plan)
    warm_ups = {"run": len(families) * len(args.batches),
                "family": sum(len({b for _, b, cs in plan if any(engine_of(c) == f for c in cs)})
                              for f in families),
                "repeat": sum(len({engine_of(c) for c in cs}) for _, _, cs in plan)}
    if args.trace_policy and args.instances != "run":
        raise SystemExit("--trace-policy needs the engines in this process (--instances run)")
    runs, started = [], time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    with output_to(log) as terminal, _policy_trace(args):
        bar = tqdm(total=args.repeats * per_round + warm_ups[args.instances]
                   * (args.repeats if args.instances != "run" else 1),
                   unit="run", desc="runs", file=terminal)
        engines = None
        try:
            if args.instances == "run":
                engines = {n: spec.build(n) for n in families}
                pools = {name: prompt_pool(name) for name in args.prompt_sets}
                for batch in args.batches:
                    for name, llm in engines.items():
                        warm_up(bar.update, llm, served_by(plan, name, batch), batch, pools,
                                args.lengths)
            for i in range(args.max_repeats):
                if i >= args.repeats:
                    if not needs_more(runs, args, started, i):
                        break
                    bar.total += per_round + (0 if args.instances == "run"
                                              else warm_ups[args.instances])
                runs += one_round(bar, engines, spec, plan, families, args.first_round + i,
                                  args)
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


def report_again(args) -> None:
    """--report-only: speed.json's runs written out again (tables, plot, JSON) with the
    machine, code version, lengths and minutes they were measured with; with --merge, those
    of the folders named, put together (merge_saved), into OUT."""
    sources = [Path(m) for m in args.merge] or [args.out]
    saved = merge_saved([json.loads((folder / "speed.json").read_text())
                         for folder in sources])
    args.lengths, args.until = saved["args"]["lengths"], saved["args"]["until"]
    args.prompt_sets = saved["args"]["prompt_sets"]
    print(write_report(args, saved["target"], saved["draft"], saved["environment"],
                       saved["runs"], 60 * saved["minutes"]))


# What runs put together in one report must share: the pair, the machine, the workload.
SAME_FOR_MERGE = (("target",), ("draft",), ("environment", "cpu_model"),
                  ("environment", "cpu_flags"), ("environment", "vllm"),
                  ("environment", "torch"), ("environment", "dtype"),
                  ("environment", "instances"), ("args", "gamma"), ("args", "mtad_gamma"),
                  ("args", "lengths"), ("args", "prompt_sets"))


def merge_saved(saved: list[dict]) -> dict:
    """Several runs' speed.json payloads as one: their runs together, minutes added, code
    versions and commits joined by " + " where they differ. Refused (SystemExit) where the
    pair, machine, dtype, lengths or prompt sets differ, or where two hold the same round of a
    configuration (the same cell, batch, configuration and round index: --first-round)."""
    first = saved[0]
    for other in saved[1:]:
        for path in SAME_FOR_MERGE:
            a, b = first, other
            for key in path:
                a, b = a.get(key), b.get(key)
            if a != b:
                raise SystemExit(f"--merge: {'.'.join(path)} differs ({a!r} against {b!r})")
    seen, runs = set(), []
    for payload in saved:
        for run in payload["runs"]:
            key = (run["cell"], run["batch"], run["config"], run["repeat"])
            if key in seen:
                raise SystemExit(f"--merge: round {run['repeat']} of {run['config']} in "
                                 f"{run['cell']} at batch {run['batch']} is in two runs "
                                 "(a later run starts at another --first-round)")
            seen.add(key)
            runs.append(run)
    env = dict(first["environment"])
    for key in ("code_version", "commit"):
        env[key] = " + ".join(dict.fromkeys(p["environment"].get(key, "?") for p in saved))
    return first | {"environment": env, "runs": runs,
                    "minutes": sum(p["minutes"] for p in saved)}


def _policy_trace(args):
    """devtools.policy_trace's recording (benchmarks.lib.runner.recording) into
    OUT/policy-trace.jsonl.gz with --trace-policy."""
    import contextlib

    if not args.trace_policy:
        return contextlib.nullcontext()
    return recording(str(args.out / "policy-trace.jsonl.gz"))


def one_round(bar, engines, spec, plan, families, r, args) -> list:
    """Round ``r`` of every (cell, batch): [{"cell", "batch", "config", "repeat", ...}]."""
    out = []
    if args.instances == "family":
        for family in (families if r % 2 == 0 else families[::-1]):
            bar.set_postfix_str(f"round {r + 1}: {family}")
            measured = in_own_process(family_round, (spec, family, plan, r, args.lengths,
                                                     args.prompt_sets),
                                      bar.update, f"round {r} of {family}")
            out += [{"cell": cell, "batch": batch, "config": c, "repeat": r} | res
                    for cell, batch, c, res in measured]
        return out
    pools = {name: prompt_pool(name) for name in args.prompt_sets}
    for cell, batch, configs in plan:
        bar.set_postfix_str(f"round {r + 1}: {cell} batch {batch}")
        if engines is None:
            measured = []
            # Odd rounds run the groups in the other order too: otherwise the target alone,
            # a group of its own where the engines do not fit together, runs first in every
            # round (the study's batch 4 and 16 before 2026-11-29's second rounds).
            groups = memory_groups(spec, configs)
            for group in (groups if r % 2 == 0 else groups[::-1]):
                measured += in_own_process(fresh_round, (spec, cell, batch, r, group,
                                                         args.lengths, args.prompt_sets),
                                           bar.update, f"round {r} of {cell} batch {batch}")
        else:
            measured = round_runs(bar.update, lambda c: engines[engine_of(c)], configs, cell,
                                  batch, r, workload(pools, batch, args.lengths))
        out += [{"cell": cell, "batch": batch, "config": c, "repeat": r} | res
                for c, res in measured]
    return out


def needs_more(runs: list[dict], args, started: float, r: int) -> bool:
    """Whether round ``r`` (one beyond ``--repeats``) runs: some headline ratio's interval is
    wider than ±``--until``, and at the pace so far the round ends within ``--max-minutes``."""
    elapsed = time.time() - started
    if args.max_minutes and elapsed + elapsed / max(r, 1) > 60 * args.max_minutes:
        return False
    return any(h["wide"] for h in headline(runs, args.until))


def decode_pairs(runs: list[dict], cell: str, batch: int, config: str, base: str,
                 rate: str = "decode_tok_s", select=lambda q: True) -> tuple[list, list]:
    """Paired per-request rates of ``config`` and ``base`` (same cell, batch, repeat and
    request), over the requests ``select`` keeps."""
    at = {(x["repeat"], x["config"]): x for x in runs
          if x["cell"] == cell and x["batch"] == batch}
    a, b = [], []
    for (rep, c), x in sorted(at.items()):
        if c != config or (rep, base) not in at:
            continue
        for qa, qb in zip(x["requests"], at[(rep, base)]["requests"]):
            if select(qa) and qa[rate] is not None and qb[rate] is not None:
                a.append(qa[rate])
                b.append(qb[rate])
    return a, b


def config_rows(runs: list[dict]) -> list[dict]:
    """Per (cell, batch, configuration): the decode and end-to-end rates (the mean over the
    run's requests; median [min, max] over rounds), per prompt set and length too, CPU-s per
    token, tokens per target pass and MTAD's choices."""
    groups = {}
    for r in runs:
        groups.setdefault((r["cell"], r["batch"], r["config"]), []).append(r)
    rows = []
    for (cell, batch, config), rs in groups.items():
        row = {"cell": cell, "batch": batch, "config": config,
               "decode": summary([_mean_rate(x["requests"], "decode_tok_s") for x in rs]),
               "e2e": summary([_mean_rate(x["requests"], "e2e_tok_s") for x in rs]),
               "cpu_s_per_token": summary([x["cpu_s_per_token"] for x in rs])["median"],
               "tok_s": summary([x["tok_s"] for x in rs])["median"]}
        acc = [x["acceptance"] for x in rs if x["acceptance"] is not None]
        row["acceptance"] = summary(acc)["median"] if acc else None
        groups_of = sorted({(q["set"], q["length"]) for x in rs for q in x["requests"]})
        row["by_group"] = {f"{s} {n}": {
            "decode": summary([_mean_rate([q for q in x["requests"]
                                           if (q["set"], q["length"]) == (s, n)],
                                          "decode_tok_s") for x in rs])["median"],
            "e2e": summary([_mean_rate([q for q in x["requests"]
                                        if (q["set"], q["length"]) == (s, n)], "e2e_tok_s")
                            for x in rs])["median"]} for s, n in groups_of}
        chosen = {}
        for x in rs:
            for k, v in x["chosen"].items():
                chosen[k] = chosen.get(k, 0) + v
        row["chosen"] = " ".join(f"{k}:{v}" for k, v in sorted(
            chosen.items(), key=lambda kv: -kv[1])[:3])
        rows.append(row)
    return rows


def _mean_rate(requests: list[dict], rate: str) -> float:
    values = [q[rate] for q in requests if q[rate] is not None]
    return sum(values) / len(values) if values else float("nan")


def headline(runs: list[dict], until: float = 0.05) -> list[dict]:
    """Per (cell and greedy rule, batch): MTAD's decode rate over vLLM SD's and the target
    alone's, with 95 % intervals over paired requests, and the end-to-end ratios per length;
    ``wide``: an interval reaches beyond ±``until`` of its ratio."""
    out = []
    keys = sorted({(x["cell"], x["batch"], x["config"]) for x in runs})
    lengths = sorted({q["length"] for x in runs for q in x["requests"]})
    for cell, batch, config in keys:
        if config.split(" ")[0] != "mtad":
            continue
        mode = config.split(" ")[1] if " " in config else None
        row = {"cell": cell + (f" {mode}" if mode else ""), "batch": batch, "config": config,
               "wide": False}
        for name, base in (("vs_sd", "vllm_sd"), ("vs_target", "target")):
            a, b = decode_pairs(runs, cell, batch, config, base)
            if not a:
                row[name] = None
                continue
            ratio, lo, hi = ratio_interval(a, b)
            row[name] = {"ratio": ratio, "low": lo, "high": hi}
            row["wide"] |= hi - lo > 2 * until * ratio
            row[name]["e2e"] = {}
            for n in lengths:
                ea, eb = decode_pairs(runs, cell, batch, config, base, "e2e_tok_s",
                                      lambda q, n=n: q["length"] == n)
                if ea:
                    row[name]["e2e"][n] = sum(ea) / sum(eb)
        out.append(row)
    return sorted(out, key=lambda x: (x["batch"], CELL_ORDER.get(x["cell"], 9)))


def study_rows(runs: list[dict]) -> list[dict]:
    """Where forced MTAD arms ran (the study): per (cell and greedy rule, batch, prompt set,
    length), the default's decode rate over the best other configuration's on the same
    requests (the target alone, vLLM SD, each forced arm: the highest mean), with a 95 %
    interval over the paired requests, and the default's and the best forced arm's over vLLM
    SD's."""
    out = []
    keys = sorted({(x["cell"], x["batch"], x["config"]) for x in runs})
    groups = sorted({(q["set"], q["length"]) for x in runs for q in x["requests"]})
    for cell, batch, config in keys:
        if config.split(" ")[0] != "mtad":
            continue
        mode = config.split(" ")[1] if " " in config else None
        rivals = ["target", "vllm_sd"] + [
            c for c in sorted({k[2] for k in keys if k[:2] == (cell, batch)})
            if c.startswith("mtad_") and (mode is None or c.endswith(" " + mode))]
        if len(rivals) == 2:
            continue  # no forced arm ran: not a study
        for group in groups:
            def pairs(base, g=group):
                return decode_pairs(runs, cell, batch, config, base,
                                    select=lambda q: (q["set"], q["length"]) == g)
            means = {}
            for c in rivals:
                a, b = pairs(c)
                if a:
                    means[c] = sum(b) / sum(a)  # the rival's rate over the default's
            if not means:
                continue
            best = max(means, key=means.get)
            row = {"cell": cell + (f" {mode}" if mode else ""), "batch": batch,
                   "set": group[0], "length": group[1], "best": best}
            ratio, lo, hi = ratio_interval(*pairs(best))
            row["vs_best"] = {"ratio": ratio, "low": lo, "high": hi}
            forced = [c for c in means if c.startswith("mtad_")]
            if "vllm_sd" in means:
                row["vs_sd"] = 1.0 / means["vllm_sd"]
                row["best_forced_vs_sd"] = max(means[c] for c in forced) / means["vllm_sd"]
                row["best_forced"] = max(forced, key=means.get)
            out.append(row)
    return sorted(out, key=lambda x: (x["batch"], CELL_ORDER.get(x["cell"], 9), x["set"],
                                      x["length"]))


def study_table(rows: list[dict]) -> list[str]:
    """The study's lines of the report (none where no forced arm ran)."""
    if not rows:
        return []
    lines = ["", "The study: per cell, the default's decode rate over the best configuration's "
             "on the same requests (95 % interval over the paired requests), and the "
             "default's and the best forced arm's over vLLM SD's.", "",
             "| cell | batch | prompts | tokens | best other | default / best | default / SD "
             "| best forced arm / SD |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        sd = f"{r['vs_sd']:.2f}x" if "vs_sd" in r else "–"
        forced = (f"{r['best_forced_vs_sd']:.2f}x ({r['best_forced']})"
                  if "best_forced_vs_sd" in r else "–")
        lines.append(f"| {r['cell']} | {r['batch']} | {r['set']} | {r['length']} | "
                     f"{r['best']} | {_ratio(r['vs_best'])} | {sd} | {forced} |")
    return lines


def _rate(r: dict | None, key: str = "decode") -> str:
    if r is None:
        return "–"
    acc = f" ({r['acceptance']:.2f})" if r.get("acceptance") and key == "decode" else ""
    s = r[key]
    return f"{s['median']:.1f} [{s['min']:.1f}, {s['max']:.1f}]{acc}"


def _ratio(v: dict | None) -> str:
    if v is None:
        return "–"
    return f"{v['ratio']:.2f}x [{v['low']:.2f}, {v['high']:.2f}]"


def markdown(runs: list[dict], env: dict, minutes: float, lengths: list[int]) -> str:
    """The headline table (decode rates, ratios with intervals, end-to-end ratios, CPU-s per
    token), then every configuration's row and its rates per prompt set and length."""
    rows = config_rows(runs)
    at = {(r["cell"], r["batch"], r["config"]): r for r in rows}
    e2e_head = " / ".join(str(n) for n in lengths)
    lines = [f"{env.get('cpu_model', '?')} ({env['cpus']} CPUs; flags "
             f"{' '.join(env.get('cpu_flags', []))}), {env.get('dtype', '?')}; vLLM "
             f"{env['vllm']}, torch {env['torch']}, code {env['code_version']} (commit "
             f"{' + '.join(c[:12] for c in env['commit'].split(' + '))}), {env['date']}, "
             f"{minutes:.1f} min.", "",
             "| cell | batch | decode tok/s: target alone | vLLM SD (acc.) | MTAD default (acc.) "
             f"| MTAD / SD | MTAD / target | end to end, {e2e_head} tokens: MTAD / SD | CPU-s "
             "per token: target, SD, MTAD | MTAD drafted (steps) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for h in headline(runs):
        base = "T=1" if h["cell"] == "T=1" else "T=0"
        tgt, sd = at.get((base, h["batch"], "target")), at.get((base, h["batch"], "vllm_sd"))
        mtad = at[(base, h["batch"], h["config"])]
        e2e = "–" if h["vs_sd"] is None else " / ".join(
            f"{h['vs_sd']['e2e'].get(n, float('nan')):.2f}x" for n in lengths)
        cpu = ", ".join("–" if r is None else f"{r['cpu_s_per_token']:.2f}"
                        for r in (tgt, sd, mtad))
        lines.append(f"| {h['cell']} | {h['batch']} | {_rate(tgt)} | {_rate(sd)} | "
                     f"{_rate(mtad)} | {_ratio(h['vs_sd'])} | {_ratio(h['vs_target'])} | "
                     f"{e2e} | {cpu} | {mtad['chosen'] or '–'} |")
    lines += ["", "Decode tok/s: per request, output tokens after the first over the time "
              "after the first token (vLLM's request timestamps), the mean over a run's "
              "requests; median [min, max] over rounds. Ratios: of the mean decode rates over "
              "the same requests, with a 95 % interval from resampling them (the requests of "
              "every round: at batch 1 a few prompts timed again, so the interval is the "
              "timing's and these prompts', not a population of prompts'). End to end: "
              "tokens over time to first token plus decoding, per request. CPU-s per token: "
              "this process's user + system time over the tokens (2 cores: up to 2 s a "
              "second). acc.: tokens per target pass. Equal samplers: every engine draws "
              "top-k/top-p by the same k-selection.", "",
              "| cell | batch | configuration | decode tok/s | end to end tok/s | run tok/s | "
              "CPU-s/token | acceptance | by prompt set and length: decode, end to end | "
              "MTAD chose (steps) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["batch"], r["cell"], r["config"])):
        acc = f"{r['acceptance']:.2f}" if r["acceptance"] else "–"
        groups = "; ".join(f"{k}: {v['decode']:.1f}, {v['e2e']:.1f}"
                           for k, v in r["by_group"].items())
        lines.append(f"| {r['cell']} | {r['batch']} | {r['config']} | {_rate(r)} | "
                     f"{_rate(r, 'e2e')} | {r['tok_s']:.1f} | {r['cpu_s_per_token']:.2f} | "
                     f"{acc} | {groups} | {r['chosen']} |")
    return "\n".join(lines + order_warning(runs) + study_table(study_rows(runs)))


def one_order_only(runs: list[dict]) -> list[tuple[str, int]]:
    """(cell, batch) pairs whose configurations ran in one order only: every round of the
    same parity (run_order reverses the order in odd rounds), as with one round."""
    parities = {}
    for r in runs:
        parities.setdefault((r["cell"], r["batch"]), set()).add(r["repeat"] % 2)
    return [key for key, p in parities.items() if len(p) == 1]


def order_warning(runs: list[dict]) -> list[str]:
    """A line under the tables where some cell's configurations ran in one order only."""
    pairs = one_order_only(runs)
    if not pairs:
        return []
    where = ", ".join(f"{cell} at batch {batch}" for cell, batch in pairs)
    return ["", f"**Rounds of one parity only** ({where}): run_order reverses the "
            "configurations' order (and fresh engines' processes) in odd rounds only, so here "
            "what ran first was never timed after the others, and a spread between engine "
            "instances or a drift in the machine's speed can favour it (speed-study-cpu: the "
            "target alone ran first in every round at batch 4 and 16). Another round with "
            "`--first-round 1` and `--report-only --merge` balances it."]


def write_report(args, target, draft, env, runs, seconds) -> str:
    table = markdown(runs, env, seconds / 60, args.lengths)
    payload = {"environment": env, "args": {k: str(v) if isinstance(v, Path) else v
                                            for k, v in vars(args).items()},
               "target": str(target), "draft": str(draft), "minutes": seconds / 60,
               "headline": headline(runs, args.until), "configs": config_rows(runs),
               "study": study_rows(runs),
               "runs": runs}
    write_outputs("speed", payload, table, args.out)
    _plot(config_rows(runs), args.out / "speed.png")
    return table


def _plot(rows, path) -> None:
    """Decode tok/s against batch, one panel per cell, one line per configuration."""
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
            pts = sorted((r["batch"], r["decode"]["median"], r["decode"]["min"],
                          r["decode"]["max"]) for r in rows
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
        ax.set_ylabel("decode tokens/s per request")
        ax.set_title(cell)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# `rules`: the acceptance rules' speed on equal samplers, with a cost model (issue 46).

RULES_DOC = """Speed of the acceptance rules on equal samplers (issue 46), this CPU's step costs fitted from
the same runs, and a GPU projection from the tokens per pass measured by
benchmarks.acceptance.

    python -m benchmarks.speed rules --out benchmarks/reports/rules-speed-cpu     # real pair
    python -m benchmarks.speed rules --report-only --out benchmarks/reports/rules-speed-cpu
    python -m benchmarks.speed rules --tiny --batches 1,2 --tokens 8 --repeats 1 --out DIR

Configurations: at T=0 (FLy's published setting) the target alone, vLLM SD with greedy drafts
at γ 4 and 8 (its own engine per γ), and on one MTAD engine (W ≤ 4, γ ≤ 8, every step forced)
FLy, MTAD W=1 and W=4 at γ 4 and 8; at T=1 (top-k 10, top-p 0.9) the same at γ=4 with vLLM
SD's probabilistic drafts. Every engine draws top-k/top-p by the same k-selection (equal
samplers, benchmarks.lib.engines.select_everywhere). Method: for each repeat, the engine
families in turn (order reversed every other repeat), each built afresh, warmed up on other
prompts at every (cell, batch), then its configurations timed; a run generates ``--tokens``
tokens (ignore_eos) for ``--min-prompts`` HumanEval prompts (rounded up to whole batches),
``batch`` at a time. Reported: median tok/s [min, max] over repeats while decoding (from the
engine's timestamps, after each batch's prefill step), tokens per target pass and per decoding
step, and the ratios against vLLM SD at the same γ and cell, decoding and whole run (the
prefill, the same for every engine, is a third to a half of a 32-token run).

The cost model (benchmarks/lib/projection.py) is fitted to the MTAD engine's runs (seconds per
decoding step against B, W, γ) and then predicts vLLM SD's tok/s at every (cell, batch, γ) from
SD's measured tokens per decoding step: an out-of-sample check on another engine, whose ratios
it must reproduce within their spread. At T>0 vLLM SD is also charged its own work over the
whole vocabulary, per row, as phase profiles of the same machine kind measured it
(``--sd-profiles``; benchmarks.phases step). The GPU projection applies the stated GPU model
(projection.gpu_costs) to the tokens per pass of --acceptance (benchmarks.acceptance's JSON).
"""

FRACTIONS = (0.05, 0.1, 0.2, 0.3)  # the GPU draft forward, as a fraction of a target pass
# vLLM SD's own T=1 work against the MTAD engine's, phase by phase, batch 1 and 4 (Intel Xeon)
SD_PROFILES = tuple(RESULTS.parent / "reports/step-phases-cpu" / d / "step_phases.json"
                    for d in ("t1-w1-one-chain", "t1-w1-b4", "t1-w1-b4-r6"))


# The rules' code beside report.code_version's defaults (this program, the engine registry).
OWN_CODE = ("benchmarks/lib/projection.py",)


def rule_speed_configs(gammas: list[int], widths: list[int]) -> list[dict]:
    out = []
    for t, gs in ((0.0, gammas), (1.0, gammas[:1])):
        out.append(dict(name=f"target T{t:g}", engine="target", t=t, g=0, w=1))
        out += [c for c in configurations([t], gs, widths) if not c["name"].startswith(
            "mtad_exact")]
    return out


def time_run(llm, config: dict, prompts: list[str], batch: int, tokens: int, seed: int) -> dict:
    """One run: tok/s over the whole run and over decoding alone, verify steps and accepted
    tokens, engine steps (per closed batch, its longest request's verify steps + 1 prefill
    step).

    Decoding alone: per closed batch, from the engine's timestamp of the batch's last first
    token (its prefill step, which also drafts) to its last token, and the tokens after each
    request's first. A short run is mostly prefill (rules-speed-cpu/README.md measures how
    much), which is the same for every engine and pulls every ratio towards 1; the decoding
    figures compare the steps the rules differ in."""
    prepare_rule(llm, config)
    params = sampling_params(config, len(prompts), tokens, ignore_eos=True, seed=seed)
    before = selection_counts(llm)
    t0 = time.perf_counter()
    outs = generate_in_batches(llm, prompts, params, batch)
    seconds = time.perf_counter() - t0
    steps, accepted = zip(*(per_request_acceptance([o]) for o in outs))  # per request
    lengths = [len(o.outputs[0].token_ids) for o in outs]
    # The target alone: one step a token (no verify steps recorded).
    per_request = steps if any(steps) else [n - 1 for n in lengths]
    chunks = [slice(i, i + batch) for i in range(0, len(outs), batch)]
    decode_steps = sum(max(per_request[c]) for c in chunks)
    decode_s = decoding_seconds(outs, chunks)
    fell_back = selection_counts(llm)["fallbacks"] - before["fallbacks"]
    return dict(tokens=sum(lengths), seconds=seconds, tok_s=sum(lengths) / seconds,
                decode_tokens=sum(lengths) - len(outs), decode_s=decode_s,
                decode_tok_s=(sum(lengths) - len(outs)) / decode_s, decode_steps=decode_steps,
                tokens_per_pass=(sum(accepted) + sum(steps)) / sum(steps) if sum(steps) else 1.0,
                engine_steps=decode_steps + len(chunks), sampler_fallbacks=fell_back)


def decoding_seconds(outs, chunks: list[slice]) -> float:
    """Per closed batch, the engine's timestamps from its prefill step (the step that gave every
    request its first token) to its last token, summed. Refused where a batch's first tokens
    came from different steps (a split prefill), whose later steps would count as decoding."""
    if any(o.metrics is None for o in outs):
        raise RuntimeError("no request metrics: build the engine with disable_log_stats=False")
    for c in chunks:
        if len({o.metrics.first_token_ts for o in outs[c]}) != 1:
            raise RuntimeError("a batch's first tokens came from different engine steps (its "
                               "prefill was split): raise max_num_batched_tokens")
    return sum(max(o.metrics.last_token_ts for o in outs[c]) - outs[c][0].metrics.first_token_ts
               for c in chunks)


def run_rules(args, target: str, draft: str, tiny: bool) -> list[dict]:
    select_everywhere()  # equal samplers: every engine's top-k/top-p by one k-selection
    configs = rule_speed_configs(args.gammas, args.widths)
    families = list(dict.fromkeys(c["engine"] for c in configs))
    prompts = humaneval_prompts(164)
    runs = []
    from tqdm import tqdm

    per_repeat = len(configs) * len(args.batches) * 2
    with tqdm(total=per_repeat * args.repeats, desc="runs", unit="run") as bar:
        for r in range(args.repeats):
            for family in families if r % 2 == 0 else families[::-1]:
                llm = build(family, args, target, draft, tiny, log_stats=True)
                try:
                    for batch in args.batches:
                        n = -(-max(batch, args.min_prompts) // batch) * batch  # whole batches
                        timed, warm = prompts[:n], prompts[HALF:HALF + n]
                        mine = [c for c in configs if c["engine"] == family]
                        order = mine if r % 2 == 0 else mine[::-1]
                        for c in order:  # untimed, on other prompts, half the tokens
                            time_run(llm, c, warm, batch, max(args.tokens // 2, 2), 2000)
                            bar.update(1)
                        for c in order:
                            runs.append(time_run(llm, c, timed, batch, args.tokens, 0)
                                        | {"config": c["name"], "batch": batch, "repeat": r})
                            bar.update(1)
                finally:
                    close(llm)
                    del llm
                    release_memory()
    return runs


def summarise_rules(runs: list[dict], configs: list[dict]) -> list[dict]:
    """One row per (configuration, batch): median tok/s [min, max] while decoding (and over
    the whole run, prefill included), tokens per pass, seconds per decoding step, and the
    ratios against vLLM SD at the same γ and T per repeat (decoding; whole run)."""
    by = {}
    for r in runs:
        by.setdefault((r["config"], r["batch"]), []).append(r)
    rows = []
    for c in configs:
        for batch in sorted({b for _, b in by}):
            mine = sorted(by.get((c["name"], batch), []), key=lambda r: r["repeat"])
            if not mine:
                continue
            sd_name = next((x["name"] for x in configs if x["engine"].startswith("vllm_sd")
                            and x["t"] == c["t"] and x["g"] == (c["g"] or 4)), None)
            sd = {r["repeat"]: r for r in by.get((sd_name, batch), [])}
            vs = {}
            for key in ("decode_tok_s", "tok_s"):
                ratios = [r[key] / sd[r["repeat"]][key] for r in mine if r["repeat"] in sd]
                vs[key] = summary(ratios) if ratios and sd_name != c["name"] else None
            rows.append(dict(
                config=c["name"], engine=c["engine"], t=c["t"], w=c["w"], g=c["g"],
                batch=batch, tok_s=summary([r["decode_tok_s"] for r in mine]),
                whole_run_tok_s=summary([r["tok_s"] for r in mine]),
                tokens_per_pass=statistics.mean(r["tokens_per_pass"] for r in mine),
                tokens_per_step=statistics.mean(r["decode_tokens"] / r["decode_steps"] / batch
                                                for r in mine),
                step_s=statistics.median(r["decode_s"] / r["decode_steps"] for r in mine),
                vs_sd=vs["decode_tok_s"], vs_sd_whole_run=vs["tok_s"],
                sd=sd_name, sampler_fallbacks=sum(r["sampler_fallbacks"] for r in mine)))
    return rows


def cpu_model_check(rows: list[dict], sd_row_s: float = 0.0) -> dict:
    """Fit the cost lines to the MTAD engine's rows (FLy and MTAD: seconds per engine step),
    predict every vLLM SD row's tok/s from its tokens per decoding step, and every MTAD-engine
    row's ratio against SD from the predictions; say whether each measured ratio's [min, max]
    holds the prediction.

    Tokens per decoding step, not the mean tokens per pass: a short run's last step is cut at
    ``--tokens`` and a batch takes as many steps as its slowest request. (Measured: FLy γ=8,
    batch 4, 7.88 tokens a pass and 6.20 a step, 5 steps; vLLM SD 6.09 a pass and 3.88 a step,
    8 steps: 1.60x the steps' worth, not 1.29x.) The tokens per step are what the run made of
    its steps, on any machine.

    ``sd_row_s``: seconds of vLLM SD's own work beyond the MTAD engine's per full-vocabulary row
    at T > 0 (projection.sd_vocab_row_seconds, from a phase profile of the same machine kind);
    each vLLM SD step at T > 0 is charged it over projection.vocab_rows. 0: forwards only."""
    mtad = [r for r in rows if r["engine"] == "mtad"]
    costs = fit_linear_costs([(r["batch"], r["w"], r["g"], r["step_s"]) for r in mtad])

    def own(r):  # vLLM SD's full-vocabulary work at T > 0, seconds a step
        return (sd_row_s * vocab_rows(r["batch"], r["g"])
                if r["engine"].startswith("vllm_sd") and r["t"] > 0 else 0.0)

    step = {(r["config"], r["batch"]): step_seconds(costs, r["batch"], r["w"], r["g"]) + own(r)
            for r in rows if r["engine"] != "target"}
    predicted = {(r["config"], r["batch"]): r["batch"] * r["tokens_per_step"]
                 / step[(r["config"], r["batch"])] for r in rows if r["engine"] != "target"}
    checks = []
    for r in rows:
        if r["engine"] != "mtad" or r["vs_sd"] is None:
            continue
        sd_pred = predicted[(r["sd"], r["batch"])]
        want = predicted[(r["config"], r["batch"])] / sd_pred
        lo, hi = r["vs_sd"]["min"], r["vs_sd"]["max"]
        checks.append(dict(config=r["config"], batch=r["batch"], measured=r["vs_sd"],
                           predicted=want, within=lo <= want <= hi,
                           error=r["vs_sd"]["median"] / want - 1))
    sd_rows = [dict(config=r["config"], batch=r["batch"], measured=r["tok_s"],
                    predicted=predicted[(r["config"], r["batch"])],
                    step_s=r["step_s"], predicted_step_s=step[(r["config"], r["batch"])],
                    own_s=own(r))
               for r in rows if r["engine"].startswith("vllm_sd")]
    a_t, b_t = costs.target(0), costs.target(1) - costs.target(0)
    a_d, b_d = costs.draft(0), costs.draft(1) - costs.draft(0)
    return dict(lines={"target": [a_t, b_t], "draft": [a_d, b_d]},
                draft_fraction_batch1=costs.draft(1) / costs.target(2), sd_row_s=sd_row_s,
                ratios=checks, sd=sd_rows, same_forwards=same_forwards(rows))


def shown(path: Path) -> Path:
    """``path`` relative to the repository where it lies in it (as reports name files)."""
    root = RESULTS.parents[1]
    return path.resolve().relative_to(root) if path.resolve().is_relative_to(root) else path


def sd_own_work(paths: list[Path], env: dict) -> dict:
    """The per-row price of vLLM SD's own T>0 work from the phase profiles at ``paths`` that
    ran on the runs' machine kind (CPU model and flags); ``used`` False, and why, otherwise:
    that work is a property of the machine, and a profile from another says nothing of it."""
    kind = lambda e: (e.get("cpu_model"), sorted(e.get("cpu_flags") or []))  # noqa: E731
    found = [(p, json.loads(p.read_text())) for p in paths if p.exists()]
    mine = [(p, prof) for p, prof in found if kind(prof["environment"]) == kind(env)]
    if not mine:
        return dict(used=False, why=f"no profile of this machine kind among {len(found)} found "
                    f"of {len(paths)} named", profiles=[str(shown(p)) for p in paths])
    return dict(used=True, profiles=[str(shown(p)) for p, _ in mine],
                **sd_vocab_row_seconds([prof for _, prof in mine]))


def same_forwards(rows: list[dict]) -> list[dict]:
    """FLy's step over MTAD W=1's at each (T, γ, batch): one engine, the same chain, the same
    forwards, so a forward-count model prices them alike. How far apart they come out is how
    finely these runs can check any such model."""
    step = {(r["config"], r["batch"]): r["step_s"] for r in rows if r["engine"] == "mtad"}
    out = []
    for (name, batch), s in step.items():
        cut = name.split()  # "fly g4 T0" -> "mtad w1 g4 T0"
        w1 = step.get((f"mtad w1 {cut[1]} {cut[2]}", batch)) if cut[0] == "fly" else None
        if w1:
            out.append(dict(cell=f"{cut[1]} {cut[2]}", batch=batch, fly_over_w1=s / w1))
    return out


def gpu_projection(acceptance: dict, batches=(1, 16)) -> list[dict]:
    """Projected speedup over vLLM SD at the same γ (and T=0 prompt set), per rule and draft
    fraction, from the measured tokens per pass (mean over the prompt sets). Rows of the
    fixed (W, γ) configurations only: the adaptive policy's chooses its own."""
    tpp = t0_tokens_per_pass(acceptance)
    out = []
    for config, tokens in tpp.items():
        parts = config.split(" ")
        g = int(parts[-2][1:])
        w = int(parts[1][1:]) if parts[0] == "mtad" else 1
        sd = tpp.get(f"vllm_sd_greedy g{g} T0")
        if sd is None:
            continue
        row = dict(config=config, w=w, g=g, tokens_per_pass=tokens)
        speed = lambda f, b, w_, g_, tpp: tokens_per_second(gpu_costs(f), b, w_, g_, tpp)  # noqa: E731
        for f in FRACTIONS:  # over the target alone, batch 1
            row[f"vs target b1 f{f}"] = speed(f, 1, w, g, row["tokens_per_pass"]) / speed(
                f, 1, 1, 0, 1.0)
        for b in batches:  # over vLLM SD at the same γ (draft fraction 0.1)
            row[f"vs SD b{b} f0.1"] = (speed(0.1, b, w, g, row["tokens_per_pass"])
                                       / speed(0.1, b, 1, g, sd))
        out.append(row)
    return out


def markdown_rules(rows, check, projection) -> str:
    cell = lambda s: f"{s['median']:.2f} [{s['min']:.2f}, {s['max']:.2f}]"  # noqa: E731
    lines = ["Decoding (after each batch's prefill step); the whole run's ratio beside it:", "",
             "| configuration | batch | decode tok/s [min, max] | tokens / pass | tokens / step "
             "| s / step | vs vLLM SD, same γ and T | whole run vs vLLM SD |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['batch']} | {cell(r['tok_s'])} | "
                     f"{r['tokens_per_pass']:.2f} | {r['tokens_per_step']:.2f} | "
                     f"{r['step_s']:.3f} | "
                     f"{cell(r['vs_sd']) if r['vs_sd'] else '–'} | "
                     f"{cell(r['vs_sd_whole_run']) if r.get('vs_sd_whole_run') else '–'} |")
    own = check.get("sd_own_work") or {}
    lines += ["", "Cost model on this CPU (fitted to the MTAD engine's decoding steps; SD "
              "predicted from the same forwards; decode ratios, tokens per step):", ""]
    if own.get("used"):
        lines += [f"vLLM SD's own work at T>0 beyond the MTAD engine's: "
                  f"{own['per_row_s'] * 1e3:.2f} ms a full-vocabulary row, B·(2γ+1) rows a step "
                  f"(median of {len(own['pairs'])} profiled pairs, "
                  f"{own['range'][0] * 1e3:.2f}–{own['range'][1] * 1e3:.2f}; "
                  + ", ".join(own["profiles"]) + ").", ""]
    elif own:
        lines += [f"vLLM SD's own work at T>0 not priced: {own['why']}.", ""]
    lines += [
              "| configuration | batch | measured vs SD [min, max] | predicted | measured / "
              "predicted − 1 | within |", "|---|---|---|---|---|---|"]
    for c in check["ratios"]:
        lines.append(f"| {c['config']} | {c['batch']} | {cell(c['measured'])} | "
                     f"{c['predicted']:.2f} | {c['error']:+.1%} | "
                     f"{'yes' if c['within'] else 'no'} |")
    if check["ratios"]:
        within = sum(c["within"] for c in check["ratios"])
        errors = sorted(abs(c["error"]) for c in check["ratios"])
        lines += ["", f"Within their [min, max]: {within} of {len(errors)}; the model's "
                  f"error: median {statistics.median(errors):.1%}, largest {errors[-1]:.1%}."]
    if check["same_forwards"]:
        lines += ["", "The same forwards priced alike by any forward-count model: FLy's step "
                  "over MTAD W=1's, one engine, the same chain:", "",
                  "| cell | batch | FLy step / W=1 step |", "|---|---|---|"]
        lines += [f"| {s['cell']} | {s['batch']} | {s['fly_over_w1']:.2f} |"
                  for s in check["same_forwards"]]
    lines += ["", "vLLM SD's decoding step, measured and as the MTAD engine's costs predict it:",
              "", "| configuration | batch | s / step measured | predicted | of which SD's own "
              "work | measured / predicted |", "|---|---|---|---|---|---|"]
    for sd in check["sd"]:
        lines.append(f"| {sd['config']} | {sd['batch']} | {sd['step_s']:.3f} | "
                     f"{sd['predicted_step_s']:.3f} | {sd['own_s']:.3f} | "
                     f"{sd['step_s'] / sd['predicted_step_s']:.2f} |")
    if projection:
        heads = [k for k in projection[0] if k.startswith("vs ")]
        lines += ["", "GPU projection (a model, not a measurement; T=0, tokens per pass "
                  "measured here): speedup over the target alone at batch 1 by draft-forward "
                  "fraction f, and over vLLM SD at the same γ:", "",
                  "| rule | W | γ | tokens / pass | " + " | ".join(heads) + " |",
                  "|---" * (4 + len(heads)) + "|"]
        for p in projection:
            lines.append(f"| {p['config']} | {p['w']} | {p['g']} | {p['tokens_per_pass']:.2f} | "
                         + " | ".join(f"{p[h]:.2f}" for h in heads) + " |")
        best = {f: max(projection, key=lambda p: p[f"vs target b1 f{f}"])["config"]
                for f in FRACTIONS}
        lines += ["", "The fastest rule and (W, γ) at batch 1, by f: "
                  + "; ".join(f"f={f}: {c}" for f, c in best.items()) + "."]
    return "\n".join(lines)


def rules_main(argv) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    ap = grid_parser(RULES_DOC)
    ap.add_argument("--batches", type=number_list(), default=[1, 4])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--min-prompts", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--acceptance", type=Path,
                    default=Path("benchmarks/reports/acceptance-cpu/acceptance.json"))
    ap.add_argument("--out", type=Path, default=RESULTS / "rules-speed")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--sd-profiles", type=Path, nargs="*", default=list(SD_PROFILES),
                    help="benchmarks.phases step JSONs (T=1, one chain) that price vLLM SD's own "
                    "T>0 work per full-vocabulary row; used only when their CPU model and flags "
                    "are the runs' (none: forwards only)")
    args = parse_grid(ap, argv)
    if args.tokens < 2:
        ap.error(f"--tokens {args.tokens}: at least 2 (a run's first token is its prefill's; "
                 "decoding is timed after it)")
    args.batch = max(args.batches)
    path = args.out / "runs.json"
    if args.report_only:  # the machine the runs were timed on, not this one
        saved = json.loads(path.read_text())
        runs, env = saved["runs"], saved["environment"]
        args.dtype = saved.get("dtype")  # None: a runs.json from before it was recorded
        version = saved.get("code_version")
        run_args = saved.get("args")  # None: before they were recorded (this call's then)
    else:
        target, draft, tiny = resolve_pair(args)
        args.dtype = engine_dtype(args, tiny)
        # the code that runs, taken before it runs (the tree may change during a long run)
        version, commit = code_version(extra=OWN_CODE), code_commit()
        t0 = time.perf_counter()
        runs = run_rules(args, target, draft, tiny)
        args.out.mkdir(parents=True, exist_ok=True)
        env = environment()
        run_args = {k: str(v) for k, v in vars(args).items()}
        path.write_text(json.dumps({"runs": runs, "wall_s": time.perf_counter() - t0,
                                    "environment": env, "dtype": args.dtype,
                                    "code_version": version, "commit": commit,
                                    "args": run_args}, indent=1))
    rows = summarise_rules(runs, rule_speed_configs(args.gammas, args.widths))
    sd_own = sd_own_work(args.sd_profiles, env)
    check = cpu_model_check(rows, sd_own["per_row_s"] if sd_own.get("used") else 0.0)
    check["sd_own_work"] = sd_own
    args.sd_profiles = sd_own["profiles"]  # as this report names them (repository-relative)
    projection = (gpu_projection(json.loads(args.acceptance.read_text()))
                  if args.acceptance.exists() else [])
    table = markdown_rules(rows, check, projection)
    write_outputs("rules_speed", {"rows": rows, "cpu_model": check, "gpu_projection": projection,
                                  # the runs' own (--repeats, --tokens, ...) where recorded
                                  "args": (run_args or {}) | {
                                      k: str(v) for k, v in vars(args).items()
                                      if k in ("report_only", "acceptance", "dtype",
                                               "sd_profiles")
                                      or not run_args},
                                  "environment": env, "code_version": version,
                                  "report_code_version": code_version(extra=OWN_CODE)},
                  table, args.out)
    print(table)


if __name__ == "__main__":
    main()
