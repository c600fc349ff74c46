"""The opt-in CPU top-k/top-p by k-selection (patches/worker/patch_topk_topp_sampler.py) that
the benchmarks give every engine: the target alone and vLLM's own speculative decoding draw the
same seeded tokens with it as with vLLM's sort, and it is the selection that drew them."""

from __future__ import annotations

import pytest
import torch

from devtools.engine import draft_model_spec
from tests.engine_utils import close, generate_ids, make_llm
from tests.test_adaptive_engine import params
from tests.test_e2e_engine import PROMPTS

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("method", ["target alone", "vLLM SD"])
def test_selection_draws_the_tokens_vllms_sort_draws(tiny_pair_dirs, method, monkeypatch):
    from vllm.platforms import current_platform

    from vllm_mtad.worker_rpc import use_selection

    if not current_platform.is_cpu():
        pytest.skip("the switch exists on CPU only (vLLM sorts nowhere else)")
    # The switch lives in this process's environment (the engine runs here): whatever happens,
    # the test leaves it as it found it, so no later test's "vLLM's own sampler" selects.
    monkeypatch.setenv("VLLM_MTAD_CPU_TOPK_SELECT", "0")
    target_dir, draft_dir = tiny_pair_dirs
    spec = None if method == "target alone" else draft_model_spec(draft_dir, gamma=4)
    sampling = [params(24, 1.0, seed=31 + i, top_k=10, top_p=0.9) for i in range(4)]
    llm = make_llm(target_dir, spec, enforce_eager=True)

    def generate(sampling):
        # vLLM SD draws its probabilistic draft tokens from torch's global generator, not
        # the request's seed (two runs of the same seeded requests differ otherwise): the
        # engine runs in this process (tests/conftest.py), so seed that generator too.
        torch.manual_seed(0)
        return generate_ids(llm, PROMPTS[:4], sampling)

    try:
        use_selection_on = lambda on: llm.collective_rpc(use_selection, args=(on,))[0]  # noqa: E731
        before = use_selection_on(False)
        shipped = generate(sampling)
        assert use_selection_on(True) == before  # vLLM's sort drew those: nothing selected
        selected = generate(sampling)
        after = use_selection_on(False)
        other = generate([params(24, 1.0, seed=70 + i, top_k=10, top_p=0.9) for i in range(4)])
    finally:
        close(llm)
    assert other != shipped  # the tokens are seeded draws: the comparison can fail
    assert selected == shipped
    # Every sampling call took the selection: at least one per output token of a step
    # (the target alone: one call a step; vLLM SD: its verification and its bonus token).
    assert after["selected"] - before["selected"] >= 24
    assert after["fallbacks"] == before["fallbacks"]
