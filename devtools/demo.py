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

Equal samplers: on CPU vLLM's top-k/top-p sorts the vocabulary and MTAD's engine selects the top
k instead, so every engine here samples by the same k-selection (VLLM_MTAD_CPU_TOPK_SELECT, the
same tokens as vLLM's sort), and the target alone and vLLM SD are timed once more with vLLM's own
sampler ("as shipped"); the last lines say how much of MTAD's lead the sampler makes. This is a
demo (one timed run each); ``bash scripts/bench.sh`` measures with repeats.

vLLM's own log (and the C++ warnings of its kernels) goes to a file the demo names,
benchmarks/results/demo-vllm.log by default (``--log``); ``--verbose`` shows it on the terminal
instead.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from devtools.engine import (build_llm, close, counters_delta, default_dtype, draft_model_spec,
                             mean_acceptance_length, mtad_spec, spec_counters)
from devtools.console import output_to, tail
from devtools.models import add_model_args, resolve_pair

DEFAULT_LOG = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "demo-vllm.log"

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
         mtad_spec(draft, gamma, width, tau, speculation_policy=policy)),
    ]


def format_prompts(tokenizer, prompts: list[str], tiny: bool) -> list[str]:
    if tiny or not getattr(tokenizer, "chat_template", None):
        return prompts
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                          add_generation_prompt=True) for p in prompts]


def run_method(target, spec, prompts_text, max_tokens, tiny, kv_bytes):
    """Build, warm up and time one method: tok/s with the k-selection, and for the target alone
    and vLLM SD also with vLLM's own sampler (``shipped_tokens_per_s``)."""
    from vllm import SamplingParams

    from vllm_mtad.worker_rpc import use_selection

    llm = build_llm(target, spec, dtype="float32" if tiny else default_dtype(),
                    max_model_len=2048, max_num_seqs=len(prompts_text), block_size=None,
                    kv_cache_bytes=kv_bytes, disable_log_stats=False,
                    # The two samplers' runs repeat the prompts: neither may find them cached.
                    enable_prefix_caching=False)
    params = [SamplingParams(max_tokens=max_tokens, temperature=1.0, top_k=10, top_p=0.9,
                             seed=i, ignore_eos=tiny) for i in range(len(prompts_text))]
    warm = format_prompts(llm.get_tokenizer(), WARM_UP_PROMPTS[:len(prompts_text)], tiny)
    llm.generate(warm, params[:len(warm)], use_tqdm=False)  # untimed
    prompts = format_prompts(llm.get_tokenizer(), prompts_text, tiny)

    def timed(select: bool):
        llm.collective_rpc(use_selection, args=(select,))
        before = spec_counters(llm)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        return outs, tokens, seconds, counters_delta(spec_counters(llm), before)

    outs, tokens, seconds, counters = timed(True)
    shipped = None
    if kind_of(spec) != "mtad":  # MTAD's engine selects with either setting
        _, s_tokens, s_seconds, _ = timed(False)
        shipped = s_tokens / s_seconds
    close(llm)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "shipped_tokens_per_s": shipped,
            "mean_acceptance_length": mean_acceptance_length(counters),
            "sample": outs[0].outputs[0].text}


def kind_of(spec: dict | None) -> str:
    """"target", "sd" or "mtad": which method a speculative_config (None: none) runs."""
    return "target" if spec is None else "mtad" if spec["method"] == "mtad" else "sd"


def sampler_share(rows: dict) -> str | None:
    """One line: MTAD's lead over vLLM SD on equal samplers and as shipped, and the share of
    the latter that the sampler makes. ``rows``: name -> run_method's result."""
    mtad, sd = rows.get("mtad"), rows.get("sd")
    if not (mtad and sd and sd["shipped_tokens_per_s"]):
        return None
    equal = mtad["tokens_per_s"] / sd["tokens_per_s"]
    shipped = mtad["tokens_per_s"] / sd["shipped_tokens_per_s"]
    line = (f"MTAD runs {equal:.2f}x vLLM SD on equal samplers, {shipped:.2f}x vLLM SD with "
            "vLLM's own sampler")
    if shipped > 1 and equal <= 1:
        line += ": all of that lead is the sampler on this machine"
    elif shipped > equal > 1:
        line += (f": the sampler makes {(shipped - equal) / (shipped - 1):.0%} of that "
                 f"{shipped - 1:.2f} lead on this machine, the method the rest")
    return line + "."


def main(argv: list[str] | None = None) -> None:
    # Engines in this process (a quicker start); every engine's top-k/top-p by k-selection.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ["VLLM_MTAD_CPU_TOPK_SELECT"] = "1"
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(parser)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--beam-width", type=int, default=4)
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--log", type=Path, default=DEFAULT_LOG,
                        help="where vLLM's own log goes (default: %(default)s)")
    parser.add_argument("--verbose", action="store_true",
                        help="show vLLM's log on the terminal instead of writing it to --log")
    args = parser.parse_args(argv)

    target, draft, tiny = resolve_pair(args)
    max_tokens = args.max_tokens or (48 if tiny else 96)
    kv_bytes = (256 << 20) if tiny else (2 << 30)
    print(f"target: {target}\ndraft:  {draft}")
    print(f"{len(PROMPTS)} prompts x {max_tokens} tokens, T=1 top-k 10 top-p 0.9, batch "
          f"{len(PROMPTS)}; each method in its own vLLM engine.")
    if tiny:
        print("The tiny models are random: their text is noise, their acceptance figures real.")
    log = None if args.verbose else args.log
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("")
        print(f"vLLM's log: {log} (--verbose shows it here)")
    rows = []
    with output_to(log) as terminal:
        for i, (name, spec) in enumerate(methods(draft, args.gamma, args.beam_width,
                                                 args.threshold), 1):
            print(f"[{i}/3] {name}: build, warm up, generate ...", end=" ", flush=True,
                  file=terminal)
            t0 = time.perf_counter()
            try:
                rows.append((name, run_method(target, spec, PROMPTS, max_tokens, tiny, kv_bytes)
                             | {"kind": kind_of(spec)}))
            except BaseException:
                print("failed", file=terminal)
                if log is not None:
                    print(f"--- the end of {log}:\n{tail(log)}", file=terminal)
                raise
            print(f"done in {time.perf_counter() - t0:.0f} s", file=terminal)

    print("\n| method | output tokens | tok/s, equal samplers | tok/s, vLLM's own sampler "
          "| mean acceptance length |")
    print("|---|---|---|---|---|")
    for name, r in rows:
        mal = f"{r['mean_acceptance_length']:.2f}" if r["mean_acceptance_length"] else "—"
        shipped = (f"{r['shipped_tokens_per_s']:.1f}" if r["shipped_tokens_per_s"]
                   else "(selects either way)")
        print(f"| {name} | {r['tokens']} | {r['tokens_per_s']:.1f} | {shipped} | {mal} |")
    by_kind = {r["kind"]: r for _, r in rows}
    line = sampler_share(by_kind)
    if line:
        print("\n" + line)
    target = by_kind.get("target")
    if target and target["shipped_tokens_per_s"]:
        print(f"The sampler alone: the target alone runs {target['tokens_per_s']:.1f} tok/s with "
              f"the k-selection, {target['shipped_tokens_per_s']:.1f} with vLLM's sort "
              f"({target['tokens_per_s'] / target['shipped_tokens_per_s']:.2f}x).")
    print(f"\nFirst prompt: {PROMPTS[0]!r}")
    for name, r in rows:
        print(f"--- {name}:\n{r['sample'].strip()[:400]}")


if __name__ == "__main__":
    main()
