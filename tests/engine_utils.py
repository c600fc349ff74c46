"""The tests' preset for the real vLLM engine on the tiny pair (devtools.engine builds it)."""

from __future__ import annotations

from devtools.engine import build_llm, close, mtad_spec, spec_counters  # noqa: F401  (re-exported)

# Per-token KV bytes of the tiny pair: (4 target + 3 draft layers) x (K, V) x 2 KV heads x 32
# head dims x 4 bytes.
TINY_KV_BYTES_PER_TOKEN = 7 * 2 * 2 * 32 * 4


def make_llm(target_dir, speculative_config=None, kv_tokens=16384, **kwargs):
    """An engine on the tiny pair with room for ``kv_tokens`` tokens of KV."""
    return build_llm(target_dir, speculative_config,
                     kv_cache_bytes=kv_tokens * TINY_KV_BYTES_PER_TOKEN, **kwargs)


def token_prompts(prompts):
    from vllm.inputs import TokensPrompt

    return [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]


def generate_ids(llm, prompts, params):
    outs = llm.generate(token_prompts(prompts), params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]
