"""Set MTAD's draft-only beam blocks aside before the CPU worker's KV cache is sized.

Target: vllm.v1.worker.cpu_worker.CPUWorker.determine_available_memory
Why: the engine sizes the shared KV pool from the bytes each worker reports; MTAD's draft
    layers also hold S = max_num_seqs·(W−1)·tail_blocks draft-only blocks for the beams'
    private tails (vllm_mtad.draft_scratch), allocated with the pool. Without this the pool
    plus the scratch would exceed ``kv_cache_memory_bytes`` / ``VLLM_CPU_KVCACHE_SPACE``.
How: wraps the method (vllm_mtad.draft_scratch.wrap_available_memory, handed the drafter's
    layers by vllm_mtad.proposer.available_memory_less_scratch); for MTAD runners
    with W > 1 it returns the original figure minus the scratch bytes, and fails at startup,
    naming beam_width, max_num_seqs and max_model_len, when what is left cannot hold one
    max_model_len request, or when the resolved KV layout is not layer-outermost. Other
    engines: unchanged.
Upstream: none: vLLM has no notion of draft-only KV blocks.
Checked: vLLM 0.32.0 (vllm-cpu: run on CPU); 0.33.0 (sources compared only: same signature, a new
    error for an over-full reservation; not a 0.33 target, since vllm-cpu stops at 0.32.0).
Removal: when vLLM can size per-group KV pools (draft layers with their own block count).
"""

from __future__ import annotations

from vllm_mtad.patching import is_patched, patch


def apply() -> None:
    from vllm.v1.worker.cpu_worker import CPUWorker

    from vllm_mtad.proposer import available_memory_less_scratch

    if is_patched(CPUWorker, "determine_available_memory"):
        return
    patch(CPUWorker, "determine_available_memory", available_memory_less_scratch, __name__)
