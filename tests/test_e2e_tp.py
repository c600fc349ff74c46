"""Tensor parallelism: MTAD with TP=2 on vLLM's multiprocessing executor.

Every rank drafts and verifies redundantly; any divergence between ranks (random streams,
beam choices) would corrupt the KV cache or hang. On this CPU machine vLLM needs the thread
binding given by hand (one NUMA node). vLLM's CPU platform refuses the Ray executor, so Ray is
not exercised here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tp_run import PROMPTS, run
from devtools import reference as ref
from vllm_mtad.config import MTADConfig

pytestmark = pytest.mark.system


POLICIES = ("fixed", "adaptive")


@pytest.fixture(scope="module")
def tp2_runs(tiny_pair_dirs):
    """{policy: result of tests.tp_run.run} for TP=2 under each policy: one engine per policy,
    one after the other in one fresh process (one interpreter and vLLM import for both)."""
    target_dir, draft_dir = tiny_pair_dirs
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "0|1"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    proc = subprocess.run([sys.executable, "-m", "tests.tp_run", str(target_dir),
                           str(draft_dir), "2", ",".join(POLICIES)], env=env,
                          capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).parent.parent)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == len(POLICIES), proc.stdout[-2000:] + proc.stderr[-4000:]
    return {p: json.loads(line.removeprefix("RESULT ")) for p, line in zip(POLICIES, lines)}


def test_tp2_equals_tp1_and_the_reference(tiny_pair_dirs, tiny_pair, tp2_runs):
    target_dir, draft_dir = tiny_pair_dirs
    tp2 = dict(tp2_runs["fixed"])
    tp1 = run(target_dir, draft_dir, 1, in_process=True)
    tp2.pop("chosen"), tp1.pop("chosen")
    assert tp2 == tp1
    cfg = MTADConfig(4, 4, 0.5)
    for prompt, tokens in zip(PROMPTS, tp2["greedy"]):
        assert tokens == ref.generate(*tiny_pair, prompt, 40, cfg,
                                      ref.Sampling(temperature=0.0)).token_ids


def test_tp2_adaptive_ranks_choose_alike(tiny_pair, tp2_runs):
    """Under the adaptive policy each rank times its own steps; the first rank's choice is
    broadcast, so both ranks draft the same shapes every step (else the engine would hang or
    corrupt). Exact greedy output stays the target's greedy decoding."""
    tp2 = tp2_runs["adaptive"]
    ranks = tp2["chosen"]
    assert len(ranks) == 2 and ranks[0] == ranks[1] and len(ranks[0]) > 1
    for prompt, tokens in zip(PROMPTS, tp2["exact"]):
        assert tokens == ref.greedy_decode(tiny_pair[0], prompt, 40)
    assert all(len(t) == 40 for t in tp2["sampled"])
