"""Tokens per target pass of each acceptance rule, on the same prompts: a figure that does not
depend on the machine.

Configurations, per draft length γ (``--gammas``) and temperature (``--temperatures``):

- ``vllm_sd`` (T > 0: probabilistic drafts, rejection sampling) and ``vllm_sd_greedy`` (T = 0:
  greedy drafts): vLLM's own draft_model engine, one per γ;
- on one MTAD engine (W ≤ max ``--widths``, γ ≤ max ``--gammas``; ``beam_kv_fraction`` 0.5, so
  every row of the batch has room for its beams: the run records the rows narrowed to one beam,
  which must be 0), each with every step's (W, γ) forced:
  - ``mtad_exact w1`` (T = 0): the draft's argmax chain, accepted while it is the target's
    argmax: vLLM's greedy rule on MTAD's engine (a check: it must match ``vllm_sd_greedy``);
  - ``fly``: the same drafts (T = 0: the argmax chain; T > 0: one sampled chain), FLy's rule
    (vllm_mtad.sampler.use_comparison_rule, its defaults: window min(6, γ − 1), entropy
    threshold 0.3; at T > 0 the p/q test and the residual at a rejection);
  - ``mtad w{W}``: MTAD's rule, greedy "joint" at T = 0, sampled at T > 0;
- ``mtad_adaptive`` (``--adaptive``): MTAD with the adaptive policy choosing each step's
  (W, γ) up to the largest ``--widths`` and ``--gammas``, on its own engine, after one
  unrecorded pass over the same prompts (other seeds) so that its cost lines and acceptance
  statistics are measured; each record keeps the arms the policy chose for its run.

Tokens per target pass of a request: (accepted draft tokens + verify steps) / verify steps,
from vLLM's per-request spec-decode histogram (a verify step's bonus or extra token counts
once). One JSONL record per (configuration, prompt set, prompt); a rerun skips the records it
has (resumable). The summary gives, per configuration and prompt set, the pooled tokens per
pass, the per-prompt mean with a bootstrap interval, the paired difference against vLLM's
(per prompt), and the distribution of accepted lengths; a Markdown table and a plot.

    python -m benchmarks.acceptance --temperatures 0 --gammas 4,8 --widths 1,4 \\
        --prompts humaneval:16,chat:16 --max-tokens 64 --out DIR          # real pair
    python -m benchmarks.acceptance --tiny --prompts chat:4 --max-tokens 16 --out DIR
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.lib.prompts import PAPER, chat_prompts, humaneval_prompts
from benchmarks.lib.report import RESULTS, code_version, records_environment, write_outputs
from benchmarks.lib.runner import per_request_acceptance
from benchmarks.lib.stats import bootstrap_mean, paired_bootstrap_diff
from devtools.models import grid_parser, parse_grid, resolve_pair


def configurations(temperatures, gammas, widths, adaptive: bool = False) -> list[dict]:
    """Every configuration to run: name, engine, temperature, γ, W, request mode, rule."""
    out = []
    for t in temperatures:
        for g in gammas:
            sd = "vllm_sd_greedy" if t == 0 else "vllm_sd"
            out.append(dict(name=f"{sd} g{g} T{t:g}", engine=f"{sd}:{g}", t=t, g=g, w=1))
            if t == 0:
                out.append(dict(name=f"mtad_exact w1 g{g} T0", engine="mtad", t=t, g=g, w=1,
                                mode="exact"))
            out.append(dict(name=f"fly g{g} T{t:g}", engine="mtad", t=t, g=g, w=1,
                            mode="exact", rule="fly"))  # (the mode is read at T = 0 only)
            out += [dict(name=f"mtad w{w} g{g} T{t:g}", engine="mtad", t=t, g=g, w=w,
                         mode="joint") for w in widths]
    if adaptive:  # bounds: the largest W and γ of the grid
        out += [dict(name=f"mtad_adaptive w{max(widths)} g{max(gammas)} T{t:g}",
                     engine="mtad_adaptive", t=t, g=max(gammas), w=max(widths), mode="joint",
                     adaptive=True) for t in temperatures]
    return out


def prompt_sets(spec: str) -> dict[str, list[str]]:
    """"humaneval:16,chat:16" -> {"humaneval": [...16], "chat": [...16]}."""
    sources = {"humaneval": humaneval_prompts, "chat": chat_prompts}
    out = {}
    for part in spec.split(","):
        name, n = part.split(":")
        out[name] = sources[name](int(n))
    return out


def engine_dtype(args, tiny: bool) -> str:
    """The dtype :func:`build` gives an engine: float32 for the tiny pair, else ``--dtype``."""
    return "float32" if tiny else args.dtype


def build(engine: str, args, target: str, draft: str, tiny: bool, log_stats: bool = False):
    """One engine of the grid (``log_stats``: vLLM keeps each request's timestamps)."""
    from devtools.engine import build_llm, draft_model_spec, mtad_spec

    common = dict(dtype=engine_dtype(args, tiny), max_model_len=2048,
                  max_num_seqs=args.batch, max_num_batched_tokens=4096, block_size=32,
                  kv_cache_bytes=(256 << 20) if tiny else getattr(args, "kv_bytes", 1 << 30),
                  enable_prefix_caching=False, per_request_spec_decode_metrics="summary",
                  disable_log_stats=not log_stats)
    if engine == "target":  # the target alone (benchmarks.rules_quality's baseline)
        common.pop("per_request_spec_decode_metrics")
        return build_llm(target, None, **common)
    if engine in ("mtad", "mtad_adaptive"):
        policy = "adaptive" if engine == "mtad_adaptive" else "fixed"
        spec = mtad_spec(draft, gamma=max(args.gammas), width=max(args.widths),
                         beam_kv_fraction=0.5, speculation_policy=policy)
        return build_llm(target, spec, **common)
    kind, gamma = engine.split(":")
    extra = {"draft_sample_method": "greedy"} if kind == "vllm_sd_greedy" else {}
    return build_llm(target, draft_model_spec(draft, int(gamma), **extra), **common)


def prepare(llm, config: dict) -> None:
    """Set the MTAD engine up for ``config``: every step's (W, γ) (or the policy's) and the rule
    (FLy or MTAD's)."""
    if config["engine"] in ("mtad", "mtad_adaptive"):
        from vllm_mtad.policy.controller import force_plans
        from vllm_mtad.sampler import FlyRule, use_comparison_rule

        llm.collective_rpc(force_plans(None if config.get("adaptive")
                                       else [(config["w"], config["g"])]))
        llm.collective_rpc(use_comparison_rule(FlyRule() if config.get("rule") else None))


def sampling_params(config: dict, n: int, max_tokens: int, stop=None, ignore_eos=False,
                    seed: int = 1000) -> list:
    """One request's parameters per prompt (seed ``seed`` + prompt): the paper's top-k 10,
    top-p 0.9 at T > 0, greedy at T = 0 with the configuration's greedy rule."""
    from vllm import SamplingParams

    sampling = PAPER if config["t"] > 0 else {"temperature": 0.0}
    extra = {"greedy_acceptance": config["mode"]} if config["t"] == 0 and "mode" in config \
        else None
    return [SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, seed=seed + i,
                           stop=stop, extra_args=extra, **sampling) for i in range(n)]


def run_config(llm, config: dict, prompts: list[str], max_tokens: int, stop=None
               ) -> list[dict]:
    """One record per prompt: its verify steps, accepted tokens and their histogram, and the
    output (token ids, text, why it ended). ``stop``: stop strings (None: none)."""
    prepare(llm, config)
    params = sampling_params(config, len(prompts), max_tokens, stop)
    outs = llm.generate(prompts, params, use_tqdm=False)
    records = []
    for i, out in enumerate(outs):
        metrics = out.outputs[0].spec_decode_metrics  # None: the target alone
        hist = list(metrics.histogram) if metrics is not None else []
        steps, accepted = per_request_acceptance([out])
        records.append(dict(prompt=i, tokens=len(out.outputs[0].token_ids), steps=steps,
                            accepted=accepted, histogram=hist,
                            token_ids=list(out.outputs[0].token_ids), text=out.outputs[0].text,
                            finish_reason=out.outputs[0].finish_reason))
    return records


def drafter_counters(llm) -> dict:
    from vllm_mtad.proposer import drafter_stats

    return llm.collective_rpc(drafter_stats)[0]


def chosen_since(before: dict, after: dict) -> dict:
    """The policy's chosen arms ("W{w}_g{g}" -> steps) between two drafter_stats()."""
    old = before.get("policy_chosen", {})
    return {k: n - old.get(k, 0) for k, n in after.get("policy_chosen", {}).items()
            if n > old.get(k, 0)}


def run(args) -> Path:
    target, draft, tiny = resolve_pair(args)
    sets = prompt_sets(args.prompts)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "records.jsonl"
    done = set()
    if path.exists():
        for line in path.read_text().splitlines():
            r = json.loads(line)
            done.add((r["config"], r["set"]))
    configs = configurations(args.temperatures, args.gammas, args.widths,
                             getattr(args, "adaptive", False))
    for engine in dict.fromkeys(c["engine"] for c in configs):
        todo = [(c, s) for c in configs if c["engine"] == engine for s in sets
                if (c["name"], s) not in done]
        if not todo:
            continue
        llm = build(engine, args, target, draft, tiny)
        try:
            for config, name in todo:
                if config.get("adaptive"):  # unrecorded: the policy measures its arms
                    prepare(llm, config)
                    llm.generate(sets[name], sampling_params(config, len(sets[name]),
                                                             args.max_tokens, seed=5000),
                                 use_tqdm=False)
                before = drafter_counters(llm) if config.get("adaptive") else {}
                records = run_config(llm, config, sets[name], args.max_tokens)
                extra = {}
                if engine.startswith("mtad"):
                    after = drafter_counters(llm)
                    extra = {"narrowed_rows": int(after.get("narrowed_rows", 0))}
                    if config.get("adaptive"):
                        extra["policy_chosen"] = chosen_since(before, after)
                with path.open("a") as f:
                    for r in records:
                        f.write(json.dumps(r | {"config": config["name"], "set": name} | extra)
                                + "\n")
                print(f"{config['name']} on {name}: {tokens_per_pass(records):.3f} tokens "
                      "per target pass", flush=True)
        finally:
            from devtools.engine import close

            close(llm)
    return path


def tokens_per_pass(records: list[dict]) -> float:
    steps = sum(r["steps"] for r in records)
    return (sum(r["accepted"] for r in records) + steps) / max(steps, 1)


def _paired(records: list[dict], base: list[dict] | None):
    """(mean, low, high) of the per-prompt difference in tokens per pass, None without a base
    of the same prompts."""
    if not base or len(base) != len(records):
        return None
    base = sorted(base, key=lambda r: r["prompt"])
    return paired_bootstrap_diff([tokens_per_pass([r]) for r in records],
                                 [tokens_per_pass([r]) for r in base])


def policy_shares(counts: dict) -> dict:
    """The adaptive policy's arms of one run ("W{w}_g{g}" -> steps) as shares of its steps,
    most chosen first."""
    steps = max(sum(counts.values()), 1)
    return {k: round(n / steps, 3) for k, n in sorted(counts.items(), key=lambda kv: -kv[1])}


def _cell(diff) -> str:
    return "–" if diff is None else f"{diff[0]:+.2f} [{diff[1]:+.2f}, {diff[2]:+.2f}]"


def summarise(path: Path, args) -> tuple[dict, str]:
    by = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        by.setdefault((r["config"], r["set"]), []).append(r)
    rows, table = {}, ["| configuration | prompts | tokens / pass (pooled) | per-prompt mean "
                       "[95 %] | vs vLLM SD, paired [95 %] | vs FLy, paired [95 %] | "
                       "accepted-length distribution |", "|---|---|---|---|---|---|---|"]
    for (config, name), records in by.items():
        records.sort(key=lambda r: r["prompt"])
        g, t = config.split(" ")[-2], config.split(" ")[-1]
        same = {c.split(" ")[0]: v for (c, s), v in by.items()
                if s == name and c.endswith(f"{g} {t}")}
        sd = same.get("vllm_sd_greedy") or same.get("vllm_sd")
        hist = [sum(r["histogram"][j] if j < len(r["histogram"]) else 0 for r in records)
                for j in range(max(len(r["histogram"]) for r in records))]
        while len(hist) > 1 and hist[-1] == 0:
            hist.pop()
        total = max(sum(hist), 1)
        # per prompt only where every prompt drafted (the adaptive policy may not draft at
        # all: its steps without a draft are in tokens_per_any_pass below)
        per_prompt = all(r["steps"] > 0 for r in records)
        m = rows[f"{config} | {name}"] = dict(
            pooled=tokens_per_pass(records) if any(r["steps"] for r in records) else None,
            mean=bootstrap_mean([tokens_per_pass([r]) for r in records]) if per_prompt
            else None,
            vs_sd=None if sd is records or not per_prompt else _paired(records, sd),
            vs_fly=None if same.get("fly") is records or not per_prompt
            else _paired(records, same.get("fly")),
            distribution=[round(n / total, 3) for n in hist],
            narrowed_rows=max(r.get("narrowed_rows", 0) for r in records))
        if "policy_chosen" in records[0]:  # the same counts, the run's, in each record
            m["policy_chosen"] = policy_shares(records[0]["policy_chosen"])
            # its steps without a draft (γ = 0) are target passes too: tokens over all passes
            # (a pass yields 1 + its accepted tokens; the prompt's pass counts as one)
            m["tokens_per_any_pass"] = sum(r["tokens"] for r in records) / max(
                sum(r["tokens"] - r["accepted"] for r in records), 1)
        pooled, mean = m["pooled"], m["mean"]
        table.append(f"| {config} | {name} ({len(records)}) | "
                     f"{'–' if pooled is None else f'{pooled:.2f}'} | "
                     + ("–" if mean is None else
                        f"{mean[0]:.2f} [{mean[1]:.2f}, {mean[2]:.2f}]") + " | "
                     f"{_cell(m['vs_sd'])} | {_cell(m['vs_fly'])} | "
                     f"{' '.join(f'{x:.2f}' for x in m['distribution'])} |")
    chosen = [f"- {key.replace(' | ', ' on ')}: "
              + ", ".join(f"{arm} {share:.0%}" for arm, share in m["policy_chosen"].items())
              + f"; {m['tokens_per_any_pass']:.2f} tokens a target pass, steps without a "
              "draft included" for key, m in rows.items() if "policy_chosen" in m]
    if chosen:
        table += ["", "The adaptive policy's arms (share of its steps):", *chosen]
    payload = {"rows": rows, "args": {k: str(v) for k, v in vars(args).items()},
               "environment": records_environment(args.out / "acceptance.json",
                                                  args.report_only),
               "code_version": code_version()}
    return payload, "\n".join(table)


def plot(payload: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, m in payload["rows"].items() if m["pooled"] is not None]
    values = [payload["rows"][n]["pooled"] for n in names]
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(names) + 1.5))
    ax.barh(range(len(names)), values)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("tokens per target pass (pooled)")
    fig.tight_layout()
    fig.savefig(out / "acceptance.png", dpi=120)


def main(argv=None) -> None:
    ap = grid_parser(__doc__, temperatures=[0.0, 1.0], widths=[1, 4, 8])
    ap.add_argument("--prompts", default="humaneval:16,chat:16")
    ap.add_argument("--adaptive", action="store_true",
                    help="also MTAD with the adaptive policy, bounded by the largest W and γ")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--out", type=Path, default=RESULTS / "acceptance")
    ap.add_argument("--report-only", action="store_true")
    args = parse_grid(ap, argv)
    path = args.out / "records.jsonl" if args.report_only else run(args)
    payload, table = summarise(path, args)
    write_outputs("acceptance", payload, table, args.out)
    plot(payload, args.out)
    print(table)


if __name__ == "__main__":
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    main()
