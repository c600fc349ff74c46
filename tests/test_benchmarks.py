"""The benchmark programs and the demo run end to end on the tiny pair and report sane figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).parent.parent


def run_module(args, tmp_path, timeout=600):
    env = {**os.environ, "VLLM_MTAD_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_compare_quick_on_tiny_pair(tmp_path):
    run_module(["benchmarks.compare", "--tiny", "--quick", "--humaneval", "2", "--chat", "1",
                "--max-tokens", "16", "--out", str(tmp_path / "out")], tmp_path)
    data = json.loads((tmp_path / "out" / "compare.json").read_text())
    rows = {(r["name"], r["temperature"]): r for r in data["rows"]}
    assert data["environment"]["vllm"].startswith("0.32")
    # Greedy speculative decoding is lossless: same tokens, same perplexity as the target.
    assert rows[("vLLM SD", 0.0)]["ppl_token_weighted"] == pytest.approx(
        rows[("target alone", 0.0)]["ppl_token_weighted"], rel=1e-6)
    for (name, _), r in rows.items():
        assert r["output_tokens"] == 16 * r["requests"]  # ignore_eos on the tiny pair
        if name.startswith(("MTAD", "vLLM SD")):
            assert 1 <= r["mean_acceptance_length"] <= 5
            assert len(r["acceptance_per_position"]) == 4
        assert r["humaneval_n"] == 2 and r["ppl_per_sample"] > 1
    assert (tmp_path / "out" / "compare.md").read_text().startswith("| method |")
    assert (tmp_path / "out" / "acceptance_by_method.png").stat().st_size > 1000


def test_draft_phase_quick(tmp_path):
    run_module(["benchmarks.draft_phase", "--quick", "--new-tokens", "16", "--out",
                str(tmp_path / "out")], tmp_path)
    data = json.loads((tmp_path / "out" / "draft_phase.json").read_text())
    by_width = {r["beam_width"]: r for r in data["rows"]}
    assert by_width[1]["copied_blocks_per_round"] == 0  # one beam: nothing to fork
    assert by_width[4]["copied_blocks_per_round"] > 0
    assert all(r["beam_step_ms"] > 0 and r["narrowed_rows"] == 0 for r in data["rows"])
    assert (tmp_path / "out" / "draft_phase.png").exists()


def test_demo_tiny(tmp_path):
    out = run_module(["vllm_mtad.demo", "--tiny", "--max-tokens", "16"], tmp_path)
    table = [line for line in out.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| method |") and len(table) == 4  # header + 3 methods
    mtad_row = table[-1].split("|")
    assert "MTAD" in mtad_row[1] and 1 <= float(mtad_row[4]) <= 5
