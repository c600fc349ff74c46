"""Small pieces of the vLLM glue that can be checked without an engine."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.unit


def test_draft_store_matches_scheduled_drafts_and_prunes():
    from vllm_mtad.request_state import DraftStore

    store = DraftStore()
    store.put(["a", "b"], torch.tensor([[1, 2, 3], [4, 5, 6]]),
              torch.tensor([[-0.1, -0.2, -0.3], [-1.0, -2.0, -3.0]]))

    def lookup(req_id, scheduled):
        lps, ok = store.lookup([req_id], torch.tensor([scheduled]))
        return lps[0].tolist() if bool(ok[0]) else "mismatch"

    assert lookup("a", [1, 2, 3]) == pytest.approx([-0.1, -0.2, -0.3])
    assert lookup("a", [1, 2, -1]) == pytest.approx([-0.1, -0.2, 0.0])  # fewer scheduled
    assert lookup("b", [4, -1, 6]) == pytest.approx([-1.0, 0.0, -3.0])  # an invalid position
    assert lookup("a", [1, 9, 3]) == "mismatch"  # not this drafter's tokens
    assert lookup("c", [1, -1, -1]) == "mismatch"  # no entry
    # A request without an entry (a new one) does not cost the others their log-probs.
    lps, ok = store.lookup(["a", "c"], torch.tensor([[1, 2, 3], [-1, -1, -1]]))
    assert ok.tolist() == [True, True] and lps[0].tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert store.lookup(["c"], torch.tensor([[5, -1, -1]]))[1].tolist() == [False]
    # A later round without "a" (skipped this step) keeps "a"; a finished request is dropped.
    store.put(["b"], torch.tensor([[7, 8, 9]]), torch.zeros(1, 3))
    assert lookup("a", [1, 2, 3]) == pytest.approx([-0.1, -0.2, -0.3])
    assert lookup("b", [7, 8, 9]) == [0.0, 0.0, 0.0]
    store.put(["b"], torch.tensor([[7, 8, 9]]), torch.zeros(1, 3))
    store.forget(["a"])  # the request state's rule: a finished request is forgotten
    assert lookup("a", [1, 2, 3]) == "mismatch"
    # Longer drafts than the store's (γ grew): the missing positions never match.
    assert lookup("b", [7, 8, 9, 5]) == "mismatch"


def test_request_seed_is_stable_and_uses_the_seed():
    from types import SimpleNamespace

    from vllm_mtad.speculation import request_seed

    assert request_seed(SimpleNamespace(seed=42), "x") == 42
    a = request_seed(SimpleNamespace(seed=None), "req-1")
    assert a == request_seed(SimpleNamespace(seed=None), "req-1") >= 0
    assert a != request_seed(SimpleNamespace(seed=None), "req-2")


def test_translate_speculative_config():
    from vllm_mtad.config import translate_speculative_config

    spec, extra = translate_speculative_config(
        {"method": "mtad", "model": "d", "num-speculative-tokens": 3, "beam_width": 2},
        {"other": 1})
    assert spec == {"method": "draft_model", "model": "d", "num_speculative_tokens": 3}
    assert extra == {"other": 1, "mtad": {"num_speculative_tokens": 3, "beam_width": 2,
                                          "acceptance_threshold": 0.5,
                                          "greedy_acceptance": "joint",
                                          "speculation_policy": "adaptive", "min_beam_width": 1,
                                          "min_speculative_tokens": 0,
                                          "beam_kv_fraction": 0.1}}
    with pytest.raises(ValueError, match="'model' is required"):
        translate_speculative_config({"method": "mtad", "num_speculative_tokens": 3}, None)
    with pytest.raises(ValueError, match="'num_speculative_tokens' is required"):
        translate_speculative_config({"method": "mtad", "model": "d"}, None)


@pytest.mark.parametrize("key,value,says", [
    ("rejection_sample_method", "fly", "FLy's lossy verification"),
    ("rejection_sample_method", "standard", "vLLM's rejection sampling"),
    ("fly_window_size", 2, "FLy's lossy verification"),
    ("fly_entropy_threshold", 0.2, "FLy's lossy verification"),
    ("fly_entropy_top_k", 3, "FLy's lossy verification"),
    ("fly-window-size", 2, "FLy's lossy verification"),  # the CLI spelling
    ("synthetic_acceptance_length", 2.5, "vLLM's rejection sampling"),
])
def test_vllm_verification_keys_are_refused_for_mtad(key, value, says):
    """vLLM 0.33's FLy (rejection_sample_method "fly", fly_*) and vLLM's other verification
    settings: MTAD accepts by its own rule, so the key is named and the fix given."""
    from vllm_mtad.config import translate_speculative_config

    spec = {"method": "mtad", "model": "d", "num_speculative_tokens": 3, key: value}
    with pytest.raises(ValueError) as err:
        translate_speculative_config(spec, None)
    message = str(err.value)
    assert f"speculative config key {key.replace('-', '_')!r}" in message
    assert "MTAD has its own acceptance" in message and says in message
    assert "acceptance_threshold" in message


def test_vllm_drafting_keys_are_refused_for_mtad():
    from vllm_mtad.config import translate_speculative_config

    for key, value in (("draft_sample_method", "probabilistic"), ("parallel_drafting", True),
                       ("use_heterogeneous_vocab", True)):
        with pytest.raises(ValueError, match=f"key '{key}' does not apply to method 'mtad'"):
            translate_speculative_config({"method": "mtad", "model": "d",
                                          "num_speculative_tokens": 3, key: value}, None)


def test_check_batch_limits_message():
    from vllm_mtad.patches.engine.patch_config_vllm import check_batch_limits

    check_batch_limits(4, 16, 64)
    with pytest.raises(ValueError, match=r"'beam_width'=8 .* beam_width <= 4"):
        check_batch_limits(8, 16, 64)


def _kv_config(num_blocks, layers, page, offset=0, extra_tensor=None):
    from types import SimpleNamespace

    from vllm.v1.kv_cache_interface import KVCacheTensor

    size = offset + len(layers) * num_blocks * page
    tensors = [KVCacheTensor(size=size, layers=list(layers), layer_stride=num_blocks * page,
                             block_stride=page, offset=offset)]
    if extra_tensor is not None:
        tensors.append(extra_tensor)
    return SimpleNamespace(num_blocks=num_blocks, kv_cache_tensors=tensors,
                           needs_kv_cache_zeroing=False)


def test_draft_scratch_extends_only_the_draft_layers():
    """The draft layers, last in a layer-outermost tensor, move to span num_blocks + S pages at
    the end of a backing allocation grown by exactly their S pages; the target layers' places
    do not change; a layout with the draft layers elsewhere is refused with a clear message."""
    from vllm_mtad.draft_scratch import ScratchPlan, extend_config

    page, N, S = 1024, 10, 6
    layers = ["t0", "t1", "t2", "d0", "d1"]
    cfg = _kv_config(N, layers, page)
    plan = ScratchPlan(["d0", "d1"], S, rows=1, bytes=0, beam_width=4, tail_blocks=2,
                       max_rows=1, fraction=0.1)
    extend_config(cfg, plan)
    target, draft = cfg.kv_cache_tensors
    assert target.layers == ["t0", "t1", "t2"] and draft.layers == ["d0", "d1"]
    assert target.offset == 0 and target.layer_stride == N * page
    assert draft.offset == 3 * N * page and draft.layer_stride == (N + S) * page
    assert target.size == draft.size == 5 * N * page + 2 * S * page
    assert draft.offset + 2 * draft.layer_stride == draft.size  # ends at the allocation's end
    assert plan.base == N and plan.bytes == 2 * S * page

    bad = _kv_config(N, ["d0", "d1", "t0"], page)  # draft layers not last
    with pytest.raises(ValueError, match="VLLM_KV_CACHE_LAYOUT"):
        extend_config(bad, ScratchPlan(["d0", "d1"], S, 1, 0, 4, 2, 1, 0.1))
    packed = _kv_config(N, layers, page)  # block-outermost: pages of all layers per block
    t = packed.kv_cache_tensors[0]
    packed.kv_cache_tensors[0] = type(t)(size=t.size, layers=t.layers, layer_stride=page,
                                         block_stride=5 * page)
    with pytest.raises(ValueError, match="VLLM_KV_CACHE_LAYOUT"):
        extend_config(packed, ScratchPlan(["d0", "d1"], S, 1, 0, 4, 2, 1, 0.1))
    # A second cache group (e.g. sliding-window layers) overlays the same bytes from offset 0:
    # the draft layers' growth would land on its pages.
    from vllm.v1.kv_cache_interface import KVCacheTensor

    other = KVCacheTensor(size=5 * N * page, layers=["s0", "s1", "s2", "s3"],
                          layer_stride=N * page, block_stride=page)
    overlaid = _kv_config(N, layers, page, extra_tensor=other)
    with pytest.raises(ValueError, match="one attention KV cache group"):
        extend_config(overlaid, ScratchPlan(["d0", "d1"], S, 1, 0, 4, 2, 1, 0.1))
    mamba = _kv_config(N, layers, page)
    mamba.needs_kv_cache_zeroing = True
    with pytest.raises(ValueError, match="one attention KV cache group"):
        extend_config(mamba, ScratchPlan(["d0", "d1"], S, 1, 0, 4, 2, 1, 0.1))


def test_request_keys_refuse_engine_wide_keys_and_typos_only():
    from vllm_mtad.config import MTADConfig, request_settings

    cfg = MTADConfig(4, 4, 0.5)
    # vLLM's own and custom logits processors' keys share extra_args: they pass.
    assert request_settings({"kv_transfer_params": {}, "my_processor_arg": 3,
                             "acceptance_threshold": 0.2}, cfg) == (0.2, "joint", False)
    for key in ("beam_width", "num_speculative_tokens"):
        with pytest.raises(ValueError, match=f"'{key}' is engine-wide.*'acceptance_threshold'"):
            request_settings({key: 2}, cfg)
    for typo, meant in (("acceptnce_threshold", "acceptance_threshold"),
                        ("greedy_acceptence", "greedy_acceptance")):
        with pytest.raises(ValueError, match=f"did you mean '{meant}'"):
            request_settings({typo: 0.3}, cfg)


def test_a_request_may_ask_for_the_fixed_policy_only_in_an_adaptive_engine():
    from vllm_mtad.config import MTADConfig, request_settings

    adaptive = MTADConfig(4, 4, 0.5)  # the default
    fixed = MTADConfig(4, 4, 0.5, speculation_policy="fixed")
    assert request_settings({"speculation_policy": "fixed"}, adaptive)[2] is True
    assert request_settings({"speculation_policy": "adaptive"}, adaptive)[2] is False
    assert request_settings({}, adaptive)[2] is False
    assert request_settings({"speculation_policy": "fixed"}, fixed)[2] is False  # fixed already
    with pytest.raises(ValueError, match="'adaptive' needs an engine started with"):
        request_settings({"speculation_policy": "adaptive"}, fixed)
    with pytest.raises(ValueError, match=r"'speculation_policy' must be one of \['fixed', "):
        request_settings({"speculation_policy": "greedy"}, adaptive)
    with pytest.raises(ValueError, match="did you mean 'speculation_policy'"):
        request_settings({"speculation_polcy": "fixed"}, adaptive)


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


def _scratch_runner(*, max_num_seqs=8, fraction=0.1, width=4,
                    gamma=4, block_size=32, max_model_len=256):
    """A model runner as draft_scratch sees it: 4 target and 3 draft attention layers (pages
    of 7 and 3 units), an MTAD drafter, vLLM's layer-outermost layout."""
    from types import SimpleNamespace

    from vllm_mtad.config import MTADConfig
    from vllm_mtad.proposer import MTADProposer

    drafter = MTADProposer.__new__(MTADProposer)  # only the attributes draft_scratch reads
    drafter.mtad = MTADConfig(gamma, width, beam_kv_fraction=fraction)
    drafter._draft_attn_layer_names = ["d0", "d1", "d2"]
    specs = {name: SimpleNamespace(block_size=block_size, page_size_bytes=700)
             for name in ("t0", "t1", "t2", "t3")}
    specs |= {name: SimpleNamespace(block_size=block_size, page_size_bytes=300)
              for name in drafter._draft_attn_layer_names}
    layout = SimpleNamespace(is_layer_compact=True, name="LBHNC")
    return SimpleNamespace(
        drafter=drafter, get_kv_cache_spec=lambda: specs,
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        vllm_config=SimpleNamespace(kv_transfer_config=None),
        cache_config=SimpleNamespace(block_size=block_size,
                                     get_resolved_kv_cache_layout=lambda: layout),
        model_config=SimpleNamespace(max_model_len=max_model_len))


def test_draft_scratch_takes_at_most_beam_kv_fraction_of_the_kv_cache():
    """The beams' draft-only blocks: all max_num_seqs rows where their tails take at most
    beam_kv_fraction of the KV memory; otherwise that fraction, and the rows it holds, counted
    from the pool vLLM settles on (the same on every tensor-parallel rank) and never more than
    each rank set aside. Too small a fraction for one row fails naming the key."""
    from vllm_mtad.draft_scratch import plan_for, reserve

    block = 4 * 700 + 3 * 300  # pool bytes per block
    row = 3 * 2 * 900  # (W-1) beams x 2 tail blocks x the draft layers' page bytes
    # Plenty of memory: all 8 rows, the pool gets the rest.
    runner = _scratch_runner()
    available = 10_000 * block
    left = reserve(runner, available)
    assert left == available - 8 * row
    plan = plan_for(runner, pool_blocks=left // block)
    assert (plan.rows, plan.blocks, plan.bytes) == (8, 8 * 6, 8 * row)
    # A small budget: a tenth of it, and the rows that tenth holds.
    available = 60 * block
    left = reserve(runner, available)
    assert left == available - int(0.1 * available)
    plan = plan_for(runner, pool_blocks=left // block)
    assert 1 <= plan.rows < 8 and plan.bytes <= available - left
    assert (plan.rows + 1) * row > 0.1 / 0.9 * (left // block) * block  # no row left out
    # Two tensor-parallel ranks with different free memory: vLLM's pool is the smaller one's,
    # both ranks draft the same rows, and each fits in what it set aside.
    budgets = [60 * block, 75 * block]
    lefts = [reserve(runner, a) for a in budgets]
    pool = min(x // block for x in lefts)
    plans = [plan_for(runner, pool_blocks=pool) for _ in budgets]
    assert plans[0].rows == plans[1].rows
    assert all(p.bytes <= a - x for p, a, x in zip(plans, budgets, lefts))
    # A fraction that holds no request's tails.
    with pytest.raises(ValueError, match=r"beam_kv_fraction 0.01 .* holds the beam tails of no"):
        reserve(_scratch_runner(fraction=0.01), 60 * block)
    # One beam or one draft token: no scratch.
    assert plan_for(_scratch_runner(width=1)) is None
    assert plan_for(_scratch_runner(gamma=1)) is None


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, "0.1", True, None])
def test_beam_kv_fraction_is_checked(bad):
    from vllm_mtad.config import MTADConfig

    with pytest.raises(ValueError, match=r"'beam_kv_fraction' must be a number in \(0, 1\)"):
        MTADConfig(4, beam_kv_fraction=bad)


def test_scratch_rows_for_the_rounds_width_and_length():
    """The scratch is reserved for (beam_width, γ) x max_num_seqs rows; a round with fewer
    beams or a shorter draft lays its tails out for itself and fits more rows."""
    from types import SimpleNamespace

    from vllm_mtad.beam_kv import scratch_blocks
    from vllm_mtad.proposer import scratch_rows

    blocks = scratch_blocks(8, 4, 4, 32)
    scratch = SimpleNamespace(blocks=blocks, rows=8)
    assert scratch_rows(scratch, 4, 4, 32) == 8
    assert scratch_rows(scratch, 2, 4, 32) == 24  # one tail per row instead of three
    assert scratch_rows(scratch, 1, 4, 32) == 8  # W = 1 needs no scratch


def test_draft_kv_tracker_gaps_after_skipped_steps():
    """Which tokens the draft must catch up on: none after one skipped step (the last first
    pass wrote the token at the next start), the tokens of the skipped steps after more; a
    request first seen (or seen going backwards: resumed after preemption) with tokens already
    computed once any step skipped is caught up from 0; finished requests are forgotten."""
    from vllm_mtad.speculation import DraftKVTracker

    kv = DraftKVTracker()

    def step(req_ids, starts, drafting):
        # owed() says, without recording anything, what a drafting step would catch up on.
        owed = kv.owed(req_ids, starts)
        gaps = kv.step(req_ids, starts, drafting)
        if drafting:
            assert owed == {r: b - a for r, (a, b) in gaps.items()}
        return gaps

    assert step(["a", "b"], [10, 0], drafting=True) == {}  # never skipped: vLLM's rule
    assert step(["a", "b"], [14, 5], drafting=False) == {}  # a skipped step: stale now
    assert kv.owed(["a", "b"], [15, 6]) == {"a": 1, "b": 1}
    assert step(["a", "b"], [15, 6], drafting=False) == {}
    assert step(["a", "b"], [16, 7], drafting=True) == {"a": (14, 16), "b": (5, 7)}
    assert step(["a", "b"], [20, 9], drafting=True) == {}  # current again
    step(["a"], [24], drafting=False)
    # A new request with a prefix-cache hit, and "b" resumed after preemption at 3 < 9.
    assert step(["a", "b", "c"], [25, 3, 32], drafting=True) == {
        "a": (24, 25), "b": (0, 3), "c": (0, 32)}
    # Where the draft reads each from: "a" was first seen at 10 before any skipped step (its
    # cached draft KV valid), "c" at 32 after one (read again from 0).
    assert kv.first_start == {"a": 10, "b": 0, "c": 0}
    kv.forget(["b", "c"])  # finished
    assert set(kv.last_start) == {"a"} and kv.valid == {} and set(kv.first_start) == {"a"}


def test_the_policy_sees_each_rows_prompt_budget_and_catch_up(monkeypatch):
    """What the controller hands the policy from the runner's requests: the prompt tokens the
    draft reads per output token (a prefix-cache hit's cached part left out), and which part
    of a catch-up is an arrival's prompt (a request whose prompt this step still reads); the
    prompt of one that arrived in an earlier step without drafting is a debt."""
    from types import SimpleNamespace

    import torch

    from vllm_mtad.config import MTADConfig
    from vllm_mtad.core import policy
    from vllm_mtad.speculation import SpeculationController

    seen = []
    monkeypatch.setattr(policy, "choose", lambda batch, *a, **k: seen.append(batch)
                        or policy.Plan(1, 0))
    spec = SpeculationController(
        MTADConfig(num_speculative_tokens=4, speculation_policy="adaptive"), torch.device("cpu"))

    def request(prompt, max_tokens, generated):
        return SimpleNamespace(num_prompt_tokens=prompt, output_token_ids=[0] * generated,
                               sampling_params=SimpleNamespace(max_tokens=max_tokens))

    requests = {"a": request(100, 50, 10), "b": request(40, 20, 0)}
    # "a": its prompt read with drafting (the tracker sees every step, drafting or not), then
    # two steps without drafting; "b" not there yet.
    spec.requests.kv.step(["a"], [0], drafting=True)
    spec.plan(["sampled"], scheduled_tokens=1, req_ids=["a"], starts=[109], requests=requests)
    spec.requests.kv.step(["a"], [109], drafting=False)
    spec.plan(["sampled"], scheduled_tokens=1, req_ids=["a"], starts=[110], requests=requests)
    spec.requests.kv.step(["a"], [110], drafting=False)
    # "b" arrives with 8 of its 40 prompt tokens from the prefix cache; since steps skipped
    # drafting, the draft reads it from 0: 8 tokens caught up, 32 in the prefill chunk, all
    # of them priced as an arrival's prompt (its rate), none as a debt.
    spec.plan(["sampled"] * 2, scheduled_tokens=1 + 32, req_ids=["a", "b"], starts=[111, 8],
              requests=requests)
    batch = seen[-1]
    assert batch.prompt_per_token == pytest.approx((100 / 50 + 40 / 20) / 2)
    assert batch.catch_up_tokens == (111 - 109) + 8 and batch.catch_up_arrival_tokens == 8
    assert batch.remaining_tokens == (40 + 20) / 2
    spec.requests.kv.step(["a", "b"], [111, 8], drafting=False)
    # Another step without drafting: "b" now owes its whole prompt and its first token, all
    # of it a debt (it arrived in a step that did not draft: no rate paid for its prompt).
    spec.plan(["sampled"] * 2, scheduled_tokens=2, req_ids=["a", "b"], starts=[112, 41],
              requests=requests)
    assert seen[-1].catch_up_tokens == (112 - 109) + 41
    assert seen[-1].catch_up_arrival_tokens == 0
    spec.requests.kv.step(["a", "b"], [112, 41], drafting=False)
    # "d" (a 100-token prompt) is read in chunks, its first 64 tokens in a step without
    # drafting: on its second chunk it is still arriving, and the 64 tokens it owes are its
    # prompt's (the rate's). "e", resumed after preemption with 120 tokens computed (its
    # 100-token prompt and 20 outputs), owes all of them as a debt.
    requests["d"], requests["e"] = request(100, 30, 0), request(100, 48, 20)
    spec.plan(["sampled"] * 3, scheduled_tokens=2 + 64, req_ids=["a", "b", "d"],
              starts=[113, 42, 0], requests=requests)
    spec.requests.kv.step(["a", "b", "d"], [113, 42, 0], drafting=False)
    spec.plan(["sampled"] * 4, scheduled_tokens=3 + 36, req_ids=["a", "b", "d", "e"],
              starts=[114, 43, 64, 120], requests=requests)
    assert seen[-1].catch_up_tokens == (114 - 109) + 43 + 64 + 120
    assert seen[-1].catch_up_arrival_tokens == 64
    # Without a step that skipped drafting, a prefix-cache hit's cached prompt is not read.
    fresh = SpeculationController(
        MTADConfig(num_speculative_tokens=4, speculation_policy="adaptive"), torch.device("cpu"))
    fresh.plan(["sampled"], scheduled_tokens=32, req_ids=["b"], starts=[8], requests=requests)
    assert seen[-1].prompt_per_token == pytest.approx(32 / 20)
    # A request without a max_tokens (not one vLLM schedules for generation) prices no prompt.
    requests["c"] = request(40, None, 0)
    fresh.plan(["sampled"], scheduled_tokens=40, req_ids=["c"], starts=[0], requests=requests)
    assert seen[-1].prompt_per_token == 0.0


def test_speculation_controller_splits_a_steps_input_into_decode_and_prefill_tokens():
    """The verify sample of a step is sized (decode tokens, prefill tokens): one token a row
    plus the drafts it verifies, and the rest; the proposer's first-pass sample splits on the
    same count. Under forced plans the samples are fitted as they come, not held back."""
    import torch

    from vllm_mtad.config import MTADConfig
    from vllm_mtad.speculation import SpeculationController, force_plans

    spec = SpeculationController(
        MTADConfig(num_speculative_tokens=4, speculation_policy="adaptive"), torch.device("cpu"))
    spec.on_step_start()
    spec.verifying(12)  # 4 rows verifying 3 drafts each, beside a 100-token prefill chunk
    spec.plan(["sampled"] * 4, scheduled_tokens=4 + 12 + 100)
    assert spec.prefill_tokens == 100
    assert spec.costs.verify.samples == 1 and spec.costs.verify._seen == [16.0, 100.0]
    force_plans([(1, 2)])(type("W", (), {"model_runner": type("R", (), {
        "drafter": type("D", (), {"speculation": spec})})}))
    for _ in range(3):
        spec.on_step_start()
        spec.verifying(0)
        spec.plan(["sampled"] * 4, scheduled_tokens=4)
        assert spec.prefill_tokens == 0 and not spec._pending
    assert spec.costs.verify.samples == 4 and spec.costs.rest.samples == 0


def test_forced_plans_cycle_from_their_start_and_the_policys_step_count_goes_on():
    """force_plans restarts its own cycle, not the policy's step count: the exploration
    schedule (one step in explore_period) goes on across benchmark runs as in a server."""
    import torch

    from vllm_mtad.config import MTADConfig
    from vllm_mtad.speculation import SpeculationController, force_plans

    spec = SpeculationController(
        MTADConfig(num_speculative_tokens=4, speculation_policy="adaptive"), torch.device("cpu"))
    worker = type("W", (), {"model_runner": type("R", (), {
        "drafter": type("D", (), {"speculation": spec})})})

    def plans(n):
        out = []
        for _ in range(n):
            spec.on_step_start()
            spec.verifying(0)
            p = spec.plan(["sampled"] * 2, scheduled_tokens=2)
            out.append((p.beam_width, p.num_tokens))
        return out

    force_plans([(1, 2), (4, 3), (2, 1)])(worker)
    assert plans(4) == [(1, 2), (4, 3), (2, 1), (1, 2)]
    force_plans([(1, 2), (4, 3), (2, 1)])(worker)  # again: from the cycle's start
    assert plans(2) == [(1, 2), (4, 3)]
    force_plans(None)(worker)
    plans(3)
    assert spec.steps == 9 == sum(spec.chosen.values())


def test_only_steps_that_verify_no_drafts_and_read_no_prompt_price_not_drafting():
    """CostModel.no_draft is fed from steps whose target input held one token a row and
    nothing else, measured against the verify line's price before the sample joins the line;
    not before the line has 8 samples, nor from a step verifying drafts or a prefill chunk."""
    import torch

    from vllm_mtad.config import MTADConfig
    from vllm_mtad.speculation import SpeculationController

    spec = SpeculationController(
        MTADConfig(num_speculative_tokens=4, speculation_policy="adaptive"), torch.device("cpu"))
    now = [0.0]
    spec.clock.mark = lambda: now[0]

    def step(verified, prefill, seconds=None):
        spec.on_step_start()
        # The verify line the steps follow: 0.05 s + 10 ms a decode token + 2 ms a prefill one.
        now[0] += 0.05 + 0.01 * (4 + verified) + 0.002 * prefill if seconds is None else seconds
        spec.verifying(verified)
        spec.plan(["sampled"] * 4, scheduled_tokens=4 + verified + prefill)

    step(0, 0)  # before the line has 8 samples: no price to measure against
    for i in range(10):
        step(12 if i % 2 else 4, 300 if i % 3 == 0 else 0)
    step(0, 100)  # a prefill chunk without drafts: not what a step without a draft costs
    assert spec.costs.no_draft_ratio(4).samples == 0
    assert spec.costs.verify.predict((4, 0)) == pytest.approx(0.09, rel=0.02)
    step(0, 0, seconds=0.06)  # a step without a draft, a third cheaper than the line says
    ratio = spec.costs.no_draft_ratio(4)
    assert ratio.samples == 1 and ratio.value == pytest.approx(0.06 / 0.09, rel=0.03)
    assert spec.snapshot()["policy_costs"]["no_draft"] == {4: [round(ratio.value, 4), 1]}


def test_draft_kv_tracker_catches_a_hit_up_from_the_hole_its_blocks_hold():
    """With the step's tokens known, a prefix-cache hit after skipped steps is caught up from
    where the draft KV of the blocks it shares stops (a stale request's hole, registered once
    the block where it starts is full), and not at all where it shares no such block; past
    ``max_holes`` the tracker falls back to reading every hit from 0."""
    import numpy as np

    from vllm_mtad.speculation import DraftKVTracker

    bs = 4
    a = np.arange(100, 140)  # request "a"'s tokens
    other = np.arange(500, 540)

    def tokens(*rows):  # the input batch's host rows (padded) and the tokens known per row
        out = np.zeros((len(rows), 64), dtype=np.int32)
        for i, r in enumerate(rows):
            out[i, :len(r)] = r
        return out, [len(r) for r in rows]

    kv = DraftKVTracker()
    rows, known = tokens(a[:10], other[:20])
    kv.set_tokens(["a", "b"], rows, known, bs)
    assert kv.step(["a", "b"], [9, 16], drafting=True) == {}
    # Steps without drafting: "a" stale from 10, "b" from 17. "b"'s block [16, 20) is full
    # (21 tokens known): registered; "a"'s [8, 12) is not yet (11 known).
    rows, known = tokens(a[:11], other[:21])
    kv.set_tokens(["a", "b"], rows, known, bs)
    kv.step(["a", "b"], [10, 17], drafting=False)
    assert list(kv.holes.values()) == [17]
    rows, known = tokens(a[:12], other[:22])
    kv.set_tokens(["a", "b"], rows, known, bs)
    kv.step(["a", "b"], [11, 18], drafting=False)
    assert sorted(kv.holes.values()) == [10, 17]  # "a": block [8, 12) full, valid below 10
    # "a" resumed after preemption at 8 < 11 (its blocks hit again): its own draft KV is
    # valid below 10, and the hit on [0, 8) holds no hole: nothing to catch up (the rule
    # without the tokens reads it again from 0).
    rows, known = tokens(a[:12])
    kv.set_tokens(["a"], rows, known, bs)
    assert kv.owed(["a"], [8]) == {}
    kv.forget(["a"])  # finished stale: its blocks stay cached, its hole registered

    def first_seen(req_id, row, start):
        rows, known = tokens(row)
        kv.set_tokens([req_id], rows, known, bs)
        return kv.owed([req_id], [start])

    # A hit on 12 of "a"'s tokens: its draft KV is valid below 10 only.
    assert first_seen("c", np.concatenate([a[:12], other[:3]]), 12) == {"c": 2}
    # A hit on 8 of "a"'s tokens (below the hole) and one on tokens no stale request had.
    assert first_seen("d", np.concatenate([a[:8], other[:5]]), 8) == {}
    assert first_seen("e", np.concatenate([other[30:40], a[:5]]), 8) == {}
    # Without the step's tokens, and past max_holes: every hit read again from 0.
    blind = DraftKVTracker()
    blind.step(["x"], [5], drafting=False)
    assert blind.owed(["y"], [8]) == {"y": 8}
    small = DraftKVTracker(max_holes=0)
    rows, known = tokens(a[:12])
    small.set_tokens(["a"], rows, known, bs)
    small.step(["a"], [9], drafting=False)
    assert small.holes_overflow
    rows, known = tokens(np.concatenate([other[30:40], a[:5]]))
    small.set_tokens(["e"], rows, known, bs)
    assert small.owed(["e"], [8]) == {"e": 8}


def test_release_memory_hands_the_heaps_free_pages_back():
    """What the policy grid relies on between its sets of engines: memory freed inside the C
    heap goes back to the system, not only to the heap."""
    import ctypes

    from devtools.engine import release_memory

    if not hasattr(ctypes.CDLL(None), "malloc_trim"):
        pytest.skip("the C library has no malloc_trim (not glibc)")

    def rss_mb() -> float:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024

    # Chunks below malloc's mmap threshold come from the heap; keeping every 16th pins it, so
    # freeing the others leaves ~240 MB free inside the heap, which free() does not return.
    chunks = [bytearray(64 << 10) for _ in range(4096)]
    kept = chunks[::16]
    del chunks
    before = rss_mb()
    release_memory()
    after = rss_mb()
    assert len(kept) == 256
    assert before - after > 150, (before, after)


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
