"""The step-cost model behind the GPU projection (benchmarks/lib/projection.py)."""

from __future__ import annotations

import pytest

from benchmarks.lib.projection import (fit_linear_costs, gpu_costs, linear_costs,
                                       step_seconds, tokens_per_second)

pytestmark = pytest.mark.unit


def test_step_is_one_target_pass_a_first_draft_pass_and_the_beam_steps():
    costs = linear_costs((1.0, 0.01), (0.2, 0.001))
    # B=4, W=2, γ=3: target over 16 tokens, draft first pass over 4 rows, 2 steps of 8 rows.
    assert step_seconds(costs, 4, 2, 3) == pytest.approx(1.16 + 0.204 + 2 * 0.208)
    assert step_seconds(costs, 4, 2, 0) == pytest.approx(1.04)  # the target alone
    assert tokens_per_second(costs, 4, 2, 3, 2.5) == pytest.approx(10 / 1.78)


def test_gpu_model_is_flat_up_to_its_bounds():
    gpu = gpu_costs(0.1, flat_tokens=512, free_rows=64)
    assert gpu.target(1) == gpu.target(512) == 1.0 and gpu.target(1024) == 2.0
    assert gpu.draft(1) == gpu.draft(64) == pytest.approx(0.1)
    assert gpu.draft(128) == pytest.approx(0.2)
    # Batch 1, γ=8: W=4 beams cost no more than one chain; the ratio is tokens per pass.
    assert step_seconds(gpu, 1, 4, 8) == step_seconds(gpu, 1, 1, 8) == pytest.approx(1.8)


def test_fit_recovers_the_lines_it_was_made_from():
    truth = linear_costs((0.30, 0.004), (0.05, 0.002))
    grid = [(b, w, g) for b in (1, 4) for w in (1, 4) for g in (4, 8)]
    fitted = fit_linear_costs([(b, w, g, step_seconds(truth, b, w, g)) for b, w, g in grid])
    for b, w, g in grid + [(16, 8, 8)]:
        assert step_seconds(fitted, b, w, g) == pytest.approx(step_seconds(truth, b, w, g))
    with pytest.raises(ValueError, match=">= 4 measured steps"):
        fit_linear_costs([(1, 1, 4, 1.0)] * 3)


def parts_for_tests():
    from benchmarks.lib.projection import MeasuredParts

    # target: 2 ms a pass of one token each, +0.1 ms per extra token each; draft 1 ms + 0.01 ms
    # a row (measured at 1, 4, 16, 64 rows); beam steps 0.2 ms at 4 rows, 0.4 at 64; MTAD's
    # acceptance 0.1 ms at batch 1, 0.3 at 16; FLy's 0.5 at every batch.
    return MeasuredParts(
        target={(b, t): 2.0 + 0.1 * (t - 1) for b in (1, 4, 16) for t in (1, 5, 9)},
        draft={r: 1.0 + 0.01 * r for r in (1, 4, 16, 64)},
        beam_step={g: {4: 0.2, 64: 0.4} for g in (4, 8)},
        acceptance={g: {1: 0.1, 16: 0.3} for g in (4, 8)},
        fly_acceptance={g: {1: 0.5, 16: 0.5} for g in (4, 8)})


def test_interpolation_is_piecewise_linear_and_extends_its_end_segments():
    from benchmarks.lib.projection import interpolate

    points = {1: 1.0, 4: 2.5, 16: 3.0}
    assert interpolate(points, 4) == 2.5 and interpolate(points, 2) == pytest.approx(1.5)
    assert interpolate(points, 10) == pytest.approx(2.75)
    assert interpolate(points, 28) == pytest.approx(3.5)  # past the last point
    assert interpolate(points, 0) == pytest.approx(0.5)  # before the first
    assert interpolate({3: 7.0}, 100) == 7.0


def test_measured_step_charges_every_rule_its_own_work_and_the_host():
    from benchmarks.lib.projection import Charges

    parts = parts_for_tests()
    bare = Charges(rule_work=False)
    # Forwards only, B=4, γ=4: target over 4 × 5 tokens, then 4 draft forwards of 4 rows; MTAD
    # W=4 the same, but 3 of its draft forwards over 16 rows.
    assert parts.step_ms(4, 1, 4, "vllm_sd", bare) == pytest.approx(2.4 + 4 * 1.04)
    assert parts.step_ms(4, 4, 4, "mtad", bare) == pytest.approx(2.4 + 1.04 + 3 * 1.16)
    # Its own work: a beam step over the first pass's 4 rows (0.2), 3 over 16 rows
    # (0.2 + 0.2 · 12/60) and its acceptance at batch 4 (0.1 + 0.2 · 3/15).
    mtad_work = 0.2 + 3 * 0.24 + 0.14
    assert parts.step_ms(4, 4, 4, "mtad") == pytest.approx(2.4 + 1.04 + 3 * 1.16 + mtad_work)
    # FLy and vLLM SD draw one chain: 4 beam steps over 4 rows; FLy's acceptance 0.5, vLLM
    # SD's (never timed) as MTAD's by default, as FLy's or free by choice.
    one_chain = 4 * 0.2
    assert parts.step_ms(4, 1, 4, "fly") == pytest.approx(2.4 + 4 * 1.04 + one_chain + 0.5)
    assert parts.step_ms(4, 1, 4, "vllm_sd") == pytest.approx(
        2.4 + 4 * 1.04 + one_chain + 0.14)
    assert parts.step_ms(4, 1, 4, "vllm_sd", Charges(sd_work="fly")) == pytest.approx(
        parts.step_ms(4, 1, 4, "fly"))
    assert parts.step_ms(4, 1, 4, "vllm_sd", Charges(sd_work="none")) == pytest.approx(
        parts.step_ms(4, 1, 4, "vllm_sd", bare))
    # The target alone: one pass, no rule's work; the host overhead adds to every step once.
    assert parts.step_ms(16, 1, 0, "target") == parts.step_ms(16, 1, 0, "target", bare) == 2.0
    host = {"target": 0.5, "vllm_sd": 1.0, "fly": 1.5, "mtad_w1": 2.0, "mtad_w4": 3.5}
    for rule, w, g, h in (("target", 1, 0, 0.5), ("vllm_sd", 1, 4, 1.0), ("fly", 1, 8, 1.5),
                          ("mtad", 1, 4, 2.0), ("mtad", 4, 8, 3.5), ("mtad", 2, 4, 2.5)):
        assert parts.step_ms(4, w, g, rule, Charges(host=host)) == pytest.approx(
            parts.step_ms(4, w, g, rule) + h)
        assert parts.step_ms(4, w, g, rule, Charges(host=0.3)) == pytest.approx(
            parts.step_ms(4, w, g, rule) + 0.3)
    # The core eager (as the MTAD engine runs it today): MTAD and FLy pay the eager pieces,
    # vLLM SD keeps one chain's graph replays.
    eager = type(parts)(**{**parts.__dict__, "eager": {
        "beam": {g: {4: 2.0, 64: 2.0} for g in (4, 8)},
        "MTAD acceptance": {g: {1: 1.0, 16: 1.0} for g in (4, 8)},
        "FLy acceptance": {g: {1: 3.0, 16: 3.0} for g in (4, 8)}}})
    as_run = Charges(eager_core=True)
    assert eager.step_ms(4, 4, 4, "mtad", as_run) == pytest.approx(
        eager.step_ms(4, 4, 4, "mtad", bare) + 4 * 2.0 + 1.0)
    assert eager.step_ms(4, 1, 4, "fly", as_run) == pytest.approx(
        eager.step_ms(4, 1, 4, "fly", bare) + 4 * 2.0 + 3.0)
    assert eager.step_ms(4, 1, 4, "vllm_sd", as_run) == pytest.approx(
        parts.step_ms(4, 1, 4, "vllm_sd"))
    # The verification flat: priced as a one-token pass.
    assert parts.step_ms(4, 4, 8, "mtad", Charges(flat_verify=True)) == pytest.approx(
        parts.step_ms(4, 4, 8, "mtad") - 0.8)
    with pytest.raises(KeyError):  # a target pass never measured is not guessed
        parts.step_ms(2, 1, 4, "vllm_sd")
    with pytest.raises(KeyError, match="no host overhead"):
        parts.step_ms(4, 1, 4, "fly", Charges(host={"target": 1.0}))
    with pytest.raises(ValueError, match="sd_work"):
        Charges(sd_work="free")


def test_a_projected_step_is_priced_by_the_policys_formula():
    """The projection prices a step by vllm_mtad.policy.cost.step_price, the policy's own
    formula: replace that formula and the projection moves with it."""
    from unittest import mock

    import benchmarks.lib.projection as projection

    parts = parts_for_tests()
    with mock.patch.object(projection, "step_price", return_value=42.0) as priced:
        assert parts.step_ms(4, 4, 8, "mtad") == 42.0
    (prices, b, w, g), kw = priced.call_args
    assert (b, w, g, kw) == (4, 4, 8, {"first_pass_tokens": 4})
    assert prices.verify(4 * 9) == parts.target[(4, 9)]


def test_measured_projection_compares_at_the_same_gamma_and_batch():
    from benchmarks.lib.projection import Charges, measured_projection

    parts = parts_for_tests()
    tpp = {"vllm_sd_greedy g4 T0": 3.0, "fly g4 T0": 3.3, "mtad w4 g4 T0": 4.0,
           "mtad w4 g8 T0": 6.0}  # no SD at γ=8: no row
    rows = {r["config"]: r for r in measured_projection(tpp, parts, batches=(1, 4))}
    assert set(rows) == {"vllm_sd_greedy g4 T0", "fly g4 T0", "mtad w4 g4 T0"}
    assert rows["vllm_sd_greedy g4 T0"]["vs SD b4"] == 1.0
    sd_step, mtad_step = parts.step_ms(4, 1, 4, "vllm_sd"), parts.step_ms(4, 4, 4, "mtad")
    fly_step = parts.step_ms(1, 1, 4, "fly")
    assert rows["fly g4 T0"]["vs SD b1"] == pytest.approx(
        (3.3 / fly_step) / (3.0 / parts.step_ms(1, 1, 4, "vllm_sd")))
    assert rows["mtad w4 g4 T0"]["step ms b4"] == pytest.approx(mtad_step)
    assert rows["mtad w4 g4 T0"]["vs SD b4"] == pytest.approx((4.0 / mtad_step) / (3.0 / sd_step))
    assert rows["mtad w4 g4 T0"]["vs target b4"] == pytest.approx(4 * 4.0 / mtad_step / (4 / 2.0))
    # Forwards only: every rule without its sampling and acceptance; FLy's and SD's forwards
    # are the same, so FLy's ratio is its tokens per pass over SD's.
    bare = Charges(rule_work=False)
    assert rows["mtad w4 g4 T0"]["vs SD b4, forwards only"] == pytest.approx(
        (4.0 / parts.step_ms(4, 4, 4, "mtad", bare))
        / (3.0 / parts.step_ms(4, 1, 4, "vllm_sd", bare)))
    assert rows["fly g4 T0"]["vs SD b4, forwards only"] == pytest.approx(1.1)
    # A host overhead charged to every engine alike: the target alone pays it per token,
    # speculation per pass, so every rule gains on the target alone.
    hosted = {r["config"]: r for r in measured_projection(tpp, parts, (1,), Charges(host=1.0))}
    assert all(hosted[c]["vs target b1"] > rows[c]["vs target b1"] for c in rows)


def test_dropping_a_term_moves_the_projection_by_that_term():
    """Each term of a step, zeroed alone, changes the projected ratio by exactly its weight."""
    from benchmarks.lib.projection import Charges, measured_projection

    parts = parts_for_tests()
    tpp = {"vllm_sd_greedy g8 T0": 5.0, "mtad w4 g8 T0": 6.0}
    host = {"target": 0.5, "vllm_sd": 1.0, "fly": 1.5, "mtad_w1": 2.0, "mtad_w4": 3.5}

    def ratio(charges):
        r = {x["config"]: x for x in measured_projection(tpp, parts, (1,), charges)}
        return r["mtad w4 g8 T0"]["vs SD b1"]

    full = Charges(host=host)
    sd, mtad = parts.step_ms(1, 1, 8, "vllm_sd", full), parts.step_ms(1, 4, 8, "mtad", full)
    assert ratio(full) == pytest.approx((6.0 / mtad) / (5.0 / sd))
    # no host: each step loses its engine's overhead
    assert ratio(Charges()) == pytest.approx((6.0 / (mtad - 3.5)) / (5.0 / (sd - 1.0)))
    # no rule work: MTAD loses 8 beam steps and its acceptance, SD 8 one-chain draft steps
    # and its acceptance (as MTAD's)
    mtad_work = 0.2 - 0.2 * 3 / 60 + 7 * 0.2 + 0.1
    sd_work = 8 * (0.2 - 0.2 * 3 / 60) + 0.1
    assert ratio(Charges(host=host, rule_work=False)) == pytest.approx(
        (6.0 / (mtad - mtad_work)) / (5.0 / (sd - sd_work)))
    assert len({round(ratio(c), 9) for c in (full, Charges(),
                                             Charges(host=host, rule_work=False))}) == 3


def test_this_cpus_measured_steps_are_reproduced_and_need_every_term():
    """The policy's formula prices this CPU's measured steps (benchmarks.phases overhead on the
    tiny pair, the committed report) from their parts: with the forwards, the samplers and the
    host overhead it reproduces every engine's measured tok/s over the target alone; without
    the host overhead, or without the samplers, it misses every speculative engine's by what
    that term weighs."""
    import json
    from pathlib import Path

    from benchmarks.lib.projection import cpu_step_check

    root = Path(__file__).resolve().parent.parent / "benchmarks/reports/gpu-projection-deployed"
    for name in ("overhead_b1.json", "overhead_b4.json"):
        overhead = json.loads((root / name).read_text())
        full = cpu_step_check(overhead)
        assert len(full) == 5 * len({r["repeat"] for r in overhead["runs"]})
        assert all(c["predicted"] == pytest.approx(c["measured"], rel=1e-9) for c in full)
        by = {(r["repeat"], r["config"]): r for r in overhead["runs"]}
        for kw, term in (({"charges_host": False}, "host"),
                         ({"charges_vocab": False}, "vocab_work")):
            for c in cpu_step_check(overhead, **kw):
                run, alone = by[(c["repeat"], c["config"])], by[(c["repeat"], "target")]
                want = c["measured"] * (run["wall"] / (run["wall"] - run[term])) / (
                    alone["wall"] / (alone["wall"] - alone[term]))
                assert c["predicted"] == pytest.approx(want, rel=1e-9)
                if c["config"] != "target":  # each term weighs > 0.5 % of the ratio here
                    assert abs(c["predicted"] / c["measured"] - 1) > 0.005, (kw, c)


def test_deployed_shapes_are_carried_from_the_anchors_by_the_stated_scaling():
    from benchmarks.lib.projection import forward_fit, scaled_parts
    from benchmarks.lib.shapes import DEPLOYED, QWEN_CODER_0_5B, QWEN_CODER_1_5B

    # Two forwards made by 0.04 ms a layer and 0.25 ms a GB: the fit recovers both.
    anchors = [(28, 3e9, 28 * 0.04 + 3 * 0.25), (24, 1e9, 24 * 0.04 + 0.25)]
    assert forward_fit(anchors) == pytest.approx((0.04, 0.25))
    with pytest.raises(ValueError, match="proportional"):
        forward_fit([(10, 1e9, 1.0), (20, 2e9, 2.0)])
    parts = parts_for_tests()
    parts = type(parts)(target=parts.target, draft={1: 1.0, 4: 1.04, 64: 1.64},
                        beam_step=parts.beam_step, acceptance=parts.acceptance)
    same, fit = scaled_parts(parts, QWEN_CODER_1_5B, QWEN_CODER_0_5B, QWEN_CODER_1_5B,
                             QWEN_CODER_0_5B)
    assert same.target == pytest.approx(parts.target) and same.draft == pytest.approx(parts.draft)
    big, fit = scaled_parts(parts, QWEN_CODER_1_5B, QWEN_CODER_0_5B, *DEPLOYED["32B/0.5B"])
    assert fit["draft_over_target"] < 0.25 * parts.draft[1] / parts.target[(1, 1)]
    # every size keeps the anchor's own ratio to its one-token forward
    assert big.target[(16, 9)] / big.target[(1, 1)] == pytest.approx(
        parts.target[(16, 9)] / parts.target[(1, 1)])
    assert big.beam_step == parts.beam_step  # the core's pieces are kept


def test_measured_parts_average_the_core_pieces_at_the_same_rows():
    """W=4 × 64 and W=8 × 32 are both 256 rows: their beam steps are averaged, not one
    overwriting the other."""
    from benchmarks.lib.projection import MeasuredParts

    forwards = {"rows": [{"mode": "plain", "model": "draft", "batch": 1, "tokens_each": 1,
                          "ms": 1.0}]}
    core = {"rows": [
        {"piece": "beam step (sparse), step γ", "gamma": 8, "rows": 256, "batch": 64,
         "graph_us": 600.0},
        {"piece": "beam step (sparse), step γ", "gamma": 8, "rows": 256, "batch": 32,
         "graph_us": 700.0},
        {"piece": "MTAD acceptance", "gamma": 8, "rows": 256, "batch": 64, "graph_us": 500.0},
        {"piece": "best beam", "gamma": 8, "rows": 4, "batch": 1, "graph_us": 7.0},
        {"piece": "MTAD acceptance", "gamma": 4, "rows": 4, "batch": 1}]}  # no graph: skipped
    parts = MeasuredParts.from_reports(forwards, core)
    assert parts.beam_step == {8: {256: pytest.approx(0.65)}}
    assert parts.acceptance == {8: {64: pytest.approx(0.5)}}
    assert parts.draft == {1: 1.0} and parts.target == {}


def _profile(batch, gamma, own_ms, cell="T=1", width=1):
    """A benchmarks.phases step JSON: per repeat, (vLLM SD's, the MTAD engine's) own work in
    ms; the forwards drift (vLLM SD's 40 ms dearer), as on a real host, and must not count."""
    runs = []
    for repeat, (sd, mtad) in enumerate(own_ms):
        for engine, own, forwards in (("vllm_sd", sd, 340.0), ("mtad", mtad, 300.0)):
            runs.append(dict(engine=engine, repeat=repeat, ms_per_step=dict(
                target_forward=forwards / 3, draft_forward=2 * forwards / 3, sampler=own / 2,
                draft_vocab=own / 2, whole_step=forwards + own)))
    return dict(args=dict(cell=cell, batch=batch, gamma=gamma, width=width), runs=runs)


def test_sd_own_work_is_priced_per_full_vocabulary_row_from_paired_profiles():
    from benchmarks.lib.projection import sd_vocab_row_seconds, vocab_rows

    assert vocab_rows(1, 4) == 9 and vocab_rows(4, 8) == 68  # γ draft rows + γ+1 verified
    # batch 1, γ=4 (9 rows): 18 and 72 ms more than the MTAD engine -> 2 and 8 ms a row;
    # batch 4, γ=4 (36 rows): 36 ms more -> 1 ms a row. Median of the three pairs: 2 ms (the
    # mean would be 3.67).
    got = sd_vocab_row_seconds([_profile(1, 4, [(30.0, 12.0), (85.0, 13.0)]),
                                _profile(4, 4, [(50.0, 14.0)])])
    assert got["per_row_s"] == pytest.approx(0.002)
    assert got["range"] == pytest.approx([0.001, 0.008]) and len(got["pairs"]) == 3
    with pytest.raises(ValueError, match="T > 0, one-chain"):
        sd_vocab_row_seconds([_profile(1, 4, [(30.0, 12.0)], cell="T=0 joint")])
    for bad in (dict(width=4), dict(cell=None), dict(cell="T=0 exact")):
        with pytest.raises(ValueError, match="T > 0, one-chain"):
            sd_vocab_row_seconds([_profile(1, 4, [(30.0, 12.0)], **bad)])
    lone = _profile(1, 4, [(30.0, 12.0)])
    lone["runs"] = lone["runs"][:1]  # vLLM SD's run without its MTAD pair
    with pytest.raises(ValueError, match="same repeat"):
        sd_vocab_row_seconds([lone])
