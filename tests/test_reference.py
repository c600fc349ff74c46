"""The reference implementation on tiny random transformers models (docs/algorithm.md#properties-worth-testing)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from tests.helpers import chi_square_pvalue, set_draw_probabilities
from devtools import reference as ref
from vllm_mtad.config import MTADConfig

pytestmark = pytest.mark.unit

PROMPTS = [[5, 6, 7, 8, 9], [100, 3, 250], [42] * 12]


@pytest.mark.parametrize("gamma,width", [(4, 4), (3, 1), (2, 3)])
def test_draft_equal_to_target_accepts_every_block(tiny_pair, gamma, width):
    target, _ = tiny_pair
    cfg = MTADConfig(num_speculative_tokens=gamma, beam_width=width, acceptance_threshold=0.5)
    # τ = 0.5 rather than 1: the draft and target passes see different batch shapes, so p and q
    # agree only to float32 rounding (~1e-6), which τ = 1 would turn into coin flips.
    for sampling in (ref.Sampling(temperature=1.0), ref.Sampling(temperature=0.0)):
        out = ref.generate(target, target, PROMPTS[0], 1 + 3 * (gamma + 1), cfg, sampling, seed=1)
        assert out.accepted_per_step == [gamma] * 3
        assert out.mean_acceptance_length == gamma + 1


def test_tiny_threshold_accepts_every_block(tiny_pair):
    target, draft = tiny_pair
    cfg = MTADConfig(num_speculative_tokens=3, beam_width=2, acceptance_threshold=1e-30)
    out = ref.generate(target, draft, PROMPTS[1], 13, cfg, ref.Sampling(temperature=1.0), seed=4)
    assert out.accepted_per_step == [3] * 3


def test_greedy_exact_equals_plain_greedy_decoding(tiny_pair):
    target, draft = tiny_pair
    for prompt in PROMPTS:
        want = ref.greedy_decode(target, prompt, 24)
        for width in (1, 4):
            cfg = MTADConfig(num_speculative_tokens=4, beam_width=width, greedy_acceptance="exact")
            out = ref.generate(target, draft, prompt, 24, cfg, ref.Sampling(temperature=0.0))
            assert out.token_ids == want
    assert 0 < sum(out.accepted_per_step) < 4 * len(out.accepted_per_step)  # partial acceptance


def test_greedy_joint_is_deterministic_and_partially_accepted(tiny_pair):
    target, draft = tiny_pair
    cfg = MTADConfig(num_speculative_tokens=4, beam_width=4)
    a = ref.generate(target, draft, PROMPTS[2], 30, cfg, ref.Sampling(temperature=0.0), seed=1)
    b = ref.generate(target, draft, PROMPTS[2], 30, cfg, ref.Sampling(temperature=0.0), seed=2)
    assert a.token_ids == b.token_ids and a.accepted_per_step == b.accepted_per_step
    assert 1 < a.mean_acceptance_length < 5


def test_sampled_is_reproducible_per_seed(tiny_pair):
    target, draft = tiny_pair
    cfg = MTADConfig(num_speculative_tokens=3)
    s = ref.Sampling(temperature=1.0, top_k=10, top_p=0.9)
    a = ref.generate(target, draft, PROMPTS[0], 20, cfg, s, seed=7)
    assert a.token_ids == ref.generate(target, draft, PROMPTS[0], 20, cfg, s, seed=7).token_ids
    assert a.token_ids != ref.generate(target, draft, PROMPTS[0], 20, cfg, s, seed=8).token_ids


def test_reference_draws_without_replacement():
    weights = [0.5, 0.2, 0.15, 0.1, 0.05, 0.0]
    gen = torch.Generator().manual_seed(0)
    n = 40_000
    sets = Counter(frozenset(ref._draw_without_replacement(weights, 3, gen)) for _ in range(n))
    assert chi_square_pvalue(sets, set_draw_probabilities(weights, 3), n) > 1e-4


def test_max_new_tokens_and_eos_are_respected(tiny_pair):
    target, draft = tiny_pair
    cfg = MTADConfig(num_speculative_tokens=4)
    out = ref.generate(target, draft, PROMPTS[0], 7, cfg, ref.Sampling(temperature=0.0))
    assert len(out.token_ids) == 7
    eos = out.token_ids[3]
    stopped = ref.generate(target, draft, PROMPTS[0], 7, cfg, ref.Sampling(temperature=0.0),
                           eos_token_id=eos)
    assert stopped.token_ids[-1] == eos and len(stopped.token_ids) <= 4


def test_the_reference_context_limit_changes_the_last_rounds(tiny_pair):
    """The reference's max_len is not a no-op: near the end it drafts shorter searches, and
    the output differs from the unlimited one for some prompt (else
    tests/test_e2e_engine.py::test_drafting_through_the_end_of_the_context, which compares the
    engine with the reference under that limit, would not test the boundary)."""
    cfg = MTADConfig(4, 4, 0.5)
    differ = 0
    for n in (216, 243, 250, 254):
        prompt = list(range(10, 10 + n))
        a = ref.generate(*tiny_pair, prompt, 256 - n, cfg, ref.Sampling(temperature=0.0))
        b = ref.generate(*tiny_pair, prompt, 256 - n, cfg, ref.Sampling(temperature=0.0),
                         max_len=256)
        assert len(b.token_ids) == 256 - n
        assert all(len(d) <= 256 - n for d in b.drafts)
        differ += a.token_ids != b.token_ids
    assert differ > 0
