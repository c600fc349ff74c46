"""Pins of the vLLM internals the glue relies on: a vLLM upgrade that changes one fails here,
naming the internal and the file to re-check, instead of failing in a server.

Each pin is the internal's signature (as vLLM 0.32.0 has it); where the glue copies upstream
code or depends on its exact lines, also a hash of (or lines in) the upstream source.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect

import pytest

pytestmark = pytest.mark.patches

P = "patches/worker/patch_gpu_model_runner.py"
PINS = [
    # (module, qualified name, signature, glue file to re-check, sha256[:16] of the source)
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.__init__",
     "(self, vllm_config: vllm.config.vllm.VllmConfig, device: torch.device)", P, None),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.initialize_kv_cache_tensors",
     "(self, kv_cache_config: vllm.v1.kv_cache_interface.KVCacheConfig, kernel_block_sizes: "
     "list[int], kv_cache_allocation_context: contextlib.AbstractContextManager | None = None)"
     " -> dict[str, torch.Tensor]", P, None),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._input_fits_in_drafter",
     "(self, common_attn_metadata: vllm.v1.attention.backend.CommonAttentionMetadata | None) "
     "-> bool", P, "24d6a45dca3c60dc"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._prepare_inputs",
     "(self, scheduler_output: 'SchedulerOutput', num_scheduled_tokens: numpy.ndarray) -> "
     "tuple[torch.Tensor, vllm.v1.spec_decode.metadata.SpecDecodeMetadata | None, int]", P,
     None),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._sample",
     "(self, logits: torch.Tensor | None, spec_decode_metadata: "
     "vllm.v1.spec_decode.metadata.SpecDecodeMetadata | None) -> vllm.v1.outputs.SamplerOutput",
     "patches/worker/patch_phase_timers.py", None),
    ("vllm.v1.worker.gpu_model_runner", "allocate_kv_cache",
     "(kv_cache_config: vllm.v1.kv_cache_interface.KVCacheConfig, device: torch.device, "
     "layout: vllm.v1.kv_cache_layout.KVCacheLayout, kernel_block_sizes: list[int] | None = "
     "None) -> dict[str, torch.Tensor]", "vllm_mtad/draft_scratch.py", None),
    ("vllm.v1.kv_cache_interface", "create_kv_cache_views",
     "(raw: 'torch.Tensor', spec: 'KVCacheSpec', num_blocks: 'int', layout: 'KVCacheLayout', "
     "kv_cache_tensor: 'KVCacheTensor', kernel_block_size: 'int | None' = None) -> "
     "'list[torch.Tensor]'", "vllm_mtad/draft_scratch.py", None),
    ("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer.set_inputs_first_pass",
     "(self, target_token_ids: torch.Tensor, next_token_ids: torch.Tensor, target_positions: "
     "torch.Tensor, target_hidden_states: torch.Tensor, token_indices_to_sample: torch.Tensor "
     "| None, cad: vllm.v1.attention.backend.CommonAttentionMetadata, num_rejected_tokens_gpu: "
     "torch.Tensor | None) -> tuple[int, torch.Tensor, "
     "vllm.v1.attention.backend.CommonAttentionMetadata]", "vllm_mtad/proposer.py", None),
    ("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer._sample_draft_tokens",
     "(self, hidden_states: torch.Tensor, sampling_metadata: "
     "vllm.v1.sample.metadata.SamplingMetadata) -> tuple[torch.Tensor, torch.Tensor | None]",
     "vllm_mtad/proposer.py", None),
    ("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer.initialize_attn_backend",
     "(self, kv_cache_config: vllm.v1.kv_cache_interface.KVCacheConfig, kernel_block_sizes: "
     "list[int] | None = None) -> None", "vllm_mtad/proposer.py", None),
    ("vllm.v1.spec_decode.draft_model", "DraftModelProposer.__init__",
     "(self, vllm_config: vllm.config.vllm.VllmConfig, device: torch.device, runner=None)",
     "vllm_mtad/proposer.py", None),
    ("vllm.v1.worker.utils", "AttentionGroup.create_metadata_builders",
     "(self, vllm_config, device, kernel_block_size: int | None = None, "
     "num_metadata_builders: int = 1)", "vllm_mtad/proposer.py", None),
    ("vllm.v1.worker.utils", "AttentionGroup.build_metadata_for_drafting",
     "(self, common_attn_metadata: vllm.v1.attention.backend.CommonAttentionMetadata, "
     "draft_index: int) -> Any", "vllm_mtad/proposer.py", None),
    # vllm_mtad/sampler.py's forward re-implements this one with the acceptance swapped.
    ("vllm.v1.sample.rejection_sampler", "RejectionSampler.forward",
     "(self, metadata: 'SpecDecodeMetadata', draft_probs: 'torch.Tensor | None', logits: "
     "'torch.Tensor', sampling_metadata: 'SamplingMetadata') -> 'SamplerOutput'",
     "vllm_mtad/sampler.py", "c82e51bdd5a8dc3c"),
    ("vllm.engine.arg_utils", "EngineArgs.create_speculative_config",
     "(self, target_model_config: vllm.config.model.ModelConfig, target_parallel_config: "
     "vllm.config.parallel.ParallelConfig) -> vllm.config.speculative.SpeculativeConfig | None",
     "patches/engine/patch_arg_utils.py", None),
    ("vllm.engine.arg_utils", "EngineArgs.add_cli_args",
     "(parser: vllm.utils.argparse_utils.FlexibleArgumentParser) -> "
     "vllm.utils.argparse_utils.FlexibleArgumentParser", "patches/engine/patch_arg_utils.py",
     None),
    ("vllm.config", "VllmConfig._get_v2_model_runner_unsupported_features",
     "(self) -> list[str]", "patches/engine/patch_config_vllm.py", None),
    ("vllm.v1.worker.cpu_worker", "CPUWorker.determine_available_memory", "(self) -> int",
     "patches/worker/patch_cpu_worker.py", None),
    ("vllm.v1.worker.gpu_worker", "Worker.determine_available_memory", "(self) -> int",
     "patches/worker/patch_gpu_worker.py", None),
    ('vllm.utils.cpu_triton_utils', '_expand_kernel_impl',
     '(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None)',
     'patches/platform/patch_cpu_triton_utils.py', None),
    ('vllm.v1.engine.input_processor', 'InputProcessor._validate_params',
     "(self, params: vllm.sampling_params.SamplingParams | "
     "vllm.pooling_params.PoolingParams, supported_tasks: tuple[typing.Literal['generate', "
     "'transcription', 'realtime', 'embed', 'classify', 'token_embed', 'token_classify', "
     "'plugin', 'embed&token_classify', 'render'], ...]) -> bool | None",
     'patches/engine/patch_input_processor.py', None),
    ('vllm.config', 'VllmConfig.__post_init__',
     '(self)',
     'patches/engine/patch_config_vllm.py', None),
    ('vllm.v1.worker.gpu_model_runner', 'GPUModelRunner.execute_model',
     "(self, scheduler_output: 'SchedulerOutput', intermediate_tensors: "
     "vllm.sequence.IntermediateTensors | None = None) -> vllm.v1.outputs.ModelRunnerOutput "
     "| vllm.v1.outputs.AsyncModelRunnerOutput | vllm.sequence.IntermediateTensors | None",
     'patches/worker/patch_phase_timers.py', None),
    ('vllm.v1.worker.gpu_model_runner', 'GPUModelRunner.sample_tokens',
     "(self, grammar_output: 'GrammarOutput | None') -> vllm.v1.outputs.ModelRunnerOutput | "
     "vllm.v1.outputs.AsyncModelRunnerOutput | vllm.sequence.IntermediateTensors",
     'patches/worker/patch_phase_timers.py', None),
    ('vllm.v1.worker.gpu_model_runner', 'GPUModelRunner.propose_draft_token_ids',
     "(self, scheduler_output: 'SchedulerOutput', sampled_token_ids: torch.Tensor | "
     "list[list[int]], sampling_metadata: vllm.v1.sample.metadata.SamplingMetadata, "
     "hidden_states: torch.Tensor, sample_hidden_states: torch.Tensor, aux_hidden_states: "
     "list[torch.Tensor] | None, spec_decode_metadata: "
     "vllm.v1.spec_decode.metadata.SpecDecodeMetadata | None, common_attn_metadata: "
     "vllm.v1.attention.backend.CommonAttentionMetadata, slot_mappings: dict[str, "
     "torch.Tensor] | list[dict[str, torch.Tensor]] | None) -> list[list[int]] | torch.Tensor",
     'patches/worker/patch_phase_timers.py', None),
    ('vllm.v1.worker.gpu_model_runner', 'GPUModelRunner._bookkeeping_sync',
     "(self, scheduler_output: 'SchedulerOutput', sampler_output: "
     "vllm.v1.outputs.SamplerOutput, logits: torch.Tensor | None, hidden_states: "
     "torch.Tensor, num_scheduled_tokens: int) -> tuple[dict[str, int], torch.Tensor | None, "
     "vllm.v1.outputs.LogprobsLists | None, list[list[int]], dict[str, "
     "vllm.v1.outputs.LogprobsTensors | None], list[str], dict[str, int], list[int]]",
     'patches/worker/patch_gpu_model_runner.py', None),
    ('vllm.v1.spec_decode.llm_base_proposer', 'SpecDecodeBaseProposer.take_last_draft_probs',
     '(self) -> torch.Tensor | None',
     'vllm_mtad/proposer.py', None),
    ('vllm.v1.spec_decode.draft_model', 'DraftModelProposer.propose',
     '(self, num_speculative_tokens, target_token_ids: torch.Tensor, target_positions: '
     'torch.Tensor, target_hidden_states: torch.Tensor, next_token_ids: torch.Tensor, '
     'token_indices_to_sample: torch.Tensor | None, common_attn_metadata: '
     'vllm.v1.attention.backend.CommonAttentionMetadata, sampling_metadata: '
     'vllm.v1.sample.metadata.SamplingMetadata, mm_embed_inputs: tuple[list[torch.Tensor], '
     'torch.Tensor] | None = None, num_rejected_tokens_gpu: torch.Tensor | None = None, '
     'slot_mappings: dict[str, torch.Tensor] | list[dict[str, torch.Tensor]] | None = None) '
     '-> torch.Tensor',
     'vllm_mtad/proposer.py', None),
    ('vllm.v1.sample.sampler', 'Sampler.forward',
     "(self, logits: torch.Tensor, sampling_metadata: "
     "vllm.v1.sample.metadata.SamplingMetadata, predict_bonus_token: bool = False, "
     "logprobs_mode_override: Optional[Literal['raw_logits', 'raw_logprobs', "
     "'processed_logits', 'processed_logprobs']] = None) -> vllm.v1.outputs.SamplerOutput",
     'vllm_mtad/sampler.py', None),
    ('vllm.v1.sample.rejection_sampler', 'RejectionSampler.__init__',
     "(self, sampler: 'Sampler', spec_config: 'SpeculativeConfig | None' = None, device: "
     "'torch.device | None' = None)",
     'vllm_mtad/sampler.py', None),
    ('vllm.v1.sample.rejection_sampler', 'RejectionSampler.apply_logits_processors',
     "(self, logits: 'torch.Tensor', sampling_metadata: 'SamplingMetadata', metadata: "
     "'SpecDecodeMetadata') -> 'torch.Tensor'",
     'vllm_mtad/sampler.py', None),
    ('vllm.v1.sample.rejection_sampler', 'RejectionSampler._get_logprobs_tensors',
     "(self, max_num_logprobs: 'int', metadata: 'SpecDecodeMetadata', logits: "
     "'torch.Tensor', target_logits: 'torch.Tensor', bonus_logits: 'torch.Tensor', "
     "sampled_token_ids: 'torch.Tensor') -> 'LogprobsTensors'",
     'vllm_mtad/sampler.py', None),
    # The draft_probs channel: rows of the scheduled requests, None when one missed a round
    # (the sampler's DraftStore covers that case).
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._get_spec_decode_draft_probs",
     "(self, spec_decode_metadata: vllm.v1.spec_decode.metadata.SpecDecodeMetadata) -> "
     "torch.Tensor | None", "vllm_mtad/sampler.py", "944db527e0dd2e82"),
    ('vllm.v1.sample.rejection_sampler', 'apply_sampling_constraints',
     "(logits: 'torch.Tensor', cu_num_draft_tokens: 'torch.Tensor', sampling_metadata: "
     "'SamplingMetadata') -> 'torch.Tensor'",
     'vllm_mtad/sampler.py', None),
]


def _resolve(module: str, qualname: str):
    """The upstream object, also when one of our patches has replaced or wrapped it."""
    from vllm_mtad import patching

    obj = owner = importlib.import_module(module)
    for part in qualname.split("."):
        owner, obj = obj, getattr(obj, part)
    if patching.is_patched(owner, part):
        obj = patching.original(owner, part)
    return inspect.unwrap(obj)


@pytest.mark.parametrize("module,qualname,signature,glue,source_hash", PINS,
                         ids=[p[1] for p in PINS])
def test_vllm_internal_is_as_the_glue_expects(module, qualname, signature, glue, source_hash):
    func = _resolve(module, qualname)
    got = str(inspect.signature(func))
    assert got == signature, (f"vLLM internal {module}.{qualname} changed its signature to "
                              f"{got}; re-check {glue} for this vLLM version")
    if source_hash is not None:
        digest = hashlib.sha256(inspect.getsource(func).encode()).hexdigest()[:16]
        assert digest == source_hash, (f"vLLM internal {module}.{qualname} changed its code "
                                       f"(sha256 {digest}); re-check {glue}, which copies or "
                                       "overrides it, against the new source")


def test_the_generator_rewind_the_cpu_patch_replaces_is_still_there():
    """patch_gpu_model_runner restores discarded rows' generators and hides them from this
    loop; if vLLM changes the loop (or stops rewinding on CPU), the patch must be re-checked."""
    src = inspect.getsource(_resolve("vllm.v1.worker.gpu_model_runner",
                                     "GPUModelRunner._bookkeeping_sync"))
    for line in ("self.discard_request_mask.np[:num_reqs]",
                 "gen = self.input_batch.generators.get(int(i))",
                 "gen.set_offset(gen.get_offset() - 4)"):
        assert line in src, (f"vLLM's _bookkeeping_sync no longer has {line!r}; re-check {P}")
    prepare = inspect.getsource(_resolve("vllm.v1.worker.gpu_model_runner",
                                         "GPUModelRunner._prepare_inputs"))
    assert "self.discard_request_mask.np[:num_reqs] = (" in prepare, (
        f"vLLM's _prepare_inputs no longer sets the discard mask; re-check {P}")


def test_the_runner_still_takes_the_drafters_probabilities():
    src = inspect.getsource(_resolve("vllm.v1.worker.gpu_model_runner",
                                     "GPUModelRunner.propose_draft_token_ids"))
    assert "self.drafter.take_last_draft_probs()" in src, (
        "vLLM's propose_draft_token_ids no longer calls drafter.take_last_draft_probs(); "
        "re-check vllm_mtad/proposer.py and vllm_mtad/sampler.py (MTAD's log q reach the "
        "sampler through that channel)")


def test_the_spec_flags_are_folded_where_the_arg_utils_patch_expects():
    """patch_arg_utils folds --spec-method/--spec-model/--spec-tokens into the dict before the
    MTAD translation, with vLLM's rule, because vLLM folds them inside create_speculative_config
    (after the translation must have run); and it adds "mtad" to --spec-method's choices in
    add_cli_args, which the serve parser reaches after loading the plugins."""
    A = "patches/engine/patch_arg_utils.py"
    src = inspect.getsource(_resolve("vllm.engine.arg_utils",
                                     "EngineArgs.create_speculative_config"))
    for line in ('("--spec-method", "method", self.spec_method)',
                 '("--spec-model", "model", self.spec_model)',
                 '("--spec-tokens", "num_speculative_tokens", self.spec_tokens)',
                 "are mutually exclusive"):
        assert line in src, (f"vLLM's create_speculative_config no longer has {line!r}; "
                             f"re-check {A} and vllm_mtad/config.py (SPEC_FLAGS)")
    serve = inspect.getsource(_resolve("vllm.engine.arg_utils", "AsyncEngineArgs.add_cli_args"))
    where = [serve.find(step) for step in ("load_general_plugins()",
                                           "EngineArgs.add_cli_args(parser)")]
    assert -1 not in where and where == sorted(where), (
        f"vLLM's AsyncEngineArgs.add_cli_args no longer loads the plugins before building the "
        f"engine flags; re-check {A} (--spec-method mtad)")


def test_worker_start_order_the_patch_groups_rely_on():
    """In a worker process vLLM loads plugins (register(): platform and engine patches, the
    worker hook), then registers its CPU kernel overrides (which bind the expand-kernel stand-in
    patch_cpu_triton_utils replaced), then builds the worker (the hook applies the worker
    patches before the model runner exists). A reordering breaks one of those."""
    src = inspect.getsource(_resolve("vllm.v1.worker.worker_base",
                                     "WorkerWrapperBase.init_worker"))
    steps = ("load_general_plugins()", "current_platform.register_triton_kernel_overrides()",
             "self.worker = worker_class(**kwargs)")
    where = [src.find(step) for step in steps]
    assert -1 not in where and where == sorted(where), (
        f"vLLM's WorkerWrapperBase.init_worker no longer runs {steps} in this order (found at "
        f"{where}); re-check patches/__init__.py, patches/platform/patch_worker_base.py and "
        "patches/platform/patch_cpu_triton_utils.py")
    from vllm.v1.worker.cpu_worker import CPUWorker
    from vllm.v1.worker.gpu_worker import Worker
    from vllm.v1.worker.worker_base import WorkerBase

    for cls in (CPUWorker, Worker):
        assert issubclass(cls, WorkerBase) and "super().__init__(" in inspect.getsource(
            cls.__init__), f"{cls} no longer builds through WorkerBase.__init__"
    assert "__init__" in WorkerBase.__dict__


def test_a_changed_internal_fails_with_the_file_to_recheck():
    """The pin can fail: a signature that differs is reported with the glue file."""
    with pytest.raises(AssertionError, match="re-check vllm_mtad/proposer.py"):
        test_vllm_internal_is_as_the_glue_expects(
            "vllm.v1.spec_decode.draft_model", "DraftModelProposer.__init__",
            "(self, vllm_config, device)", "vllm_mtad/proposer.py", None)
