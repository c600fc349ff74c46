"""MTAD under Ray: one MTAD engine per Ray actor on a local Ray cluster (vllm_mtad.ray_batch).

The same requests through two actors (each running half of them) and through one engine in
this process give the same tokens: seeded sampled requests and greedy ones. Also the
command line (JSONL in, JSONL out) against the same cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.engine import engine_kwargs
from tests.engine_utils import TINY_KV_BYTES_PER_TOKEN, close, generate_ids, make_llm, mtad_spec

pytestmark = pytest.mark.system

PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 50)), [100] * 3, list(range(200, 262)),
           list(range(60, 90)), [7] * 12]


def _params():
    out = []
    for i in range(len(PROMPTS)):
        if i % 3 == 0:
            out.append({"max_tokens": 24, "temperature": 0.0, "ignore_eos": True})
        else:
            out.append({"max_tokens": 24, "temperature": 1.0, "top_k": 10, "seed": 40 + i,
                        "ignore_eos": True,
                        "extra_args": {"acceptance_threshold": 0.3} if i % 3 == 2 else None})
    return out


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    yield ray
    ray.shutdown()


def test_two_actors_equal_one_engine(tiny_pair_dirs, ray_cluster):
    from vllm import SamplingParams

    from vllm_mtad.ray_batch import generate

    target_dir, draft_dir = tiny_pair_dirs
    kwargs = engine_kwargs(target_dir, mtad_spec(draft_dir),
                           kv_cache_bytes=16384 * TINY_KV_BYTES_PER_TOKEN)  # make_llm's
    outs = generate(PROMPTS, _params(), engine_kwargs=kwargs, num_engines=2)
    llm = make_llm(target_dir, mtad_spec(draft_dir))
    want = generate_ids(llm, PROMPTS, [SamplingParams(**p) for p in _params()])
    close(llm)
    assert [o["token_ids"] for o in outs] == want
    assert all(o["finish_reason"] == "length" for o in outs)


def test_command_line_jsonl(tiny_pair_dirs, ray_cluster, tmp_path):
    target_dir, draft_dir = tiny_pair_dirs
    rows = [{"prompt_token_ids": p, "sampling": s} for p, s in zip(PROMPTS[:3], _params())]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    address = ray_cluster.get_runtime_context().gcs_address
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_mtad.ray_batch", "--target", str(target_dir), "--draft",
         str(draft_dir), "--input", str(tmp_path / "in.jsonl"), "--output",
         str(tmp_path / "out.jsonl"), "--engines", "1", "--ray-address", address,
         "--dtype", "float32", "--max-model-len", "1024", "--max-num-seqs", "8",
         "--enforce-eager",
         "--kv-cache-memory-bytes", str(16384 * TINY_KV_BYTES_PER_TOKEN)],
        env=env, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent.parent)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [o["index"] for o in out] == [0, 1, 2]
    assert all(len(o["token_ids"]) == 24 for o in out)
