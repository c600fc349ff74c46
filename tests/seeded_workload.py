"""A fixed workload of seeded and greedy requests on the tiny pair, used to check that a rewrite
of MTAD's hot path leaves every token unchanged (tests/test_seeded_unchanged.py).

    python -m tests.seeded_workload OUT.json   # record the current code's tokens
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")

PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 50)), [100] * 3, list(range(200, 262))]
# (temperature, top_k, top_p): the paper's setting, no truncation, top-p alone, top-k alone,
# greedy (joint), and a low temperature.
SETTINGS = [(1.0, 10, 0.9), (1.0, 0, 1.0), (0.8, 0, 0.8), (1.0, 5, 1.0), (0.0, 0, 1.0),
            (0.5, 20, 0.95)]
NEW_TOKENS = 24


def requests(settings=None):
    """(prompt, params) for SETTINGS[i], i in ``settings`` (default: all), in a fixed order."""
    from vllm import SamplingParams

    out = []
    for i, (temp, top_k, top_p) in enumerate(SETTINGS):
        if settings is not None and i not in settings:
            continue
        for j, prompt in enumerate(PROMPTS):
            out.append((prompt, SamplingParams(max_tokens=NEW_TOKENS, temperature=temp,
                                               top_k=top_k, top_p=top_p, seed=100 * i + j,
                                               ignore_eos=True)))
    return out


def run(target_dir, draft_dir, batches=(None,), stats=None) -> list[list[list[int]]]:
    """Token ids of each batch; a batch is a collection of SETTINGS indices (None: all).
    ``stats``, a list, receives the drafter's counters after each batch (where it has them)."""
    from tests.engine_utils import close, generate_ids, make_llm, mtad_spec

    # Room for all 32 rows' beams (their tails take ~16 % of this KV budget; the default
    # beam_kv_fraction, 0.1, would leave the last rows one beam): the tokens were recorded so.
    llm = make_llm(target_dir, mtad_spec(draft_dir, 4, 4, 0.5, beam_kv_fraction=0.5),
                   max_num_seqs=32)
    out = []
    for settings in batches:
        reqs = requests(settings)
        out.append(generate_ids(llm, [p for p, _ in reqs], [s for _, s in reqs]))
        if stats is not None:
            from vllm_mtad.worker_rpc import drafter_stats

            stats.append(llm.collective_rpc(drafter_stats)[0])
    close(llm)
    return out


if __name__ == "__main__":
    import tempfile
    from pathlib import Path

    from devtools.tiny_models import build_tiny_pair

    with tempfile.TemporaryDirectory() as tmp:
        target, draft = build_tiny_pair(Path(tmp))
        tokens = run(target, draft)[0]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    Path(sys.argv[1]).write_text(json.dumps({"recorded_at_commit": commit,
                                             "settings": SETTINGS, "tokens": tokens}) + "\n")
    print(f"wrote {len(tokens)} sequences to {sys.argv[1]}")
