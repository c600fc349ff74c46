"""Multi-beam verification headroom, measured offline (issue 46): how many tokens per target
pass MTAD would take if the target verified all W beams (the longest accepted prefix over the
beams) instead of the best one, and what that costs in target rows.

    python -m benchmarks.headroom --widths 2,4,8 --gammas 4,8 --prompts humaneval:12,chat:12 \\
        --max-tokens 48 --out benchmarks/reports/headroom-cpu       # real pair (resumable)
    python -m benchmarks.headroom --tiny --widths 2 --gammas 3 --prompts chat:2 --max-tokens 8

Plain PyTorch over Hugging Face models (no vLLM), greedy "joint" MTAD at T=0 as
docs/algorithm.md defines it and devtools/reference.py implements it without a cache: beam
search of W beams over γ draft steps, the joint rule (the largest k with
Σ_{i≤k} log p(x_i) − log q(x_i) ≥ log τ, unprocessed softmaxes), then the target's argmax.
Here with KV caches: each model keeps its committed context's cache (batch 1); a draft step
runs every beam's tokens so far on a copy of the draft's cache, and one target pass reads all
W beams on a copy of the target's. The generation follows MTAD's own choice (the best beam by
draft score), so "best beam" is what MTAD accepts; "any beam" is, at the same round, the
longest prefix any beam would have had accepted (a per-round counterfactual on MTAD's path:
after a round where another beam wins, the real path would differ).

Target rows: verifying the best beam reads γ + 1 positions; verifying all W beams as batch rows
(vLLM removed tree attention, vllm#42121) reads W·(γ + 1); a tree verifier would read the
distinct prefixes of the beams (their trie's nodes) + 1, also reported.

One JSONL record per (W, γ, prompt set, prompt): the per-round accepted lengths, best and
any; a rerun skips what is there. Output: headroom.json, headroom.md in --out.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.acceptance import prompt_sets
from benchmarks.lib.report import RESULTS, records_environment, write_outputs
from benchmarks.lib.stats import bootstrap_mean
from devtools.models import add_model_args, number_list, resolve_pair


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


def accepted(beam: Beam, target_lp: torch.Tensor, tau: float) -> int:
    """The joint rule: the largest k with Σ_{i≤k} log p(x_i) − log q(x_i) ≥ log τ (0 if none).
    target_lp: [γ, V] the target's log-softmax at each of the beam's draft positions."""
    s, k = 0.0, 0
    for i, (tok, q) in enumerate(zip(beam.tokens, beam.logprobs)):
        s += float(target_lp[i, tok]) - q
        if s >= math.log(tau):
            k = i + 1
    return k


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
            ks = [accepted(b, lp[w, :gamma], tau) for w, b in enumerate(beams)]
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
    return (sum(ks) + len(ks)) / max(len(ks), 1)


def summarise(path: Path) -> tuple[dict, str]:
    by: dict = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ints = number_list()
    ap.add_argument("--widths", type=ints, default=[2, 4, 8])
    ap.add_argument("--gammas", type=ints, default=[4, 8])
    ap.add_argument("--prompts", default="humaneval:12,chat:12")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--tau", type=float, default=0.5)
    ap.add_argument("--out", type=Path, default=RESULTS / "headroom")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    path = args.out / "records.jsonl"
    if not args.report_only:
        from tqdm import tqdm
        from transformers import AutoModelForCausalLM, AutoTokenizer

        target_dir, draft_dir, _ = resolve_pair(args)
        load = lambda p: AutoModelForCausalLM.from_pretrained(  # noqa: E731
            p, dtype=torch.float32).eval()
        target, draft = load(target_dir), load(draft_dir)
        tok = AutoTokenizer.from_pretrained(target_dir)
        sets = prompt_sets(args.prompts)
        args.out.mkdir(parents=True, exist_ok=True)
        done = set()
        if path.exists():
            for line in path.read_text().splitlines():
                r = json.loads(line)
                done.add((r["width"], r["gamma"], r["set"], r["prompt"]))
        todo = [(w, g, s, i) for g in args.gammas for w in args.widths for s in sets
                for i in range(len(sets[s])) if (w, g, s, i) not in done]
        for w, g, s, i in tqdm(todo, desc="(W, γ, prompt)", unit="prompt"):
            t0 = time.perf_counter()
            r = run_prompt(target, draft, tok(sets[s][i]).input_ids, w, g, args.tau,
                           args.max_tokens, tok.eos_token_id)
            with path.open("a") as f:
                f.write(json.dumps(r | {"width": w, "gamma": g, "set": s, "prompt": i,
                                        "wall_s": time.perf_counter() - t0}) + "\n")
    rows, table = summarise(path)
    write_outputs("headroom", {"rows": rows, "args": {k: str(v) for k, v in vars(args).items()},
                               "environment": records_environment(args.out / "headroom.json",
                                                                  args.report_only)},
                  table, args.out)
    print(table)


if __name__ == "__main__":
    main()
