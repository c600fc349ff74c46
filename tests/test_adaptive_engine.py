"""The speculation policy through the real vLLM engine (in-process, CPU) on the tiny pair.

The hard part of choosing W and γ per step is what it does to the draft's KV cache: a step
without drafting runs no draft forward, so the draft must catch up later; a step with fewer
beams or a shorter draft must leave nothing behind that a later step reads. With the draft
equal to the target (and no truncation) every drafted token must be accepted (docs/
algorithm.md, properties): a draft KV that is stale or wrongly caught up shows as rejections
(measured when this test was written: with the catch-up switched off, 77 of 313 and 3 of 399
drafted tokens were accepted instead of all).
"""

from __future__ import annotations

import pytest

from tests.engine_utils import (close, generate_ids, make_llm, mtad_spec, spec_counters,
                                token_prompts)

pytestmark = pytest.mark.engine

PROMPTS = [[1 + (i * 7 + j) % 50 for j in range(5 + 3 * i)] for i in range(6)]
# Steps of (W, γ): full, then three steps without drafting (a gap of two tokens and more),
# narrower and shorter drafts; W changes between consecutive steps of every request.
SCHEDULE = [(4, 3), (1, 0), (1, 0), (1, 0), (2, 2), (1, 0), (4, 3), (1, 1)]


def params(n, temperature, seed=None, **kw):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=n, temperature=temperature, ignore_eos=True, seed=seed,
                          **kw)


def drafted_and_accepted(llm, prompts, sampling):
    before = spec_counters(llm)
    out = generate_ids(llm, prompts, sampling)
    after = spec_counters(llm)
    return out, after["draft_tokens"] - before["draft_tokens"], after["accepted"] - before[
        "accepted"]


def test_self_draft_accepts_everything_across_skipped_and_narrowed_steps(tiny_pair_dirs):
    from vllm_mtad.worker_rpc import drafter_stats, force_plans

    target_dir, _ = tiny_pair_dirs
    llm = make_llm(target_dir, mtad_spec(target_dir, gamma=3, width=4), enforce_eager=True,
                   enable_prefix_caching=True, disable_log_stats=False)
    try:
        llm.collective_rpc(force_plans(SCHEDULE))
        for sampling in (params(60, 1.0, seed=3), params(60, 0.0),
                         params(60, 0.0, extra_args={"greedy_acceptance": "exact"})):
            out, drafted, accepted = drafted_and_accepted(llm, PROMPTS, sampling)
            assert all(len(o) == 60 for o in out)
            assert drafted > 100 and accepted == drafted
        # New requests whose prompts hit blocks cached while steps skipped drafting: their
        # draft KV in those blocks may never have been written; it is caught up from the
        # first such block's hole.
        shared = PROMPTS[5] + list(range(60, 120))
        first, drafted, accepted = drafted_and_accepted(llm, [shared + [3]], params(40, 0.0))
        assert accepted == drafted > 0
        _, drafted, accepted = drafted_and_accepted(
            llm, [shared + [4], shared + [5, 6]], params(40, 1.0, seed=1))
        assert accepted == drafted > 0
        stats = llm.collective_rpc(drafter_stats)[0]
        # A prefix read with drafting at every step leaves no hole: a hit on its three blocks
        # (after skipped steps elsewhere) has nothing to catch up on, and loses no acceptance.
        llm.collective_rpc(force_plans([(4, 3)]))
        clean = [50 + (i * 13) % 300 for i in range(96)]
        drafted_and_accepted(llm, [clean + [7]], params(20, 0.0))
        caught_up = llm.collective_rpc(drafter_stats)[0]["policy_catch_up_tokens"]
        hits_before = sum(m.value for m in llm.get_metrics()
                          if m.name == "vllm:prefix_cache_hits")
        _, drafted, accepted = drafted_and_accepted(llm, [clean + [8, 9]], params(20, 0.0))
        assert accepted == drafted > 0
        hits = sum(m.value for m in llm.get_metrics() if m.name == "vllm:prefix_cache_hits")
        assert hits - hits_before >= 96
        assert llm.collective_rpc(drafter_stats)[0]["policy_catch_up_tokens"] == caught_up
    finally:
        close(llm)
    assert hits > 0
    chosen = stats["policy_chosen"]
    # The scheduled arms; exact-only batches draft them with one beam, as the fixed policy does.
    assert set(chosen) == ({f"W{w}_g{g}" for w, g in SCHEDULE}
                           | {f"W1_g{g}" for _, g in SCHEDULE})
    assert stats["policy_catch_up_tokens"] > 0
    assert sum(chosen.values()) == stats["policy_steps"]


def test_adaptive_mixed_batch_and_exact_equals_target_greedy(tiny_pair_dirs):
    """The adaptive policy on a mixed batch (sampled, greedy joint, greedy exact, different
    lengths): every request completes, exact requests equal the target's own greedy decoding
    token for token, and the policy's choices and measurements are reported."""
    from vllm_mtad.worker_rpc import drafter_stats

    target_dir, draft_dir = tiny_pair_dirs
    exact = {"greedy_acceptance": "exact"}
    batch = ([params(48, 1.0, seed=i) for i in range(3)] + [params(40, 0.0)]
             + [params(56, 0.0, extra_args=exact)] * 2)
    prompts = PROMPTS[:6]
    llm = make_llm(target_dir, mtad_spec(draft_dir, speculation_policy="adaptive"),
                   enforce_eager=True, disable_log_stats=False)
    try:
        for _ in range(3):  # enough steps for the cost models to leave the start-up setting
            got = [o.outputs[0].token_ids for o in llm.generate(
                [{"prompt_token_ids": p} for p in prompts], batch, use_tqdm=False)]
        stats = llm.collective_rpc(drafter_stats)[0]
    finally:
        close(llm)
    plain = make_llm(target_dir, enforce_eager=True)
    want = generate_ids(plain, prompts[4:], params(56, 0.0))
    close(plain)
    assert [len(g) for g in got] == [48, 48, 48, 40, 56, 56]
    assert [list(g) for g in got[4:]] == want
    assert stats["policy"] == "adaptive"
    assert sum(stats["policy_chosen"].values()) == stats["policy_steps"] > 50
    costs = stats["policy_costs"]
    assert costs["verify"][0] + costs["verify"][1] > 0 and costs["first_pass"][0] > 0
    # The chosen arms are within bounds and more than the start-up one was tried.
    for arm in stats["policy_chosen"]:
        w, g = (int(x[1:]) for x in arm.split("_"))
        assert 1 <= w <= 4 and 0 <= g <= 4
    assert len(stats["policy_chosen"]) > 1


def test_min_speculative_tokens_forbids_steps_without_a_draft(tiny_pair_dirs):
    """On the tiny pair drafting costs more than it saves (the policy picks γ = 0 most steps,
    test above); with min_speculative_tokens=1 no step may skip."""
    from vllm_mtad.worker_rpc import drafter_stats

    target_dir, draft_dir = tiny_pair_dirs
    llm = make_llm(target_dir, mtad_spec(draft_dir, speculation_policy="adaptive",
                                         min_speculative_tokens=1, min_beam_width=2),
                   enforce_eager=True)
    try:
        for _ in range(2):
            generate_ids(llm, PROMPTS, params(48, 1.0, seed=5))
        stats = llm.collective_rpc(drafter_stats)[0]
    finally:
        close(llm)
    arms = [tuple(int(x[1:]) for x in a.split("_")) for a in stats["policy_chosen"]]
    assert arms and all(g >= 1 and w >= 2 for w, g in arms)
    assert stats["policy_catch_up_tokens"] == 0


def test_a_request_asking_for_the_fixed_policy_gets_the_fixed_engines_output(tiny_pair_dirs):
    """speculation_policy "fixed" per request (vllm_xargs) in an adaptive engine: every step
    the request is in drafts the configured (W, γ), so its seeded output is the one a fixed
    engine gives, while the engine's other steps follow its own plans (here forced, so that
    they differ for sure: without the override the same request's output differs)."""
    from vllm_mtad.worker_rpc import force_plans

    target_dir, draft_dir = tiny_pair_dirs
    mine = params(40, 1.0, seed=5, top_k=10, extra_args={"speculation_policy": "fixed"})
    plain = params(40, 1.0, seed=5, top_k=10)
    fixed_llm = make_llm(target_dir, mtad_spec(draft_dir, gamma=4, width=4), enforce_eager=True)
    try:
        want = generate_ids(fixed_llm, PROMPTS[:1], plain)[0]
    finally:
        close(fixed_llm)
    llm = make_llm(target_dir, mtad_spec(draft_dir, gamma=4, width=4,
                                         speculation_policy="adaptive"), enforce_eager=True)
    try:
        llm.collective_rpc(force_plans(SCHEDULE))
        others = params(40, 1.0, seed=9)
        outs = llm.generate(token_prompts(PROMPTS[:4]), [mine] + [others] * 3, use_tqdm=False)
        assert list(outs[0].outputs[0].token_ids) == want
        # Alone, and without the override: the forced plans change its output.
        assert generate_ids(llm, PROMPTS[:1], mine)[0] == want
        assert generate_ids(llm, PROMPTS[:1], plain)[0] != want
    finally:
        close(llm)


def test_steps_without_a_draft_sample_what_the_target_alone_samples(tiny_pair_dirs):
    """A step where no request drafts samples one token per request from the target, as the
    target alone does: seeded T=1 requests with top-k and top-p get the target alone's tokens,
    token for token, when every step drafts nothing; on CPU those tokens are drawn through the
    k-selection (sampler.SelectingTopKTopP), not vLLM's sort of the vocabulary."""
    from vllm.platforms import current_platform

    from vllm_mtad.worker_rpc import drafter_stats, force_plans

    target_dir, draft_dir = tiny_pair_dirs
    n = 24
    sampling = [params(n, 1.0, seed=11 + i, top_k=10, top_p=0.9) for i in range(4)]
    plain = make_llm(target_dir, enforce_eager=True)
    try:
        want = generate_ids(plain, PROMPTS[:4], sampling)
        other_seeds = generate_ids(plain, PROMPTS[:4], [params(n, 1.0, seed=50 + i, top_k=10,
                                                               top_p=0.9) for i in range(4)])
    finally:
        close(plain)
    assert other_seeds != want  # the tokens are draws: the comparison below can fail
    llm = make_llm(target_dir, mtad_spec(draft_dir, gamma=4, width=4,
                                         speculation_policy="adaptive"),
                   enforce_eager=True, disable_log_stats=False)
    try:
        llm.collective_rpc(force_plans([(1, 0)]))
        before = llm.collective_rpc(drafter_stats)[0]
        got, drafted, _ = drafted_and_accepted(llm, PROMPTS[:4], sampling)
        after = llm.collective_rpc(drafter_stats)[0]
    finally:
        close(llm)
    assert drafted == 0
    assert got == want
    if current_platform.is_cpu():
        selected = after["sampler_bonus_selected"] - before["sampler_bonus_selected"]
        assert selected >= n  # every step's draw: at least one per output token
        assert after["sampler_bonus_fallbacks"] == before["sampler_bonus_fallbacks"]


def test_queued_arrivals_hold_the_concurrency_and_lose_no_draft(tiny_pair_dirs):
    """benchmarks.lib.runner.generate_queued: vLLM admits
    at most ``concurrency`` requests into the running batch, a queued request joins as soon as
    one finishes (its prefill beside the others' drafts), and the admission limit is restored
    afterwards. With the draft equal to the target, every drafted token is accepted: requests
    joining a drafting batch leave no stale draft KV behind."""
    from benchmarks.lib.runner import generate_queued

    target_dir, _ = tiny_pair_dirs
    llm = make_llm(target_dir, mtad_spec(target_dir, gamma=3, width=4,
                                         speculation_policy="adaptive"),
                   enforce_eager=True, disable_log_stats=False, max_num_seqs=8)
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    running, schedule = [], scheduler.schedule

    def counting_schedule(*args, **kwargs):
        out = schedule(*args, **kwargs)
        running.append(len(scheduler.running))
        return out

    scheduler.schedule = counting_schedule
    try:
        prompts = [{"prompt_token_ids": p} for p in PROMPTS]
        sampling = [params(30 + 5 * i, 1.0, seed=i) for i in range(len(PROMPTS))]
        before = spec_counters(llm)
        outs = generate_queued(llm, prompts, sampling, concurrency=2)
        after = spec_counters(llm)
        limit = scheduler.max_num_active_reqs
    finally:
        del scheduler.schedule
        close(llm)
    assert [len(o.outputs[0].token_ids) for o in outs] == [30 + 5 * i for i in range(6)]
    assert max(running) == 2 and running.count(2) > len(running) // 2
    assert limit == 8  # restored
    drafted = after["draft_tokens"] - before["draft_tokens"]
    assert drafted > 50 and after["accepted"] - before["accepted"] == drafted
