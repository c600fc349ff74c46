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
    (vllm_mtad.worker_rpc.use_baseline_rule, its defaults: window min(6, γ − 1), entropy
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

**--all-beams: the multi-beam headroom**, measured offline: how many tokens per target pass MTAD
would take if the target verified all W beams (the longest accepted prefix over the beams)
instead of the best one, and what that costs in target rows.

    python -m benchmarks.acceptance --all-beams --widths 2,4,8 --gammas 4,8 \\
        --prompts humaneval:12,chat:12 --max-tokens 48 --out DIR    # real pair (resumable)
    python -m benchmarks.acceptance --all-beams --tiny --widths 2 --gammas 3 --prompts chat:2 \\
        --max-tokens 8 --out DIR

Plain PyTorch over Hugging Face models (no vLLM), greedy "joint" MTAD at T=0 as
docs/algorithm.md defines it and devtools/reference.py implements it without a cache: beam
search of W beams over γ draft steps, the joint rule (the package's own,
vllm_mtad.core.acceptance: the largest k with Σ_{i≤k} log p(x_i) − log q(x_i) ≥ log τ, here on
unprocessed softmaxes), then the target's argmax.
Here with KV caches: each model keeps its committed context's cache (batch 1); a draft step
runs every beam's tokens so far on a copy of the draft's cache, and one target pass reads all
W beams on a copy of the target's. The generation follows MTAD's own choice (the best beam by
draft score), so "best beam" is what MTAD accepts; "any beam" is, at the same round, the
longest prefix any beam would have had accepted (a per-round counterfactual on MTAD's path:
after a round where another beam wins, the real path would differ). Target rows: verifying
the best beam reads γ + 1 positions; verifying all W beams as batch rows (vLLM removed tree
attention, vllm#42121) reads W·(γ + 1); a tree verifier would read the distinct prefixes of
the beams (their trie's nodes) + 1, also reported. One JSONL record per (W, γ, prompt set,
prompt); output headroom.json, headroom.md (default folder: benchmarks/results/headroom).
"""

from __future__ import annotations

import copy
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.lib.engines import build, close, configurations, prepare_rule, sampling_params
from benchmarks.lib.models import grid_parser, parse_grid, resolve_pair
from benchmarks.lib.prompts import prompt_sets
from benchmarks.lib.report import RESULTS, code_version, records_environment, write_outputs
from benchmarks.lib.runner import chosen_since, drafter_counters, run_config
from benchmarks.lib.stats import bootstrap_mean, paired_bootstrap_diff, tokens_per_pass
from benchmarks.lib.store import Store


def run(args) -> Path:
    target, draft, tiny = resolve_pair(args)
    sets = prompt_sets(args.prompts)
    args.out.mkdir(parents=True, exist_ok=True)
    store = Store(args.out / "records.jsonl", key=lambda r: (r["config"], r["set"]))
    configs = configurations(args.temperatures, args.gammas, args.widths,
                             getattr(args, "adaptive", False))
    for engine in dict.fromkeys(c["engine"] for c in configs):
        todo = [(c, s) for c in configs if c["engine"] == engine for s in sets
                if (c["name"], s) not in store]
        if not todo:
            continue
        llm = build(engine, args, target, draft, tiny)
        try:
            for config, name in todo:
                if config.get("adaptive"):  # unrecorded: the policy measures its arms
                    prepare_rule(llm, config)
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
                store.append([r | {"config": config["name"], "set": name} | extra
                              for r in records])
                print(f"{config['name']} on {name}: {tokens_per_pass(records):.3f} tokens "
                      "per target pass", flush=True)
        finally:
            close(llm)
    return store.path


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
    for r in Store(path, key=lambda r: (r["config"], r["set"], r["prompt"])).records:
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


# --all-beams: the multi-beam headroom, offline (plain PyTorch over Hugging Face models).


def _beams_key(r: dict) -> tuple:
    return (r["width"], r["gamma"], r["set"], r["prompt"])


class Context:
    """One model over the committed context: its KV cache (batch 1) and last logits."""

    def __init__(self, model, prompt: list[int]):
        self.model = model
        out = model(torch.tensor([prompt]), use_cache=True, logits_to_keep=1)
        self.cache, self.last = out.past_key_values, out.logits[0, -1].float()

    def extend(self, tokens: list[int]) -> None:
        out = self.model(torch.tensor([tokens]), past_key_values=self.cache, use_cache=True,
                         logits_to_keep=1)
        self.cache, self.last = out.past_key_values, out.logits[0, -1].float()

    def rows(self, rows: list[list[int]], last_only: bool = False) -> torch.Tensor:
        """[R, t, V] float logits of R equal-length continuations of the context ([R, 1, V]:
        the last position's only); the context's cache is left as it was."""
        cache = copy.deepcopy(self.cache)
        cache.batch_repeat_interleave(len(rows))
        return self.model(torch.tensor(rows), past_key_values=cache, use_cache=True,
                          logits_to_keep=1 if last_only else 0).logits.float()


@dataclass
class Beam:
    score: float  # Σ log q of its tokens
    tokens: list[int]
    logprobs: list[float]  # log q per token


def beam_search(draft: Context, width: int, gamma: int) -> list[Beam]:
    """Greedy beam search (MTAD at T=0): the W best continuations by joint draft log-prob,
    best first."""
    lp = draft.last.log_softmax(-1)
    top = lp.topk(width)
    beams = [Beam(float(s), [int(t)], [float(s)]) for s, t in zip(top.values, top.indices)]
    for _ in range(gamma - 1):
        lps = draft.rows([b.tokens for b in beams], last_only=True)[:, -1].log_softmax(-1)
        joint = torch.tensor([b.score for b in beams])[:, None] + lps
        best = joint.flatten().topk(width)
        V = lps.shape[1]
        beams = [Beam(float(s), beams[i // V].tokens + [i % V],
                      beams[i // V].logprobs + [float(lps[i // V, i % V])])
                 for s, i in zip(best.values.tolist(), best.indices.tolist())]
    return beams


def accepted(beams: list[Beam], target_lp: torch.Tensor, tau: float) -> list[int]:
    """Each beam's k* by the package's joint rule (vllm_mtad.core.acceptance: the largest k
    with Σ_{i≤k} log p(x_i) − log q(x_i) ≥ log τ, 0 if none). target_lp: [W, γ + 1, V] the
    target's log-softmax at each beam's draft positions and one past."""
    from vllm_mtad.core.acceptance import accepted_lengths

    width = len(beams)
    return accepted_lengths(torch.tensor([b.tokens for b in beams]),
                            torch.tensor([b.logprobs for b in beams]), target_lp,
                            torch.full((width,), tau), torch.zeros(width, dtype=torch.bool)
                            ).tolist()


def trie_nodes(beams: list[Beam]) -> int:
    """Distinct non-empty prefixes over the beams: the draft positions a tree verifier reads."""
    return len({tuple(b.tokens[:j]) for b in beams for j in range(1, len(b.tokens) + 1)})


def run_prompt(target, draft, prompt: list[int], width: int, gamma: int, tau: float,
               max_tokens: int, eos: int | None) -> dict:
    """MTAD on one prompt (the best beam's path), with every round's counterfactual."""
    with torch.no_grad():
        t_ctx, d_ctx = Context(target, prompt), Context(draft, prompt)
        out = [int(t_ctx.last.argmax())]  # the prefill's token (target only), as vLLM's
        t_ctx.extend(out)
        d_ctx.extend(out)
        best_k, any_k, nodes = [], [], []
        while len(out) < max_tokens and out[-1] != eos:
            beams = beam_search(d_ctx, width, gamma)
            logits = t_ctx.rows([b.tokens for b in beams])  # [W, γ, V]
            # Position i's distribution: the context's last logits (i = 0), else the beam's.
            lp = torch.cat([t_ctx.last[None, None].expand(len(beams), 1, -1), logits], 1)
            lp = lp.log_softmax(-1)  # [W, γ+1, V]
            ks = accepted(beams, lp, tau)
            k = ks[0]  # MTAD verifies the best beam (beam_search returns it first)
            best_k.append(k)
            any_k.append(max(ks))
            nodes.append(trie_nodes(beams))
            new = beams[0].tokens[:k] + [int(lp[0, k].argmax())]
            new = new[:max_tokens - len(out)]
            if eos in new:
                new = new[:new.index(eos) + 1]
            out += new
            t_ctx.extend(new)
            d_ctx.extend(new)
    return {"best": best_k, "any": any_k, "trie_nodes": nodes, "tokens": len(out),
            "output": out}


def per_pass(ks: list[int]) -> float:
    """Tokens per target pass of rounds that accepted ``ks`` (the extra token counted)."""
    return (sum(ks) + len(ks)) / max(len(ks), 1)


def summarise_all_beams(path: Path) -> tuple[dict, str]:
    by: dict = {}
    for r in Store(path, key=_beams_key).records:
        by.setdefault((r["width"], r["gamma"]), []).append(r)
    rows, table = {}, [
        "| W | γ | prompts | rounds | tokens / pass, best beam | tokens / pass, any beam | gain "
        "[95 %, per prompt] | target rows per pass: best, all beams (rows), tree (nodes + 1) |",
        "|---|---|---|---|---|---|---|---|"]
    for (w, g), recs in sorted(by.items()):
        best = [k for r in recs for k in r["best"]]
        anyk = [k for r in recs for k in r["any"]]
        nodes = [n for r in recs for n in r["trie_nodes"]]
        gain = bootstrap_mean([per_pass(r["any"]) / per_pass(r["best"]) - 1 for r in recs])
        m = rows[f"W{w} g{g}"] = dict(
            width=w, gamma=g, prompts=len(recs), rounds=len(best), best=per_pass(best),
            any=per_pass(anyk), gain=per_pass(anyk) / per_pass(best) - 1, gain_per_prompt=gain,
            rows_best=g + 1, rows_all=w * (g + 1), tree_rows=sum(nodes) / len(nodes) + 1)
        table.append(f"| {w} | {g} | {len(recs)} | {len(best)} | {m['best']:.2f} | "
                     f"{m['any']:.2f} | {100 * m['gain']:+.1f} % [{100 * gain[1]:+.1f}, "
                     f"{100 * gain[2]:+.1f}] | {g + 1}, {w * (g + 1)}, "
                     f"{m['tree_rows']:.1f} |")
    return rows, "\n".join(table)


def run_all_beams(args) -> Path:
    """Every missing (W, γ, prompt set, prompt) of --all-beams, one record each, resumable."""
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target_dir, draft_dir, _ = resolve_pair(args)
    load = lambda p: AutoModelForCausalLM.from_pretrained(  # noqa: E731
        p, dtype=torch.float32).eval()
    target, draft = load(target_dir), load(draft_dir)
    tok = AutoTokenizer.from_pretrained(target_dir)
    sets = prompt_sets(args.prompts)
    args.out.mkdir(parents=True, exist_ok=True)
    store = Store(args.out / "records.jsonl", key=_beams_key)
    todo = [(w, g, s, i) for g in args.gammas for w in args.widths for s in sets
            for i in range(len(sets[s])) if (w, g, s, i) not in store]
    for w, g, s, i in tqdm(todo, desc="(W, γ, prompt)", unit="prompt"):
        t0 = time.perf_counter()
        r = run_prompt(target, draft, tok(sets[s][i]).input_ids, w, g, args.tau,
                       args.max_tokens, tok.eos_token_id)
        store.append([r | {"width": w, "gamma": g, "set": s, "prompt": i,
                           "wall_s": time.perf_counter() - t0}])
    return store.path


def all_beams_main(args) -> None:
    path = args.out / "records.jsonl" if args.report_only else run_all_beams(args)
    rows, table = summarise_all_beams(path)
    write_outputs("headroom", {"rows": rows, "args": {k: str(v) for k, v in vars(args).items()},
                               "environment": records_environment(args.out / "headroom.json",
                                                                  args.report_only)},
                  table, args.out)
    print(table)


# The defaults of the two modes: the rules' grid, and --all-beams (the headroom).
DEFAULTS = {False: dict(widths=[1, 4, 8], prompts="humaneval:16,chat:16", max_tokens=64,
                        out=RESULTS / "acceptance"),
            True: dict(widths=[2, 4, 8], prompts="humaneval:12,chat:12", max_tokens=48,
                       out=RESULTS / "headroom")}


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    defaults = DEFAULTS["--all-beams" in argv]
    ap = grid_parser(__doc__, temperatures=[0.0, 1.0], widths=defaults["widths"])
    ap.add_argument("--prompts", default=defaults["prompts"])
    ap.add_argument("--adaptive", action="store_true",
                    help="also MTAD with the adaptive policy, bounded by the largest W and γ")
    ap.add_argument("--all-beams", action="store_true",
                    help="the multi-beam headroom instead: offline, T=0, every beam verified")
    ap.add_argument("--tau", type=float, default=0.5, help="--all-beams: the joint rule's τ")
    ap.add_argument("--max-tokens", type=int, default=defaults["max_tokens"])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--out", type=Path, default=defaults["out"])
    ap.add_argument("--report-only", action="store_true")
    args = parse_grid(ap, argv)
    if args.all_beams:
        return all_beams_main(args)
    path = args.out / "records.jsonl" if args.report_only else run(args)
    payload, table = summarise(path, args)
    write_outputs("acceptance", payload, table, args.out)
    plot(payload, args.out)
    print(table)


if __name__ == "__main__":
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    main()
