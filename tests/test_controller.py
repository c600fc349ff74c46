"""The speculation policy's engine side (vllm_mtad.policy.controller): what it hands the
choice, how it times steps, forced plans."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.unit


def plan(spec, classes, scheduled_tokens, state=None, req_ids=(), starts=()):
    """A step's plan, as the drafter asks for it: the rows' classes, and their demand from
    ``state`` (a request state; None: rows without requests, as in vLLM's warm-up)."""
    from types import SimpleNamespace

    from vllm_mtad.policy import RowDemand

    def demand():
        if state is None:
            return RowDemand(list(classes), [], [], [])
        return state.demand(list(req_ids), list(starts), list(classes))

    return spec.plan(SimpleNamespace(classes=list(classes), fixed=False, req_ids=tuple(req_ids)),
                     scheduled_tokens, demand)


def test_the_policy_sees_each_rows_prompt_budget_and_catch_up(monkeypatch):
    """What the controller hands the policy from the runner's requests: the prompt tokens the
    draft reads per output token (a prefix-cache hit's cached part left out), and which part
    of a catch-up is an arrival's prompt (a request whose prompt this step still reads); the
    prompt of one that arrived in an earlier step without drafting is a debt."""
    from types import SimpleNamespace

    import torch

    from vllm_mtad.config import MTADConfig
    from vllm_mtad.policy import Plan, choice
    from vllm_mtad.policy.controller import SpeculationController
    from vllm_mtad.request_state import MTADRequestState

    seen = []
    monkeypatch.setattr(choice, "choose", lambda batch, *a, **k: seen.append(batch)
                        or Plan(1, 0))
    cfg = MTADConfig(num_speculative_tokens=4, speculation_policy="adaptive")
    spec = SpeculationController(cfg, torch.device("cpu"))

    def request(prompt, max_tokens, generated):
        return SimpleNamespace(num_prompt_tokens=prompt, output_token_ids=[0] * generated,
                               sampling_params=SimpleNamespace(max_tokens=max_tokens))

    requests = {"a": request(100, 50, 10), "b": request(40, 20, 0)}
    state = MTADRequestState(cfg, requests)
    # "a": its prompt read with drafting (the tracker sees every step, drafting or not), then
    # two steps without drafting; "b" not there yet.
    state.kv.step(["a"], [0], drafting=True)
    plan(spec, ["sampled"], 1, state, ["a"], [109])
    state.kv.step(["a"], [109], drafting=False)
    plan(spec, ["sampled"], 1, state, ["a"], [110])
    state.kv.step(["a"], [110], drafting=False)
    # "b" arrives with 8 of its 40 prompt tokens from the prefix cache; since steps skipped
    # drafting, the draft reads it from 0: 8 tokens caught up, 32 in the prefill chunk, all
    # of them priced as an arrival's prompt (its rate), none as a debt.
    plan(spec, ["sampled"] * 2, 1 + 32, state, ["a", "b"], [111, 8])
    batch = seen[-1]
    assert batch.prompt_per_token == pytest.approx((100 / 50 + 40 / 20) / 2)
    assert batch.catch_up_tokens == (111 - 109) + 8 and batch.catch_up_arrival_tokens == 8
    assert batch.remaining_tokens == (40 + 20) / 2
    state.kv.step(["a", "b"], [111, 8], drafting=False)
    # Another step without drafting: "b" now owes its whole prompt and its first token, all
    # of it a debt (it arrived in a step that did not draft: no rate paid for its prompt).
    plan(spec, ["sampled"] * 2, 2, state, ["a", "b"], [112, 41])
    assert seen[-1].catch_up_tokens == (112 - 109) + 41
    assert seen[-1].catch_up_arrival_tokens == 0
    state.kv.step(["a", "b"], [112, 41], drafting=False)
    # "d" (a 100-token prompt) is read in chunks, its first 64 tokens in a step without
    # drafting: on its second chunk it is still arriving, and the 64 tokens it owes are its
    # prompt's (the rate's). "e", resumed after preemption with 120 tokens computed (its
    # 100-token prompt and 20 outputs), owes all of them as a debt.
    requests["d"], requests["e"] = request(100, 30, 0), request(100, 48, 20)
    plan(spec, ["sampled"] * 3, 2 + 64, state, ["a", "b", "d"], [113, 42, 0])
    state.kv.step(["a", "b", "d"], [113, 42, 0], drafting=False)
    plan(spec, ["sampled"] * 4, 3 + 36, state, ["a", "b", "d", "e"], [114, 43, 64, 120])
    assert seen[-1].catch_up_tokens == (114 - 109) + 43 + 64 + 120
    assert seen[-1].catch_up_arrival_tokens == 64
    # Without a step that skipped drafting, a prefix-cache hit's cached prompt is not read.
    fresh = SpeculationController(cfg, torch.device("cpu"))
    fresh_state = MTADRequestState(cfg, requests)
    plan(fresh, ["sampled"], 32, fresh_state, ["b"], [8])
    assert seen[-1].prompt_per_token == pytest.approx(32 / 20)
    # A request without a max_tokens (not one vLLM schedules for generation) prices no prompt.
    requests["c"] = request(40, None, 0)
    plan(fresh, ["sampled"], 40, fresh_state, ["c"], [0])
    assert seen[-1].prompt_per_token == 0.0


def test_speculation_controller_splits_a_steps_input_into_decode_and_prefill_tokens():
    """The verify sample of a step is sized (decode tokens, prefill tokens): one token a row
    plus the drafts it verifies, and the rest; the proposer's first-pass sample splits on the
    same count. Under forced plans the samples are fitted as they come, not held back."""
    import torch

    from vllm_mtad.config import MTADConfig
    from vllm_mtad.policy.controller import SpeculationController
    from vllm_mtad.worker_rpc import force_plans

    spec = SpeculationController(
        MTADConfig(num_speculative_tokens=4, speculation_policy="adaptive"), torch.device("cpu"))
    spec.on_step_start()
    spec.verifying(12)  # 4 rows verifying 3 drafts each, beside a 100-token prefill chunk
    plan(spec, ["sampled"] * 4, 4 + 12 + 100)
    assert spec.prefill_tokens == 100
    assert spec.costs.verify.samples == 1 and spec.costs.verify._seen == [16.0, 100.0]
    force_plans([(1, 2)])(type("W", (), {"model_runner": type("R", (), {
        "drafter": type("D", (), {"speculation": spec})})}))
    for _ in range(3):
        spec.on_step_start()
        spec.verifying(0)
        plan(spec, ["sampled"] * 4, 4)
        assert spec.prefill_tokens == 0 and not spec.timings._pending
    assert spec.costs.verify.samples == 4 and spec.costs.rest.samples == 0


def test_forced_plans_cycle_from_their_start_and_the_policys_step_count_goes_on():
    """force_plans restarts its own cycle, not the policy's step count: the exploration
    schedule (one step in explore_period) goes on across benchmark runs as in a server."""
    import torch

    from vllm_mtad.config import MTADConfig
    from vllm_mtad.policy.controller import SpeculationController
    from vllm_mtad.worker_rpc import force_plans

    spec = SpeculationController(
        MTADConfig(num_speculative_tokens=4, speculation_policy="adaptive"), torch.device("cpu"))
    worker = type("W", (), {"model_runner": type("R", (), {
        "drafter": type("D", (), {"speculation": spec})})})

    def plans(n):
        out = []
        for _ in range(n):
            spec.on_step_start()
            spec.verifying(0)
            p = plan(spec, ["sampled"] * 2, 2)
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
    from vllm_mtad.policy.controller import SpeculationController

    spec = SpeculationController(
        MTADConfig(num_speculative_tokens=4, speculation_policy="adaptive"), torch.device("cpu"))
    now = [0.0]
    spec.timings.clock.mark = lambda: now[0]

    def step(verified, prefill, seconds=None):
        spec.on_step_start()
        # The verify line the steps follow: 0.05 s + 10 ms a decode token + 2 ms a prefill one.
        now[0] += 0.05 + 0.01 * (4 + verified) + 0.002 * prefill if seconds is None else seconds
        spec.verifying(verified)
        plan(spec, ["sampled"] * 4, 4 + verified + prefill)

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


def test_the_stopwatch_laps_consecutive_parts_and_a_discarded_step_gives_none():
    """Each lap is a sample of the part that began where the previous one ended (the drafter's
    first pass, then its beam steps, count of them); a discarded step (a round drafted twice)
    adds no sample, lapped before or after; an inert clock (the fixed policy) none either."""
    import torch

    from vllm_mtad.policy.clock import StepTimings
    from vllm_mtad.policy.cost import CostModel

    costs = CostModel()
    timings = StepTimings(costs, torch.device("cpu"), enabled=True)
    now = [0.0]
    timings.clock.mark = lambda: now[0]
    with timings.stopwatch() as watch:
        now[0] = 0.3
        watch.lap(costs.first_pass, (4, 0))
        now[0] = 0.9
        watch.lap(costs.beam_step, 16, count=3)
    timings.resolve()
    assert costs.first_pass.samples == 1 and costs.first_pass.predict((4, 0)) == pytest.approx(0.3)
    assert costs.beam_step.samples == 1 and costs.beam_step.predict(16) == pytest.approx(0.2)
    with timings.stopwatch() as watch:
        watch.lap(costs.first_pass, (4, 0))
        watch.discard()
        watch.lap(costs.beam_step, 16)
    off = StepTimings(costs, torch.device("cpu"), enabled=False)
    with off.stopwatch() as watch:
        watch.lap(costs.first_pass, (4, 0))
    timings.resolve()
    off.resolve()
    assert costs.first_pass.samples == 1 and costs.beam_step.samples == 1


def test_a_drafting_arm_is_timed_whole_from_one_decision_to_the_next(monkeypatch):
    """#step-price-measured-per-arm: a decision drafting (W, γ) on a decode step opens a
    sample of that arm's ratio (measured / the lines' price), closed at the next decision if
    that step verified all of the drafts, read no prompt and kept its rows; the ratio then
    prices that arm, at that batch size, and no other."""
    import torch

    from vllm_mtad.config import MTADConfig
    from vllm_mtad.policy import Batch, Plan, choice
    from vllm_mtad.policy.controller import SpeculationController

    monkeypatch.setattr(choice, "choose", lambda batch, *a, **k: Plan(1, 4))
    spec = SpeculationController(
        MTADConfig(num_speculative_tokens=4, speculation_policy="adaptive"), torch.device("cpu"))
    monkeypatch.setattr(spec.costs, "line_time", lambda batch, w, g: 0.5)
    now = [0.0]
    spec.timings.clock.mark = lambda: now[0]

    def step(rows, verified, prefill=0, seconds=0.4):
        spec.on_step_start()
        now[0] += seconds
        spec.verifying(verified)
        plan(spec, ["sampled"] * rows, rows + verified + prefill)
        spec.timings.resolve()

    step(1, 0, prefill=30)  # the prompt's step: its decision opens no sample (a prefill chunk)
    step(1, 4)  # opens one (a decode step)...
    step(1, 4, seconds=0.4)  # ...closed here: 0.4 s where the lines said 0.5
    ratio = spec.costs.arm_ratio(1, 1, 4)
    assert ratio.samples == 1 and ratio.value == pytest.approx(0.8)
    step(1, 4, prefill=50, seconds=2.0)  # a prompt arrived in the step: no sample
    step(1, 2, seconds=2.0)  # not every draft verified (a row drafted fewer): none
    step(2, 8, seconds=2.0)  # another row joined: none
    assert ratio.samples == 1
    assert spec.snapshot()["policy_costs"]["arms"] == {"B1_W1_g4": [0.8, 1]}
    # The ratio prices its arm at its batch size only (0.5 x the lines' price at 0.4 / 0.5).
    monkeypatch.undo()
    costs = spec.costs
    one, two = Batch({"sampled": 1}), Batch({"sampled": 2})
    assert costs.step_time(one, 1, 4, 0.0) == pytest.approx(0.8 * costs.line_time(one, 1, 4))
    assert costs.step_time(one, 1, 3, 0.0) == pytest.approx(costs.line_time(one, 1, 3))
    assert costs.step_time(two, 1, 4, 0.0) == pytest.approx(costs.line_time(two, 1, 4))
