"""Per-phase timers (vllm_mtad.timing, patches/worker/patch_phase_timers.py): exclusive
accounting, inert unless VLLM_MTAD_PHASE_TIMERS=1, and sane figures from real engines."""

from __future__ import annotations

import time

import pytest

from vllm_mtad.timing import PHASES, TIMERS, PhaseTimers
from vllm_mtad.worker_rpc import phase_times, reset_phase_times


@pytest.fixture
def timers_env(monkeypatch):
    """Set or unset VLLM_MTAD_PHASE_TIMERS for one test; the timer patches are undone after."""
    from vllm_mtad.patches.worker import patch_phase_timers

    def set_env(on: bool):
        if on:
            monkeypatch.setenv("VLLM_MTAD_PHASE_TIMERS", "1")
        else:
            monkeypatch.delenv("VLLM_MTAD_PHASE_TIMERS", raising=False)
        TIMERS._enabled = None  # re-read the environment
        TIMERS.reset()

    patch_phase_timers.remove()
    yield set_env
    patch_phase_timers.remove()
    monkeypatch.delenv("VLLM_MTAD_PHASE_TIMERS", raising=False)
    TIMERS._enabled = None
    TIMERS.reset()


@pytest.mark.unit
def test_nested_phases_are_exclusive():
    timers = PhaseTimers(enabled=True)
    timers._now()  # the first call imports torch (to find out whether to synchronise CUDA)
    t0 = time.perf_counter()
    with timers.phase("step"):
        time.sleep(0.05)
        with timers.phase("draft_other"):
            time.sleep(0.03)
            with timers.phase("draft_forward"):
                time.sleep(0.06)
            time.sleep(0.03)
        timers.push("sampler")
        time.sleep(0.04)
        timers.pop()
    wall = time.perf_counter() - t0
    s = timers.snapshot()["seconds"]
    assert s["draft_forward"] == pytest.approx(0.06, abs=0.03)
    assert s["draft_other"] == pytest.approx(0.06, abs=0.03)
    assert s["sampler"] == pytest.approx(0.04, abs=0.03)
    assert s["step"] == pytest.approx(0.05, abs=0.03)
    assert sum(s.values()) == pytest.approx(wall, rel=0.02)
    assert timers.snapshot()["calls"]["step"] == 1
    timers.reset()
    assert sum(timers.snapshot()["seconds"].values()) == 0


@pytest.mark.unit
def test_spans_are_inclusive_beside_the_phases():
    """A span counts its whole block, phases inside it included, and leaves the phases'
    exclusive accounting as it is; disabled, it counts nothing."""
    timers = PhaseTimers(enabled=True)
    timers._now()
    with timers.phase("draft_other"):
        with timers.span("beam_steps"):
            time.sleep(0.03)
            with timers.phase("draft_forward"):
                time.sleep(0.04)
    snap = timers.snapshot()
    # 30 ms: as above, what a sleep may overshoot on a busy machine
    assert snap["spans"]["beam_steps"] == pytest.approx(0.07, abs=0.03)
    assert snap["spans"]["first_pass"] == 0
    assert snap["seconds"]["draft_forward"] == pytest.approx(0.04, abs=0.03)
    assert snap["seconds"]["draft_other"] == pytest.approx(0.03, abs=0.03)
    timers.reset()
    assert timers.snapshot()["spans"]["beam_steps"] == 0
    off = PhaseTimers(enabled=False)
    with off.span("beam_steps"):
        time.sleep(0.01)
    assert off.snapshot()["spans"]["beam_steps"] == 0


@pytest.mark.unit
def test_disabled_timers_record_nothing():
    timers = PhaseTimers(enabled=False)
    with timers.phase("step"):
        time.sleep(0.01)
    timers.pop()  # unmatched pop: ignored
    assert sum(timers.snapshot()["seconds"].values()) == 0


@pytest.mark.unit
def test_apply_patches_nothing_unless_enabled(timers_env):
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_mtad.patches.worker import patch_phase_timers
    from vllm_mtad.patching import is_patched

    methods = ("execute_model", "sample_tokens", "propose_draft_token_ids", "_sample")
    timers_env(False)
    patch_phase_timers.apply()
    assert not any(is_patched(GPUModelRunner, m) for m in methods)
    assert not is_patched(SpecDecodeBaseProposer, "_sample_draft_tokens")

    timers_env(True)
    original = GPUModelRunner.__dict__["_sample"]
    patch_phase_timers.apply()
    patch_phase_timers.apply()  # idempotent
    assert all(is_patched(GPUModelRunner, m) for m in methods)
    assert is_patched(SpecDecodeBaseProposer, "_sample_draft_tokens")
    # The CPU runner inherits every timed method (so patching GPUModelRunner times it too).
    assert not any(m in CPUModelRunner.__dict__ for m in methods)
    patch_phase_timers.remove()
    assert GPUModelRunner.__dict__["_sample"] is original


@pytest.mark.unit
def test_model_hooks_attach_once_and_shared_modules_count_once(timers_env):
    import torch

    from vllm_mtad.patches.worker.patch_phase_timers import attach_model_hooks, hook_handles

    timers_env(True)

    class Model(torch.nn.Module):
        def __init__(self, logits_processor):
            super().__init__()
            self.layer = torch.nn.Linear(4, 4)
            self.logits_processor = logits_processor

        def forward(self, x):
            time.sleep(0.02)
            return self.layer(x)

    class Runner:
        pass

    shared = torch.nn.Identity()
    runner = Runner()
    runner.model = Model(shared)
    runner.drafter = Runner()
    runner.drafter.model = Model(shared)
    attach_model_hooks(runner)
    attach_model_hooks(runner)  # no second set of hooks
    assert len(hook_handles(runner)) == 6  # target, draft, and the shared processor once
    runner.model(torch.zeros(1, 4))
    runner.drafter.model(torch.zeros(1, 4))
    runner.drafter.model.logits_processor(torch.zeros(1, 4))
    snap = TIMERS.snapshot()
    assert snap["calls"]["target_forward"] == 2 and snap["calls"]["draft_forward"] == 1
    assert snap["seconds"]["draft_forward"] >= 0.02
    assert not TIMERS._stack


def _hooks_attached(worker) -> bool:
    from vllm_mtad.patches.worker.patch_phase_timers import hook_handles

    return hook_handles(worker.model_runner) is not None


def _generate(llm, n_prompts=4, tokens=24):
    from vllm import SamplingParams

    from tests.engine_utils import token_prompts

    prompts = [[5 + i, 6, 7, 8, 9 + i] for i in range(n_prompts)]
    params = SamplingParams(max_tokens=tokens, temperature=1.0, top_k=10, top_p=0.9, seed=0,
                            ignore_eos=True)
    t0 = time.perf_counter()
    llm.generate(token_prompts(prompts), params, use_tqdm=False)
    return time.perf_counter() - t0


@pytest.mark.engine
def test_engine_without_the_variable_is_untouched(tiny_pair_dirs, timers_env):
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from tests.engine_utils import close, make_llm, mtad_spec
    from vllm_mtad.patching import is_patched

    timers_env(False)
    target_dir, draft_dir = tiny_pair_dirs
    llm = make_llm(target_dir, mtad_spec(draft_dir))
    _generate(llm, tokens=8)
    snap = llm.collective_rpc(phase_times)[0]
    hooked = llm.collective_rpc(_hooks_attached)[0]
    close(llm)
    assert not snap["enabled"] and not hooked
    assert not is_patched(GPUModelRunner, "execute_model")
    assert all(v == 0 for v in snap["seconds"].values())


@pytest.mark.engine
@pytest.mark.parametrize("method", ["draft_model", "mtad"])
def test_engine_phase_figures(tiny_pair_dirs, timers_env, method):
    from tests.engine_utils import close, make_llm, mtad_spec

    timers_env(True)
    target_dir, draft_dir = tiny_pair_dirs
    spec = mtad_spec(draft_dir) if method == "mtad" else {
        "method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": 4,
        "draft_sample_method": "probabilistic"}
    llm = make_llm(target_dir, spec)
    _generate(llm, tokens=8)  # warm-up
    llm.collective_rpc(reset_phase_times)
    wall = _generate(llm)
    snap = llm.collective_rpc(phase_times)[0]
    close(llm)
    s, calls = snap["seconds"], snap["calls"]
    assert snap["enabled"] and set(s) == set(PHASES)
    for name in ("target_forward", "draft_forward", "sampler", "step"):
        assert s[name] > 0 and calls[name] > 0, (name, snap)
    if method == "draft_model":  # vLLM's draft sampling (MTAD charges its own, in its code)
        assert s["draft_vocab"] > 0 and s["draft_other"] > 0
    else:
        assert calls["draft_forward"] > calls["target_forward"]  # beam steps
    assert all(v <= wall for v in s.values()), (wall, s)
    assert sum(s.values()) <= wall * 1.05, (wall, s)
    # The step's own (exclusive) time is glue; most of the time is in the named phases.
    assert sum(s.values()) >= 0.5 * wall, (wall, s)
