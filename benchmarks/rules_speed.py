"""Speed of the acceptance rules on equal samplers (issue 46), this CPU's step costs fitted from
the same runs, and a GPU projection from the tokens per pass measured by benchmarks.acceptance.

    python -m benchmarks.rules_speed --out benchmarks/reports/rules-speed-cpu     # real pair
    python -m benchmarks.rules_speed --report-only --out benchmarks/reports/rules-speed-cpu
    python -m benchmarks.rules_speed --tiny --batches 1,2 --tokens 8 --repeats 1 --out DIR

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

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from benchmarks.acceptance import (build, configurations, engine_dtype, prepare,
                                   sampling_params)
from benchmarks.lib.engines import select_everywhere, selection_counts
from benchmarks.lib.projection import (fit_linear_costs, gpu_costs, sd_vocab_row_seconds,
                                       step_seconds, t0_tokens_per_pass, tokens_per_second,
                                       vocab_rows)
from benchmarks.lib.prompts import HALF, humaneval_prompts
from benchmarks.lib.report import RESULTS, code_commit, code_version, environment, write_outputs
from benchmarks.lib.runner import generate_in_batches, per_request_acceptance
from benchmarks.lib.stats import summary
from devtools.engine import close, release_memory
from devtools.models import grid_parser, number_list, parse_grid, resolve_pair

FRACTIONS = (0.05, 0.1, 0.2, 0.3)  # the GPU draft forward, as a fraction of a target pass
# vLLM SD's own T=1 work against the MTAD engine's, phase by phase, batch 1 and 4 (Intel Xeon)
SD_PROFILES = tuple(RESULTS.parent / "reports/step-phases-cpu" / d / "step_phases.json"
                    for d in ("t1-w1-one-chain", "t1-w1-b4", "t1-w1-b4-r6"))


# This program and acceptance's engines, beside report.code_version's defaults.
OWN_CODE = ("benchmarks/acceptance.py", "benchmarks/rules_speed.py",
            "benchmarks/lib/projection.py")


def speed_configs(gammas: list[int], widths: list[int]) -> list[dict]:
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
    prepare(llm, config)
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


def run(args, target: str, draft: str, tiny: bool) -> list[dict]:
    select_everywhere()  # equal samplers: every engine's top-k/top-p by one k-selection
    configs = speed_configs(args.gammas, args.widths)
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


def summarise(runs: list[dict], configs: list[dict]) -> list[dict]:
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


def markdown(rows, check, projection) -> str:
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


def main(argv=None) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    ap = grid_parser(__doc__)
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
        runs = run(args, target, draft, tiny)
        args.out.mkdir(parents=True, exist_ok=True)
        env = environment()
        run_args = {k: str(v) for k, v in vars(args).items()}
        path.write_text(json.dumps({"runs": runs, "wall_s": time.perf_counter() - t0,
                                    "environment": env, "dtype": args.dtype,
                                    "code_version": version, "commit": commit,
                                    "args": run_args}, indent=1))
    rows = summarise(runs, speed_configs(args.gammas, args.widths))
    sd_own = sd_own_work(args.sd_profiles, env)
    check = cpu_model_check(rows, sd_own["per_row_s"] if sd_own.get("used") else 0.0)
    check["sd_own_work"] = sd_own
    args.sd_profiles = sd_own["profiles"]  # as this report names them (repository-relative)
    projection = (gpu_projection(json.loads(args.acceptance.read_text()))
                  if args.acceptance.exists() else [])
    table = markdown(rows, check, projection)
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
