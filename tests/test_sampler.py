"""The rejection sampler's processing against vLLM's own: the target's top-k/top-p by
k-selection, the bonus token's sampler."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_draft_processing_equals_vllm_apply_sampling_constraints(seed):
    """The draft side's processed distribution (vllm_mtad.core.processing) is the one vLLM's
    rejection sampler gives the target (rejection_sampler.apply_sampling_constraints): same
    logits and parameters, same log-probabilities and the same tokens removed, for sampled rows
    with temperature, top-k and top-p. (Greedy rows compare unprocessed distributions by
    design; vLLM applies no min-p there and MTAD refuses min-p requests.) The metadata is a
    stand-in with the four fields the function reads."""
    from types import SimpleNamespace

    from vllm.platforms import current_platform
    from vllm.v1.sample.rejection_sampler import apply_sampling_constraints

    from vllm_mtad.core.processing import processed_logprobs

    if current_platform.is_cpu():  # what an engine start does on CPU (plugin patch first)
        from vllm_mtad.patches.platform import patch_cpu_triton_utils

        patch_cpu_triton_utils.apply()
        current_platform.register_triton_kernel_overrides()

    gen = torch.Generator().manual_seed(seed)
    N, V = 24, 300
    logits = torch.randn(N, V, generator=gen) * 3
    temperature = torch.rand(N, generator=gen) * 1.5 + 0.2
    top_k = torch.tensor([[V, 1, 5, 40, V - 1, V][i % 6] for i in range(N)])  # V: off (vLLM)
    top_p = torch.tensor([[1.0, 0.9, 0.5, 0.05][i % 4] for i in range(N)])
    meta = SimpleNamespace(temperature=temperature, all_greedy=False, all_random=True,
                           top_k=top_k, top_p=top_p)
    theirs = apply_sampling_constraints(logits.clone(), torch.arange(1, N + 1), meta)
    theirs = torch.log_softmax(theirs.float(), dim=-1)
    ours = processed_logprobs(logits.clone(), temperature, top_k, top_p)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    finite = ~torch.isinf(ours)
    assert torch.allclose(ours[finite], theirs[finite], atol=1e-5)
    assert (torch.isinf(ours).sum(dim=1) > 0).sum() >= N // 2  # the constraints did cut


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_the_bonus_samplers_selection_draws_what_vllms_sort_draws(mode):
    """The bonus token's top-k/top-p by k-selection (sampler.SelectingTopKTopP) against vLLM's
    own TopKTopPSampler on the same temperature-scaled logits and the same per-row generators:
    the same tokens, row for row, and the same processed log-probabilities; greedy rows (whose
    draw vLLM discards) keep their logits; a row without top-k, or ties at a k-th value past
    the candidates, take vLLM's own call. Real-size vocabulary (the real pair's)."""
    from types import SimpleNamespace

    import numpy as np
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    from vllm_mtad.config import MTADConfig
    from vllm_mtad.request_state import MTADRequestState
    from vllm_mtad.sampler import SelectingTopKTopP, bonus_sampler

    R, V = 12, 151936
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(R, V, generator=gen) * 4
    temperature = np.array([0.0 if i % 5 == 4 else 0.6 + 0.1 * i for i in range(R)])
    top_k = np.array([[10, 1, 40, 10, 20, 5][i % 6] for i in range(R)])
    top_p = np.array([[0.9, 1.0, 0.5, 0.95][i % 4] for i in range(R)])
    batch = SimpleNamespace(req_ids=[f"r{i}" for i in range(R)], temperature_cpu=temperature,
                            top_k_cpu=top_k, top_p_cpu=top_p)
    state = MTADRequestState(MTADConfig(4, 4), input_batch=batch)
    scaled = logits / torch.from_numpy(np.where(temperature > 0, temperature, 1.0)
                                       ).float()[:, None]
    k, p = torch.from_numpy(top_k), torch.from_numpy(top_p).float()

    def draw(sampler):
        gens = {i: torch.Generator().manual_seed(100 + i) for i in range(R)}
        return sampler(scaled.clone(), gens, k, p)

    vllm_sampler = TopKTopPSampler(logprobs_mode=mode)
    ours = SelectingTopKTopP(TopKTopPSampler(logprobs_mode=mode), state)
    theirs_tok, theirs_lp = draw(vllm_sampler)
    ours_tok, ours_lp = draw(ours)
    assert ours.selected == 1 and ours.fallbacks == 0
    sampled = torch.from_numpy(temperature > 0)
    assert torch.equal(ours_tok[sampled], theirs_tok[sampled])
    if mode == "processed_logprobs":
        assert torch.equal(torch.isinf(ours_lp[sampled]), torch.isinf(theirs_lp[sampled]))
        finite = ~torch.isinf(theirs_lp) & sampled[:, None]
        assert torch.allclose(ours_lp[finite], theirs_lp[finite], atol=1e-5)
        assert (~torch.isinf(ours_lp[~sampled])).all()  # greedy rows: not masked
    # The draws are draws: different generators give other tokens somewhere.
    assert len(set(ours_tok[sampled].tolist())) > 1

    # A sampled row without top-k (vLLM's V): vLLM's own call.
    batch.top_k_cpu = np.where(np.arange(R) == 0, V, top_k)
    draw(ours)
    assert ours.selected == 1 and ours.fallbacks == 1
    # Ties at a row's k-th value past the candidates: vLLM's own call, the same tokens.
    batch.top_k_cpu = top_k
    scaled[0, :200] = scaled[0].max() + 1
    theirs_tok, _ = draw(vllm_sampler)
    ours_tok, _ = draw(ours)
    assert ours.fallbacks == 2 and torch.equal(ours_tok, theirs_tok)

    # On CPU, vLLM's own sampler gets the selecting copy; the runner's keeps vLLM's.
    from vllm.v1.sample.sampler import Sampler

    runner_sampler = Sampler()
    copy = bonus_sampler(runner_sampler, state)
    assert isinstance(copy.topk_topp_sampler, SelectingTopKTopP)
    assert isinstance(runner_sampler.topk_topp_sampler, TopKTopPSampler)
