"""The main job: show MTAD decoding on a target/draft pair and say what it did.

Today it runs the reference implementation (vllm_mtad.reference) on a tiny random Llama pair
built locally; the vLLM path and the real model pair plug in here as they land.
"""

from __future__ import annotations

import argparse
import time

from vllm_mtad import envs
from vllm_mtad import reference as ref
from vllm_mtad.config import MTADConfig

PROMPTS = ["Return a new list of the items", "The logging module", "Split the string at"]

MODES = [
    ("greedy, target alone", None, ref.Sampling(temperature=0.0)),
    ("greedy, MTAD exact", "exact", ref.Sampling(temperature=0.0)),
    ("greedy, MTAD joint", "joint", ref.Sampling(temperature=0.0)),
    ("T=1 top-k 10 top-p 0.9, MTAD", "joint", ref.Sampling(1.0, top_k=10, top_p=0.9)),
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--beam-width", type=int, default=4)
    parser.add_argument("--threshold", type=float, default=0.5)
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from vllm_mtad.tiny_models import build_tiny_pair, load_pair

    print(f"Building (or reusing) a tiny random Llama pair under {envs.cache_dir()} ...")
    target_dir, draft_dir = build_tiny_pair(envs.cache_dir() / "tiny")
    target, draft = load_pair(target_dir, draft_dir)
    tok = AutoTokenizer.from_pretrained(target_dir)
    print(f"target: {target_dir} ({sum(p.numel() for p in target.parameters()):,} params)")
    print(f"draft:  {draft_dir} ({sum(p.numel() for p in draft.parameters()):,} params)")
    print("Engine: vllm_mtad.reference (plain transformers, batch 1, no KV cache).\n"
          "The models are random, so the text is noise; the acceptance figures are real.\n")

    rows = []
    for name, greedy_mode, sampling in MODES:
        lengths, tokens, seconds = [], 0, 0.0
        for i, prompt in enumerate(PROMPTS):
            ids = tok(prompt).input_ids
            t0 = time.perf_counter()
            if greedy_mode is None:
                out_ids = ref.greedy_decode(target, ids, args.max_tokens)
            else:
                cfg = MTADConfig(args.gamma, args.beam_width, args.threshold,
                                 greedy_mode if sampling.greedy else "joint")
                out = ref.generate(target, draft, ids, args.max_tokens, cfg, sampling, seed=i)
                out_ids = out.token_ids
                lengths += out.accepted_per_step
            seconds += time.perf_counter() - t0
            tokens += len(out_ids)
            if i == 0:
                print(f"[{name}] {prompt!r} -> {tok.decode(out_ids)!r}")
        mal = f"{1 + sum(lengths) / len(lengths):.2f}" if lengths else "1 (no draft)"
        rows.append((name, tokens, mal, tokens / seconds))

    print(f"\nγ={args.gamma}, W={args.beam_width}, τ={args.threshold}, "
          f"{len(PROMPTS)} prompts x {args.max_tokens} tokens")
    print("| mode | tokens | mean acceptance length | tokens/s (reference, unoptimised) |")
    print("|---|---|---|---|")
    for name, tokens, mal, tps in rows:
        print(f"| {name} | {tokens} | {mal} | {tps:.1f} |")


if __name__ == "__main__":
    main()
