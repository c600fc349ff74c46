"""The benchmark programs and the demo run end to end on the tiny pair and report sane figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_mtad.version import series_of

ROOT = Path(__file__).parent.parent


def run_module(args, tmp_path, timeout=600, with_stderr=False):
    env = {**os.environ, "VLLM_MTAD_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return (proc.stdout, proc.stderr) if with_stderr else proc.stdout


@pytest.mark.system
def test_compare_quick_on_tiny_pair(tmp_path):
    run_module(["benchmarks.compare", "--tiny", "--quick", "--humaneval", "2", "--chat", "1",
                "--max-tokens", "16", "--out", str(tmp_path / "out")], tmp_path)
    data = json.loads((tmp_path / "out" / "compare.json").read_text())
    rows = {(r["name"], r["temperature"]): r for r in data["rows"]}
    assert series_of(data["environment"]["vllm"]) is not None  # a supported vLLM, recorded
    # Greedy speculative decoding is lossless: same tokens, same perplexity as the target.
    assert rows[("vLLM SD", 0.0)]["ppl_token_weighted"] == pytest.approx(
        rows[("target alone", 0.0)]["ppl_token_weighted"], rel=1e-6)
    for (name, _), r in rows.items():
        assert r["output_tokens"] == 16 * r["requests"]  # ignore_eos on the tiny pair
        if name.startswith(("MTAD", "vLLM SD")):
            assert 1 <= r["mean_acceptance_length"] <= 5
            assert len(r["acceptance_per_position"]) == 4
        assert r["humaneval_n"] == 2 and r["ppl_per_sample"] > 1
        # Phase timers are on by default in the benchmark, for every method.
        ph = r["phase_seconds"]
        assert ph["target_forward"] > 0 and ph["sampler"] > 0 and ph["step"] > 0
        assert sum(ph.values()) <= r["seconds"] * 1.05
        assert r["other_seconds"] == ph["step"]
        if name.startswith(("MTAD", "vLLM SD")):
            assert ph["draft_forward"] > 0 and r["draft_seconds"] >= ph["draft_forward"]
            assert 0 <= r["draft_vocab_share_of_drafting"] <= 1
        else:
            assert r["draft_seconds"] == 0 and r["draft_vocab_share_of_drafting"] is None
    md = (tmp_path / "out" / "compare.md").read_text()
    assert md.startswith("| method |") and "| draft vocab / drafting |" in md
    assert (tmp_path / "out" / "acceptance_by_method.png").stat().st_size > 1000


@pytest.mark.system
def test_draft_phase_quick(tmp_path):
    run_module(["benchmarks.draft_phase", "--quick", "--new-tokens", "16", "--out",
                str(tmp_path / "out")], tmp_path)
    data = json.loads((tmp_path / "out" / "draft_phase.json").read_text())
    by_width = {r["beam_width"]: r for r in data["rows"]}
    assert by_width[1]["copied_blocks_per_round"] == 0  # one beam: nothing to fork
    assert by_width[4]["copied_blocks_per_round"] > 0
    assert all(r["beam_step_ms"] > 0 and r["narrowed_rows"] == 0 for r in data["rows"])
    assert all(r["vocab_size"] == 151_936 for r in data["rows"])  # the real pair's
    assert all(r["draft_forward_ms_per_round"] > 0 and r["beam_kv_ms_per_round"] is not None
               for r in data["rows"])
    assert (tmp_path / "out" / "draft_phase.png").exists()


@pytest.mark.unit
def test_compare_speed_only_plan():
    # Importing the benchmark sets environment defaults (phase timers on): keep them out of
    # this test process.
    keys = ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_LOGGING_LEVEL", "VLLM_MTAD_PHASE_TIMERS")
    saved = {k: os.environ.get(k) for k in keys}
    try:
        from benchmarks.compare import plan_all
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    plan = plan_all("draft", quick=False, sweeps=False, speed_only=True)
    runs = [(m, r[0], r[1], r[2]) for m, _, rs in plan for r in rs]
    assert runs == [(m, m, 1.0, b) for m in ("target alone", "vLLM SD (probabilistic draft)",
                                              "MTAD") for b in (16, 1)]
    assert plan[1][1]["draft_sample_method"] == "probabilistic"
    assert plan[2][1]["beam_width"] == 4


@pytest.mark.system
def test_demo_tiny(tmp_path):
    """The demo prints its progress and one table; vLLM's own log goes to the file it names."""
    log = tmp_path / "demo-vllm.log"
    out, err = run_module(["devtools.demo", "--tiny", "--max-tokens", "16", "--log", str(log)],
                          tmp_path, with_stderr=True)
    table = [line for line in out.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| method |") and len(table) == 4  # header + 3 methods
    mtad_row = table[-1].split("|")
    # (The adaptive default may skip drafting for the whole run: no acceptance figure, "—".)
    assert "MTAD" in mtad_row[1] and (mtad_row[4].strip() == "—"
                                      or 1 <= float(mtad_row[4]) <= 5)
    assert f"vLLM's log: {log}" in out
    assert sum(line.startswith("[") and "done in" in line for line in out.splitlines()) == 3
    assert "vllm-mtad: MTAD enabled with" in log.read_text()  # vLLM's log is in the file...
    assert "MTAD enabled with" not in out + err  # ...and not on the terminal


@pytest.mark.system
def test_vocab_kernels_runs(tmp_path):
    """The kernel benchmark runs and reports every piece (its figures are for reading, not for
    asserting: speed is measured by the benchmark, not by a test)."""
    run_module(["benchmarks.vocab_kernels", "--batches", "1", "--repeats", "1", "--out",
                str(tmp_path / "out")], tmp_path)
    data = json.loads((tmp_path / "out" / "vocab_kernels.json").read_text())
    assert data["vocab_size"] == 151_936
    assert len(data["rows"]) == 6 and all(r["ms"] > 0 and r["rows"] == 4 for r in data["rows"])
    assert (tmp_path / "out" / "vocab_kernels.md").read_text().count("\n|") == 7


@pytest.mark.system
def test_policy_decision_runs(tmp_path):
    """The policy's decision-cost benchmark runs and reports a time per batch size."""
    run_module(["benchmarks.policy_decision", "--batches", "1", "16", "--seconds", "0.05",
                "--repeats", "2", "--out", str(tmp_path / "out")], tmp_path)
    data = json.loads((tmp_path / "out" / "policy_decision.json").read_text())
    assert [r["batch"] for r in data["rows"]] == [1, 16]
    assert all(0 < r["ms_min"] <= r["ms_median"] <= r["ms_max"] for r in data["rows"])
    assert data["environment"]["cpu_model"]


@pytest.mark.unit
def test_policy_sim_recovers_from_a_mismeasured_arm(tmp_path):
    """The simulated engine (benchmarks/policy_sim.py): fresh, the policy drafts within a few
    percent of the best arm; after the history that mismeasured four beams, it gets back to
    within 10 % by steps 601-1000 (at 4fcc0aa, whose counts aged by their own arm's drafts and
    whose exploration was a fixed cycle, it stayed at 0.87 in "free b1")."""
    run_module(["benchmarks.policy_sim", "--seeds", "2", "--out", str(tmp_path / "out")],
               tmp_path)
    rows = json.loads((tmp_path / "out" / "policy_sim.json").read_text())["rows"]
    late = {(r["scenario"], r["start"]): r["steps 601-1000"] for r in rows}
    assert len(late) == 6 and all(0 < v <= 1 for v in late.values())
    assert all(v > 0.95 for (_, start), v in late.items() if start == "fresh")
    assert late[("free b1", "history")] > 0.9


@pytest.mark.system
def test_kv_cost_beams_reserve_nothing_in_the_target_layers(tmp_path):
    """The issue's KV-cost workload on the tiny pair (24 MiB of KV, 32 sequences, 64 requests of
    96 + 64 tokens): MTAD's scheduler lookahead equals vLLM SD's; its draft-only scratch takes
    at most beam_kv_fraction (0.1) of the budget, holds the tails of the rows that fit in it
    and fits the budget with the pool; MTAD W=4 runs at least 0.9x as many requests at once as
    vLLM SD, on average (0.76x when the scratch held all 32 rows' tails, 0.66x before the
    beams' tails left the shared pool)."""
    out, err = run_module(["benchmarks.kv_cost", "--widths", "1,4", "--out",
                           str(tmp_path / "out")], tmp_path, with_stderr=True)
    data = json.loads((tmp_path / "out" / "kv_cost.json").read_text())
    rows = {r["name"]: r for r in data["rows"]}
    sd, w1, w4 = rows["vLLM SD"], rows["MTAD W=1"], rows["MTAD W=4"]
    budget = data["workload"]["kv_cache_bytes"]
    page = 7 * 2 * 2 * 32 * 4 * 32  # 7 layers x K,V x 2 heads x 32 dims x fp32 x 32 slots
    draft_page = 3 * page // 7
    assert w4["lookahead_slots"] == w1["lookahead_slots"] == sd["lookahead_slots"] == 4
    assert w1["draft_scratch_bytes"] == 0 and w1["pool_blocks"] == sd["pool_blocks"]
    row_bytes = 3 * 2 * draft_page  # (W−1) beams x 2 tail blocks
    assert w4["beam_rows"] == w4["draft_scratch_bytes"] // row_bytes == 8
    assert w4["draft_scratch_bytes"] <= 0.1 * budget < (w4["beam_rows"] + 1) * row_bytes
    assert w4["pool_blocks"] * page + w4["draft_scratch_bytes"] <= budget
    assert (w4["pool_blocks"] + 1) * page > 0.9 * budget  # the pool has the rest
    assert 0 < w4["narrowed_share"] < 1 and w1["narrowed_share"] == 0
    assert all(r["finished"] == 64 and r["output_tokens"] == 64 * 64 for r in rows.values())
    assert w4["peak_running"] >= 0.9 * sd["peak_running"]
    assert w4["mean_running"] >= 0.9 * sd["mean_running"]
    assert (tmp_path / "out" / "kv_cost.md").read_text().startswith("| engine |")
    # The one startup line says what the draft-only blocks hold (W=4 only: W=1 needs none).
    lines = [line for line in (out + err).splitlines() if "draft-only KV blocks" in line]
    assert len(lines) == 1 and "48 draft-only KV blocks (2.25 MiB)" in lines[0], lines
    assert "up to 8 requests of a batch" in lines[0], lines


@pytest.mark.system
@pytest.mark.slow
def test_policy_grid_on_tiny_pair(tmp_path):
    grid = ["benchmarks.policy_grid", "--tiny", "--batches", "1", "2", "--tokens", "12",
            "--repeats", "2", "--out", str(tmp_path / "out"), "--cells", "T=1", "T=1 SD greedy"]
    run_module(grid + ["--resume"], tmp_path)  # nothing to go on with yet: it starts
    first = json.loads((tmp_path / "out" / "policy_grid.json").read_text())
    # Fresh instances run batch by batch (every cell at batch 1 first); the tables by cell.
    ran = list(dict.fromkeys((r["cell"], r["batch"]) for r in first["runs"]))
    assert ran == [("T=1", 1), ("T=1 SD greedy", 1), ("T=1", 2), ("T=1 SD greedy", 2)]
    assert list(dict.fromkeys((c["cell"], c["batch"]) for c in first["cells"])) == sorted(ran)
    # Resumed with one more cell: the first invocation's runs are kept, only the new cell runs.
    run_module(grid + ["T=0 exact", "--resume"], tmp_path)
    data = json.loads((tmp_path / "out" / "policy_grid.json").read_text())
    assert data["runs"][:len(first["runs"])] == first["runs"]
    assert {r["cell"] for r in data["runs"][len(first["runs"]):]} == {"T=0 exact"}
    assert len(data["environment"]["invocations"]) == 2
    version = data["environment"]["code_version"]
    assert version == first["environment"]["code_version"] != "unknown"
    # Once whole, the same command runs nothing more (and builds no engine).
    out, err = run_module(grid + ["T=0 exact", "--resume"], tmp_path, with_stderr=True)
    assert "nothing left to run" in err and out.startswith("| cell |")
    assert json.loads((tmp_path / "out" / "policy_grid.json").read_text())["runs"] == data["runs"]
    assert data["environment"]["cpu_model"] and "cpu_flags" in data["environment"]
    cells = {(c["cell"], c["batch"], c["config"]): c for c in data["cells"]}
    # T=1 and T=0 exact: target, vLLM SD, MTAD fixed, adaptive (γ ≤ 4) and adaptive with γ ≤ 8;
    # "T=1 SD greedy": target, vLLM SD with greedy drafts, MTAD adaptive.
    assert len(cells) == 2 * 5 + 2 * 3 + 2 * 5
    for (cell, batch, config), c in cells.items():
        assert c["min"] <= c["tok_s"] <= c["max"]
        if config in ("mtad_fixed", "vllm_sd", "vllm_sd_greedy"):
            assert 1 <= c["acceptance"] <= 5
        if config == "mtad_adaptive_g8" and c["acceptance"] is not None:
            assert 1 <= c["acceptance"] <= 9
    # The γ bounds hold: adaptive drafts at most 4 tokens, adaptive_g8 at most 8.
    for (cell, batch, config), c in cells.items():
        for key in filter(None, c["chosen"].split(" ")):
            tokens = int(key.split("_g")[1].split(":")[0])
            assert tokens <= (8 if config == "mtad_adaptive_g8" else 4), (config, key)
    # Each run times at least --min-prompts (4) prompts, ``batch`` at a time.
    assert all(r["tokens"] == 12 * max(r["batch"], 4) for r in data["runs"])
    # What the adaptive policy believed at the end of each cell: four fitted cost lines and
    # the correction of the price of a step without a draft.
    for (cell, batch, config), c in cells.items():
        assert ("policy" in c) == (config == "mtad_adaptive")
        if "policy" in c:
            assert set(c["policy"]["policy_costs"]) == {"verify", "first_pass", "beam_step",
                                                        "rest", "no_draft"}
            assert c["policy"]["policy_steps"] > 0
    # The fixed configuration drafts (4, 4) every step; exact batches draft one beam.
    assert cells[("T=1", 2, "mtad_fixed")]["chosen"].startswith("W4_g4")
    assert cells[("T=0 exact", 2, "mtad_fixed")]["chosen"].startswith("W1_g4")
    # One engine per configuration for the whole invocation (--instances grid) runs alike.
    run_module(["benchmarks.policy_grid", "--tiny", "--batches", "1", "--tokens", "8",
                "--repeats", "2", "--cells", "T=1 SD greedy", "--instances", "grid",
                "--out", str(tmp_path / "grid")], tmp_path)
    once = json.loads((tmp_path / "grid" / "policy_grid.json").read_text())
    assert once["args"]["instances"] == "grid" and data["args"]["instances"] == "repeat"
    from benchmarks.policy_grid import run_order

    configs = ["target", "vllm_sd_greedy", "mtad_adaptive"]
    assert [(r["config"], r["repeat"]) for r in once["runs"]] == [
        (c, r) for r in range(2) for c in run_order(configs, r)]


@pytest.mark.system
@pytest.mark.slow
def test_step_phases_on_tiny_pair(tmp_path):
    run_module(["benchmarks.step_phases", "--tiny", "--tokens", "12", "--repeats", "2",
                "--out", str(tmp_path / "out")], tmp_path)
    data = json.loads((tmp_path / "out" / "step_phases.json").read_text())
    assert data["environment"]["cpu_model"] and data["built"] == ["vllm_sd", "mtad"]
    runs = data["runs"]
    assert len(runs) == 4 and all(r["tokens"] == 12 * 4 for r in runs)
    # At T=0 "exact" MTAD drafts vLLM's greedy chain with one beam: the same drafts, verified
    # by the same rule, so the same number of steps (the phases are compared per step).
    assert len({r["steps"] for r in runs}) == 1
    for r in runs:
        ms = r["ms_per_step"]
        assert (ms["beam_kv"] > 0) == (r["engine"] == "mtad")
        assert ms["target_forward"] > 0 and ms["draft_forward"] > 0
        assert ms["whole_step"] <= r["wall_ms_per_step"] * 1.01


@pytest.mark.system
def test_quality_grid_on_tiny_pair_resumes_and_reports(tmp_path):
    """benchmarks.quality end to end on three problems: records and perplexities per
    (configuration, problem), a rerun that adds nothing, the speed axis at two batch sizes
    (W=1 timed on the W=4 engine, forced), and the report with the adaptive policy's
    choices."""
    out = tmp_path / "out"
    only = ["target T=0.0", "MTAD T=1.0 τ=0.5", "MTAD W=1 T=1.0 τ=0.5",
            "MTAD adaptive T=1.0 τ=0.5", "vLLM SD T=0.0"]
    common = ["benchmarks.quality", "--tiny", "--problems", "3", "--sd-problems", "2",
              "--max-tokens", "12", "--chunk", "2", "--out", str(out), "--only", *only]
    run_module(common, tmp_path)
    records = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert sorted((r["config"], r["task_id"]) for r in records) == sorted(
        [(c, f"HumanEval/{i}") for c in only[:4] for i in range(3)]
        + [("vLLM SD T=0.0", f"HumanEval/{i}") for i in range(2)])
    scores = (out / "scores.jsonl").read_text().splitlines()
    assert len(scores) == sum(1 for r in records if r["token_ids"])
    # vLLM SD is lossless: at T=0 its tokens are the target's.
    by = {(r["config"], r["task_id"]): r["token_ids"] for r in records}
    assert all(by[("vLLM SD T=0.0", t)] == by[("target T=0.0", t)]
               for t in ("HumanEval/0", "HumanEval/1"))
    policy = [json.loads(x) for x in (out / "policy.jsonl").read_text().splitlines()]
    assert [p["run"] for p in policy] == ["quality"] and sum(policy[0]["chosen"].values()) > 0
    before = (out / "records.jsonl").read_text(), (out / "scores.jsonl").read_text()
    run_module(common, tmp_path)  # resumed: nothing left to do
    assert ((out / "records.jsonl").read_text(), (out / "scores.jsonl").read_text()) == before
    for batch in ("1", "2"):  # two prompts, one at a time, then both at once
        run_module([*common, "--speed", "--speed-prompts", "2", "--speed-batch", batch,
                    "--speed-tokens", "8", "--repeats", "1"], tmp_path)
    data = json.loads((out / "quality.json").read_text())
    rows = {r["config"]: r for r in data["rows"]}
    assert set(rows) == set(only)
    for name, row in rows.items():
        assert 0 <= row["pass@1 low"] <= row["pass@1"] <= row["pass@1 high"] <= 1
        assert row["ppl"] >= 1
        # The frontier's axis is the smallest batch; both batches are in the row.
        assert row["tok/s"] == row["tok/s b1"] > 0 and row["tok/s b2"] > 0
        assert row["tok/s b1 range"][0] <= row["tok/s b1"] <= row["tok/s b1 range"][1]
        assert ("Δ pass@1 vs target" in row) == (name == "vLLM SD T=0.0")  # only T=0 target
    # vLLM SD is lossless: the frontier gives it the target's quality at its temperature (all
    # problems), not its own pass@1 on --sd-problems.
    sd, target = rows["vLLM SD T=0.0"], rows["target T=0.0"]
    assert (sd["quality pass@1"], sd["quality ppl"]) == (target["pass@1"], target["ppl"])
    assert rows["MTAD T=1.0 τ=0.5"]["quality pass@1"] == rows["MTAD T=1.0 τ=0.5"]["pass@1"]
    assert set(data["adaptive_policy_steps"]) == {"quality", "speed"}
    assert data["environment"]["cpu_model"]


@pytest.mark.unit
def test_policy_grid_queue_depth_fits_the_prompts_humaneval_has():
    from benchmarks.policy_grid import HALF, prompts_per_run

    assert prompts_per_run(4, 3, 4) == 12  # queued batch 4: three batches
    assert prompts_per_run(16, 3, 4) == 48
    assert prompts_per_run(1, 3, 4) == 4  # at least --min-prompts
    assert prompts_per_run(32, 3, 4) == 64  # two batches are what HumanEval's half holds
    assert prompts_per_run(48, 3, 4) == 48  # one batch, all at once
    assert prompts_per_run(48, 1, 4) == 48  # closed
    assert all(prompts_per_run(b, 3, 4) <= HALF for b in range(1, HALF + 1))


@pytest.mark.unit
def test_policy_grid_resumes_only_the_same_code_settings_and_machine(tmp_path):
    import argparse

    from benchmarks.policy_grid import resumed

    def args(**kw):
        base = dict(out=str(tmp_path), tiny=False, batches=[1, 4], tokens=48, repeats=2,
                    min_prompts=4, arrivals="queued", queue_depth=3, gamma=4, long_gamma=8,
                    instances="repeat")
        return argparse.Namespace(**(base | kw))

    def error(message):
        raise SystemExit(message)

    env = {"code_version": "abc", "commit": "c1", "cpu_model": "EPYC", "cpu_flags": ["avx2"],
           "cpus": 2, "vllm": "0.32.0"}
    pair = {"target": "/t", "draft": "/d"}
    assert resumed(args(), env, pair, error) is None  # none yet: the grid starts
    saved = {"environment": env, "args": vars(args()), **pair, "cells": [{"cell": "T=1"}],
             "runs": []}
    (tmp_path / "policy_grid.json").write_text(json.dumps(saved))
    assert resumed(args(), env, pair, error)["cells"] == [{"cell": "T=1"}]
    assert resumed(args(), env | {"commit": "c2"}, pair, error)  # reports committed since
    with pytest.raises(SystemExit, match="code version abc .commit c1., this is abd"):
        resumed(args(), env | {"code_version": "abd"}, pair, error)
    with pytest.raises(SystemExit, match="cpu_model EPYC"):
        resumed(args(), env | {"cpu_model": "Xeon"}, pair, error)
    with pytest.raises(SystemExit, match="--tokens 48, not 32"):
        resumed(args(tokens=32), env, pair, error)
    with pytest.raises(SystemExit, match="--batches"):
        resumed(args(batches=[1, 4, 16]), env, pair, error)
    with pytest.raises(SystemExit, match="--instances repeat, not grid"):
        resumed(args(instances="grid"), env, pair, error)
    with pytest.raises(SystemExit, match="the draft /d, not /e"):
        resumed(args(), env, pair | {"draft": "/e"}, error)


@pytest.mark.unit
def test_grid_targets_judge_each_cell_by_the_targets_that_apply():
    from benchmarks.grid_targets import judge, pair_noise

    runs, cells = [], []

    def c(cell, batch, config, speeds, acceptance=None):
        """A configuration's repeats (tok/s) and its cell: the median, min and max."""
        runs.extend({"cell": cell, "batch": batch, "config": config, "tok_s": x}
                    for x in speeds)
        xs = sorted(speeds)
        cells.append({"cell": cell, "batch": batch, "config": config,
                      "tok_s": (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2, "min": xs[0],
                      "max": xs[-1], "acceptance": acceptance, "chosen": ""})

    c("T=1", 1, "target", [6.9, 7.1])
    c("T=1", 1, "vllm_sd", [8.0, 10.0])
    c("T=1", 1, "mtad_adaptive", [11.5, 12.5])
    c("T=1", 4, "target", [21.0, 23.0])
    c("T=1", 4, "vllm_sd", [14.0, 16.0])
    c("T=1", 4, "mtad_adaptive", [21.2, 21.8])  # 2 % below; ~6 % noise: within it
    c("T=1 SD greedy", 4, "target", [22.3, 23.3])
    c("T=1 SD greedy", 4, "vllm_sd_greedy", [15.1, 15.3])
    c("T=1 SD greedy", 4, "mtad_adaptive", [21.0, 21.2])  # 7.5 % below; 1.9 % noise: slower
    # Ranges disjoint, 0.9 % below, 1.5 % noise (grid-7e68367's T=1 batch 48): within it.
    c("T=1", 48, "target", [34.322, 34.325])
    c("T=1", 48, "vllm_sd", [18.51, 19.31])
    c("T=1", 48, "mtad_adaptive", [33.95, 34.07])
    c("T=1", 48, "mtad_adaptive_g8", [33.49, 34.26])
    c("T=0 exact", 1, "target", [6.7, 7.3])
    c("T=0 exact", 1, "vllm_sd", [9.9, 11.0], 4.09)
    c("T=0 exact", 1, "mtad_fixed", [10.8, 11.0], 4.09)
    c("T=0 exact", 1, "mtad_adaptive", [10.5, 11.1], 3.90)
    c("T=0 joint", 16, "target", [39.0, 41.0])
    c("T=0 joint", 16, "vllm_sd", [26.0, 28.0])
    c("T=0 joint", 16, "mtad_fixed", [23.0, 25.0])  # no adaptive: not judged
    c("T=0 joint", 1, "target", [7.0])  # one repeat each: no noise measured
    c("T=0 joint", 1, "vllm_sd", [10.0])
    c("T=0 joint", 1, "mtad_adaptive", [9.9])
    s, df = pair_noise(runs)[("T=1", 48)]
    assert df == 4 and abs(s - 0.01703) < 1e-4, (s, df)
    rows = {(r["cell"], r["batch"]): r for r in judge(cells, runs)}
    assert set(rows) == {("T=1", 1), ("T=1", 4), ("T=1 SD greedy", 4), ("T=1", 48),
                         ("T=0 exact", 1), ("T=0 joint", 1)}
    assert rows[("T=1", 1)]["checks"] == {"never slower": "met", ">= 1.3x SD": "met"}
    assert rows[("T=1", 1)]["best"] == "vllm_sd"
    assert rows[("T=1", 4)]["checks"]["never slower"] == "within noise"
    assert rows[("T=1", 4)]["ranges_overlap"]
    assert rows[("T=1 SD greedy", 4)]["checks"] == {"never slower": "NOT met",
                                                     ">= 1.3x SD": "met"}
    assert rows[("T=1", 48)]["checks"] == {"never slower": "within noise"}
    assert not rows[("T=1", 48)]["ranges_overlap"]
    exact = rows[("T=0 exact", 1)]
    assert exact["checks"] == {"never slower": "met", ">= SD": "met",
                               "chain acceptance >= SD's": "met"}
    assert exact["acceptance"] == {"adaptive": 3.90, "mtad_fixed": 4.09, "vllm_sd": 4.09}
    assert abs(exact["vs_sd"] - 10.8 / 10.45) < 1e-12
    assert rows[("T=0 joint", 1)]["checks"] == {"never slower": "NOT met",
                                                 ">= 1.1x SD": "NOT met"}


@pytest.mark.unit
def test_policy_grid_order_varies_what_each_configuration_follows():
    from benchmarks.policy_grid import run_order

    configs = ["target", "vllm_sd", "mtad_fixed", "mtad_adaptive", "mtad_adaptive_g8"]
    orders = [run_order(configs, r) for r in range(4)]
    assert all(sorted(o) == sorted(configs) for o in orders)
    runs = [c for o in orders for c in o]
    assert all(a != b for a, b in zip(runs, runs[1:]))  # none runs twice in a row
    for config in configs:  # in two repeats, two different predecessors (or first)
        before = {runs[i - 1] if i else None for i in range(10) if runs[i] == config}
        assert len(before) == 2, (config, before)


@pytest.mark.unit
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_repeats_process_ends_with_the_grids(tmp_path):
    """A grid stopped by hand (its process killed) must not leave its repeat's process behind,
    holding its engines and the cores: the child asks for SIGKILL when its parent ends."""
    import time

    pid_file = tmp_path / "child.pid"
    script = (
        "import multiprocessing, os, sys, time\n"
        "from benchmarks.policy_grid import _die_with_parent\n"
        "def child(parent, path):\n"
        "    _die_with_parent(parent)\n"
        "    open(path, 'w').write(str(os.getpid()))\n"
        "    time.sleep(120)\n"
        "if __name__ == '__main__':\n"
        "    p = multiprocessing.get_context('fork').Process(\n"
        "        target=child, args=(os.getpid(), sys.argv[1]))\n"
        "    p.start()\n"
        "    while not (os.path.exists(sys.argv[1]) and open(sys.argv[1]).read()):\n"
        "        time.sleep(0.05)\n"
        "    os._exit(0)  # as a killed parent ends: no clean-up of its children\n")
    subprocess.run([sys.executable, "-c", script, str(pid_file)], cwd=ROOT, timeout=60,
                   check=True)
    pid = int(pid_file.read_text())

    def alive() -> bool:
        try:
            with open(f"/proc/{pid}/status") as f:
                return not any(line.startswith("State:") and "Z" in line for line in f)
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 10
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(), f"the child {pid} outlived its parent"
