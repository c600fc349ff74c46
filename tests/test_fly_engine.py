"""FLy's rule as a comparison baseline inside the MTAD engine (vllm_mtad.worker_rpc
.use_baseline_rule), on the tiny pair: the same drafts (the draft's argmax chain), only the
rule differs."""

from __future__ import annotations

import math

import pytest

from tests.engine_utils import close, generate_ids, make_llm, mtad_spec, spec_counters

pytestmark = pytest.mark.engine

PROMPTS = [[1 + (i * 5 + j) % 60 for j in range(6 + 4 * i)] for i in range(4)]


def counted(llm, params):
    """The outputs of PROMPTS, and the draft tokens verified and accepted meanwhile."""
    before = spec_counters(llm)
    out = generate_ids(llm, PROMPTS, params)
    after = spec_counters(llm)
    return out, after["draft_tokens"] - before["draft_tokens"], (
        after["accepted"] - before["accepted"])


def test_fly_in_the_engine_reduces_to_exact_and_to_accept_all(tiny_pair_dirs):
    """With a threshold no entropy reaches, FLy never defers: token for token the "exact"
    rule, with the same acceptance. With threshold 0 and an empty window every rejection is
    deferred: every drafted token is accepted. (The tiny draft is not the target: the exact
    rule rejects some drafts, so both checks can fail.)"""
    from vllm import SamplingParams

    from vllm_mtad.sampler import FlyRule
    from vllm_mtad.worker_rpc import force_plans, use_baseline_rule

    target_dir, draft_dir = tiny_pair_dirs
    llm = make_llm(target_dir, mtad_spec(draft_dir, gamma=4, width=4), enforce_eager=True,
                   disable_log_stats=False)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True,
                            extra_args={"greedy_acceptance": "exact"})

    def run():
        return counted(llm, params)

    try:
        llm.collective_rpc(force_plans([(1, 4)]))
        exact, drafted, accepted = run()
        assert 0 < accepted < drafted
        llm.collective_rpc(use_baseline_rule(FlyRule(entropy_threshold=math.inf)))
        assert run() == (exact, drafted, accepted)
        llm.collective_rpc(use_baseline_rule(FlyRule(window=0, entropy_threshold=0.0)))
        loose, drafted, accepted = run()
        assert accepted == drafted > 0 and loose != exact
        llm.collective_rpc(use_baseline_rule(None))
        assert run()[0] == exact
    finally:
        close(llm)


def test_sampled_fly_in_the_engine(tiny_pair_dirs):
    """FLy at T=1 on one sampled chain (W=1 forced), with the draft's distributions kept for
    the residual: with an unreachable threshold it is standard speculative sampling (some
    drafts rejected), and reruns with the same seeds give the same tokens; with threshold 0
    and no window every drafted token the target does not rule out is accepted (no top-k/top-p:
    the target rules none out); with top-k/top-p (sparse candidates) it runs and defers some
    rejections: it accepts more than without deferral. Two-beam sampled drafts are refused.
    Two requests at a time, of different lengths: a request joins while another is being
    verified (its prefill step has no draft, and no kept distribution, to read)."""
    from vllm import SamplingParams

    from vllm_mtad.sampler import FlyRule
    from vllm_mtad.worker_rpc import force_plans, use_baseline_rule

    target_dir, draft_dir = tiny_pair_dirs
    llm = make_llm(target_dir, mtad_spec(draft_dir, gamma=4, width=4), enforce_eager=True,
                   disable_log_stats=False, max_num_seqs=2)

    def run(rule, **sampling):
        llm.collective_rpc(use_baseline_rule(rule))
        return counted(llm, [SamplingParams(max_tokens=n, temperature=1.0, ignore_eos=True,
                                            seed=5 + i, **sampling)
                             for i, n in enumerate((40, 12, 28, 20))])

    try:
        llm.collective_rpc(force_plans([(1, 4)]))
        strict, drafted, accepted = run(FlyRule(entropy_threshold=math.inf))
        assert 0 < accepted < drafted
        assert run(FlyRule(entropy_threshold=math.inf))[0] == strict
        _, drafted, accepted = run(FlyRule(window=0, entropy_threshold=0.0))
        assert accepted == drafted > 0
        _, drafted, strict_accepted = run(FlyRule(entropy_threshold=math.inf), top_k=10,
                                          top_p=0.9)
        _, drafted_loose, loose_accepted = run(FlyRule(window=0, entropy_threshold=0.0),
                                               top_k=10, top_p=0.9)
        assert loose_accepted / drafted_loose > strict_accepted / drafted
        # sampled drafts of more than one beam have no kept distribution: refused, by name
        # (last: the step fails, and the in-process engine with it)
        llm.collective_rpc(force_plans([(2, 4)]))
        with pytest.raises(Exception, match="FLy comparison rule verifies one-beam drafts"):
            run(FlyRule())
    finally:
        llm.collective_rpc(use_baseline_rule(None))
        close(llm)
