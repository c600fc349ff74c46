"""The main job: MTAD inside vLLM next to the target alone and vLLM's own speculative decoding.

    python -m devtools.demo            # the real pair (Qwen2.5-Coder 1.5B + 0.5B), fetched once
    python -m devtools.demo --tiny     # a tiny random pair built locally, no download
    python -m devtools.demo --target DIR --draft DIR

Each method runs in its own engine on the same prompts with the same sampling parameters (the
paper's: T=1, top-k 10, top-p 0.9). Every engine first generates once on other prompts, untimed
(warm-up: first-run effects, and the measurements MTAD's speculation policy chooses from); the
table reports the timed run's output tokens/s and vLLM's own mean acceptance length (accepted
draft tokens per step + 1). MTAD runs with the settings a user gets by default, apart from the
ones given on the command line.
"""

from __future__ import annotations

import argparse
import os
import time

from devtools.engine import (build_llm, close, counters_delta, draft_model_spec,
                             mean_acceptance_length, mtad_spec, spec_counters)
from devtools.models import add_model_args, resolve_pair

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain what a hash map is in two sentences.",
    "Write a Python function that checks whether a string is a palindrome.",
]
WARM_UP_PROMPTS = [
    "Write a Python function that merges two sorted lists.",
    "Explain what a binary search tree is in two sentences.",
    "Write a Python function that counts the vowels in a string.",
]


def methods(draft: str, gamma: int, width: int, tau: float):
    from vllm_mtad.config import MTADConfig

    policy = MTADConfig(num_speculative_tokens=gamma).speculation_policy  # the default
    return [
        ("target alone", None),
        ("vLLM speculative decoding (draft_model, probabilistic)", draft_model_spec(draft, gamma)),
        (f"MTAD (W≤{width}, γ≤{gamma}, τ={tau}, {policy} policy)"
         if policy == "adaptive" else f"MTAD (W={width}, γ={gamma}, τ={tau})",
         mtad_spec(draft, gamma, width, tau)),
    ]


def format_prompts(tokenizer, prompts: list[str], tiny: bool) -> list[str]:
    if tiny or not getattr(tokenizer, "chat_template", None):
        return prompts
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                          add_generation_prompt=True) for p in prompts]


def run_method(target, spec, prompts_text, max_tokens, tiny, kv_bytes):
    from vllm import SamplingParams

    llm = build_llm(target, spec, dtype="float32" if tiny else "bfloat16", max_model_len=2048,
                    max_num_seqs=len(prompts_text), block_size=None, kv_cache_bytes=kv_bytes,
                    disable_log_stats=False)
    params = [SamplingParams(max_tokens=max_tokens, temperature=1.0, top_k=10, top_p=0.9,
                             seed=i, ignore_eos=tiny) for i in range(len(prompts_text))]
    warm = format_prompts(llm.get_tokenizer(), WARM_UP_PROMPTS[:len(prompts_text)], tiny)
    llm.generate(warm, params[:len(warm)], use_tqdm=False)  # untimed
    prompts = format_prompts(llm.get_tokenizer(), prompts_text, tiny)
    before = spec_counters(llm)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    counters = counters_delta(spec_counters(llm), before)
    close(llm)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "mean_acceptance_length": mean_acceptance_length(counters),
            "sample": outs[0].outputs[0].text}


def main(argv: list[str] | None = None) -> None:
    # Engines in this process (a quicker start), and vLLM's log quiet under the table.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(parser)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--beam-width", type=int, default=4)
    parser.add_argument("--threshold", type=float, default=0.5)
    args = parser.parse_args(argv)

    target, draft, tiny = resolve_pair(args)
    max_tokens = args.max_tokens or (48 if tiny else 96)
    kv_bytes = (256 << 20) if tiny else (2 << 30)
    print(f"target: {target}\ndraft:  {draft}")
    print(f"{len(PROMPTS)} prompts x {max_tokens} tokens, T=1 top-k 10 top-p 0.9, batch "
          f"{len(PROMPTS)}; each method in its own vLLM engine.")
    if tiny:
        print("The tiny models are random: their text is noise, their acceptance figures real.")
    rows = []
    for name, spec in methods(draft, args.gamma, args.beam_width, args.threshold):
        print(f"running: {name} ...", flush=True)
        rows.append((name, run_method(target, spec, PROMPTS, max_tokens, tiny, kv_bytes)))

    print("\n| method | output tokens | tokens/s | mean acceptance length |")
    print("|---|---|---|---|")
    for name, r in rows:
        mal = f"{r['mean_acceptance_length']:.2f}" if r["mean_acceptance_length"] else "—"
        print(f"| {name} | {r['tokens']} | {r['tokens_per_s']:.1f} | {mal} |")
    print(f"\nFirst prompt: {PROMPTS[0]!r}")
    for name, r in rows:
        print(f"--- {name}:\n{r['sample'].strip()[:400]}")


if __name__ == "__main__":
    main()
