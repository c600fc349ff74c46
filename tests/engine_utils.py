"""Helpers for tests that run the real vLLM engine on the tiny pair."""

from __future__ import annotations

import gc

# Per-token KV bytes of the tiny pair: (4 target + 3 draft layers) x (K, V) x 2 KV heads x 32
# head dims x 4 bytes.
TINY_KV_BYTES_PER_TOKEN = 7 * 2 * 2 * 32 * 4


def mtad_spec(draft_dir, gamma=4, width=4, tau=0.5, greedy_acceptance="joint", **extra):
    return {"method": "mtad", "model": str(draft_dir), "num_speculative_tokens": gamma,
            "beam_width": width, "acceptance_threshold": tau,
            "greedy_acceptance": greedy_acceptance, **extra}


def make_llm(target_dir, speculative_config=None, kv_tokens=16384, **kwargs):
    from vllm import LLM

    defaults = dict(dtype="float32", max_model_len=1024, max_num_seqs=8, enforce_eager=True,
                    block_size=32, seed=0)
    defaults.update(kwargs)
    return LLM(model=str(target_dir), speculative_config=speculative_config,
               kv_cache_memory_bytes=kv_tokens * TINY_KV_BYTES_PER_TOKEN, **defaults)


def close(llm) -> None:
    del llm
    gc.collect()


def spec_metrics(llm) -> dict:
    """vLLM's own spec-decode counters from LLM.get_metrics() (needs disable_log_stats=False)."""
    out = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode"):
            key = metric.name.removeprefix("vllm:spec_decode_")
            out[key] = getattr(metric, "values", None) or metric.value
    return out


def token_prompts(prompts):
    from vllm.inputs import TokensPrompt

    return [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]


def generate_ids(llm, prompts, params):
    outs = llm.generate(token_prompts(prompts), params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]
