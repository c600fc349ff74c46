"""Tensor parallelism across two nodes (vLLM's multiprocessing executor, ``--nnodes 2``, node 1
``--headless``), run as docs/usage.md#across-nodes writes it, two processes on this machine;
and what a lost node, launcher or worker does to the requests (devtools/multinode.py), with
the watchdog that ends a worker its node has left behind (vllm_mtad/watchdog.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from devtools.multinode import (BOUND_S, complete, deployment, free_port, node_scripts,
                                recipe, run_fault)

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [[5, 6, 7, 8, 9], list(range(10, 50)), list(range(200, 262))]  # tests/tp_run.py's


def _cache_with(tiny_pair_dirs, tmp_path) -> dict:
    """VLLM_MTAD_CACHE_DIR holding this session's tiny pair where the recipe's
    ``devtools.tiny_models --env`` looks for it (so the nodes serve the pair the reference
    loads, and nothing is built while they start)."""
    pair = Path(tiny_pair_dirs[0]).parent
    (tmp_path / "cache" / "tiny").mkdir(parents=True)
    os.symlink(pair, tmp_path / "cache" / "tiny" / pair.name)
    return {"VLLM_MTAD_CACHE_DIR": str(tmp_path / "cache")}


def _policy_steps(base: str) -> dict[tuple[int, int], float]:
    import requests

    steps: dict[tuple[int, int], float] = {}
    for line in requests.get(f"{base}/metrics", timeout=30).text.splitlines():
        if line.startswith("vllm:mtad_policy_steps_total{"):
            width = int(line.split('beam_width="')[1].split('"')[0])
            gamma = int(line.split('num_speculative_tokens="')[1].split('"')[0])
            steps[(width, gamma)] = steps.get((width, gamma), 0) + float(line.rsplit(" ", 1)[1])
    return steps


@pytest.mark.system
def test_two_nodes_as_documented_equal_tp1_and_the_reference(tiny_pair_dirs, tiny_pair,
                                                             tmp_path):
    """Greedy (fixed policy, "joint"), seeded T=1 (fixed) and greedy "exact" (the engine's
    adaptive default) requests give TP=1's tokens and the reference's; W=4 beam steps and the
    adaptive policy's choices are on /metrics; MTAD runs in both nodes' workers."""
    from devtools import reference as ref
    from tests.tp_run import run
    from vllm_mtad.config import MTADConfig

    port = free_port()
    fixed = {"vllm_xargs": {"speculation_policy": "fixed"}}
    with deployment(node_scripts(port, free_port()), port, tmp_path / "logs",
                    env_extra=_cache_with(tiny_pair_dirs, tmp_path)) as dep:
        model = dep.model
        greedy = [complete(dep.base, model, p, 40, temperature=0.0, **fixed) for p in PROMPTS]
        sampled = [complete(dep.base, model, p, 40, temperature=1.0, top_k=10, seed=i, **fixed)
                   for i, p in enumerate(PROMPTS)]
        fixed_steps = _policy_steps(dep.base)
        exact = [complete(dep.base, model, p, 40, temperature=0.0,
                          vllm_xargs={"greedy_acceptance": "exact"}) for p in PROMPTS]
        for i in range(4):  # the adaptive default at T=1
            assert len(complete(dep.base, model, PROMPTS[1], 24, temperature=1.0,
                                seed=10 + i)) == 24
        time.sleep(2)  # the last steps' stats may reach /metrics after the reply
        steps = _policy_steps(dep.base)
        logs = [n.log.read_text() for n in dep.nodes]
    tp1 = run(tiny_pair_dirs[0], tiny_pair_dirs[1], 1, in_process=True)
    assert greedy == tp1["greedy"]
    assert sampled == tp1["sampled"]
    assert exact == tp1["exact"]
    cfg = MTADConfig(4, 4, 0.5)
    for prompt, tokens, exact_tokens in zip(PROMPTS, greedy, exact):
        assert tokens == ref.generate(*tiny_pair, prompt, 40, cfg,
                                      ref.Sampling(temperature=0.0)).token_ids
        assert exact_tokens == ref.greedy_decode(tiny_pair[0], prompt, 40)
    # The fixed requests ran W=4, γ=4 steps only; the adaptive ones chose within the bounds.
    assert set(fixed_steps) == {(4, 4)}, fixed_steps
    assert sum(steps.values()) > sum(fixed_steps.values())
    assert all(1 <= w <= 4 and 0 <= g <= 4 for w, g in steps), steps
    assert "'speculation_policy': 'adaptive'" in logs[0]
    for log in logs:  # each node's one worker runs MTAD, with the beams' draft-only blocks
        assert log.count("vllm-mtad: worker patches applied") == 1
        assert "hold the private tails of beams 1..3" in log
    assert "headless multiproc executor" in logs[1]


@pytest.mark.system
@pytest.mark.slow
@pytest.mark.parametrize("case", ["node1", "launcher", "worker", "node0"])
def test_a_lost_node_launcher_or_worker_ends_every_request_with_an_error(
        case, tiny_pair_dirs, tmp_path):
    """While greedy and T=1 (W=4 γ=4) requests stream, SIGKILL node 1 / node 1's launcher / one
    worker of a single-node TP=2 server / node 0: every request open at the kill ends with an
    error (vLLM's error event, or a cut connection when node 0 itself is gone) within BOUND_S,
    the API server exits, no process of either node is left, and the restarted deployment
    gives the seeded requests their tokens again. The bound measured here is ~6 s (launcher:
    the watchdog's 1 s check, then node 0's collective fails); BOUND_S (120 s) is what the test
    allows, so a slower machine does not fail it, and a hang does."""
    result = run_fault("mtad", case, tmp_path / "logs",
                       env_extra=_cache_with(tiny_pair_dirs, tmp_path))
    opened = result["requests_open_at_kill"]
    assert len(opened) == 4, opened
    want = {"cut"} if case == "node0" else {"error-event"}
    assert {r["outcome"] for r in opened} == want, opened
    assert all(r["end_s"] is not None and r["end_s"] < BOUND_S for r in opened), opened
    if case != "node0":
        assert "EngineCore encountered an issue" in opened[0]["detail"]
        assert any(status != "200" for _, status in result["health"]), result["health"]
    assert result["api_exit_s"] is not None and result["api_exit_s"] < BOUND_S
    assert result["left"] == [], result["left"]
    assert result["restart_same_tokens"]
    if case in ("launcher", "node0"):  # it is MTAD's watchdog that ended node 1's worker
        log = (tmp_path / "logs" / "first" / "node1.log").read_text()
        why = "its parent" if case == "launcher" else "node 0's rendezvous"
        assert f"vllm-mtad watchdog: ending this worker" in log and why in log


# ------------------------------------------------------------- the watchdog (no engine)

_CHILD = """
import sys, time
from vllm_mtad import watchdog
def report(reason):
    open(sys.argv[1], "w").write(reason)
watchdog.watch([watchdog.parent_check()], on_fail=report, interval_s=0.1)
time.sleep(30)
"""
_PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
print(child.pid, flush=True)
time.sleep(30)
"""


@pytest.mark.unit
def test_parent_check_fires_once_the_parent_is_gone(tmp_path):
    """A grandchild watches its parent; SIGKILL the parent: the check reports within a second
    (0.1 s checks; 5 s allowed for a loaded machine)."""
    out = tmp_path / "reason"
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, _CHILD, str(out)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    child_pid = int(parent.stdout.readline())
    try:
        time.sleep(1.0)
        assert not out.exists()  # the parent is alive: nothing reported
        parent.kill()
        parent.wait()
        deadline = time.time() + 5
        while not out.exists() and time.time() < deadline:
            time.sleep(0.05)
        assert f"its parent (pid {parent.pid}" in out.read_text()
    finally:
        parent.kill()
        try:
            os.kill(child_pid, 9)
        except ProcessLookupError:
            pass


@pytest.mark.unit
def test_port_check_counts_refusals_only_after_the_port_answered():
    from vllm_mtad.watchdog import port_check

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    check = port_check("127.0.0.1", port, misses=3, timeout_s=1)
    assert [check() for _ in range(4)] == [None] * 4  # not listening yet: node 0 may be starting
    listener.listen()
    assert check() is None
    listener.close()
    assert check() is None and check() is None  # two refusals: not yet
    assert "refused 3 connections in a row" in check()


@pytest.mark.unit
def test_the_watchdog_starts_only_in_an_mtad_engine_across_nodes(monkeypatch):
    from vllm_mtad import watchdog

    started = []
    monkeypatch.setattr(watchdog, "watch", lambda checks: started.append(len(checks)))

    def config(nnodes, node_rank, mtad=True):
        extra = {"mtad": {"num_speculative_tokens": 4, "beam_width": 4}} if mtad else {}
        return SimpleNamespace(additional_config=extra, parallel_config=SimpleNamespace(
            nnodes=nnodes, node_rank=node_rank, master_addr="127.0.0.1", master_port=1))

    watchdog.start_for(config(1, 0))
    watchdog.start_for(config(2, 1, mtad=False))
    assert started == []
    watchdog.start_for(config(2, 0))  # node 0: its parent only (node 0 hosts the rendezvous)
    watchdog.start_for(config(2, 1))  # node 1: its parent and node 0
    assert started == [1, 2]


@pytest.mark.unit
def test_the_recipe_has_one_block_per_node_with_the_same_engine_flags():
    """The two documented commands differ only in what must differ between nodes."""
    blocks = recipe()
    strip = [b.replace("--node-rank 0", "").replace("--node-rank 1", "")
             .replace("VLLM_CPU_OMP_THREADS_BIND=0", "").replace("VLLM_CPU_OMP_THREADS_BIND=1", "")
             .replace("--port 8000", "").replace("--headless", "")
             .replace("   # the same model paths on every node", "").split() for b in
             (blocks[0], blocks[1])]
    assert strip[0] == strip[1]
    assert "--headless" in blocks[1] and "--headless" not in blocks[0]


def _engine_args(block: str, target, draft) -> list[str]:
    """The engine flags of a recipe block (what follows ``vllm-mtad serve TARGET``, without the
    front end's ``--port`` and ``--headless``), the models' paths filled in."""
    import shlex

    text = block.split('vllm-mtad serve "$TARGET"', 1)[1].replace("\\\n", " ")
    args = shlex.split(text.replace("$DRAFT", str(draft)))
    args = [a for a in args if a != "--headless"]
    if "--port" in args:
        i = args.index("--port")
        del args[i:i + 2]
    return ["--model", str(target)] + args


@pytest.mark.unit
@pytest.mark.parametrize("layout, key", [
    ("--tensor-parallel-size 1 --pipeline-parallel-size 2", "pipeline_parallel_size"),
    ("--tensor-parallel-size 1 --data-parallel-size 2", "data_parallel_size")])
def test_the_recipe_across_nodes_refuses_pipeline_and_data_parallelism(layout, key,
                                                                       tiny_pair_dirs):
    """Node 1's documented command builds its engine config (no model loaded); with pipeline
    or data parallelism over the two nodes instead of tensor parallelism it stops at startup
    with MTAD's message naming the key (vllm_mtad/config.py: check_parallel)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    argv = _engine_args(recipe()[1], *tiny_pair_dirs)
    config = AsyncEngineArgs.from_cli_args(parser.parse_args(argv)).create_engine_config(
        headless=True)
    assert (config.parallel_config.nnodes, config.parallel_config.node_rank) == (2, 1)
    assert config.parallel_config.tensor_parallel_size == 2
    i = argv.index("--tensor-parallel-size")
    changed = argv[:i] + layout.split() + argv[i + 2:]
    with pytest.raises(ValueError, match=rf"MTAD does not support {key}=2"):
        AsyncEngineArgs.from_cli_args(parser.parse_args(changed)).create_engine_config(
            headless=True)


@pytest.mark.unit
def test_the_ray_executor_is_refused_on_cpu_naming_vllms_check_and_the_recipe(tiny_pair_dirs):
    """vLLM's CPU platform declares no Ray device, so vLLM's Ray executor would fail later
    ("current platform cpu does not support ray", vllm/v1/executor/ray_utils.py); MTAD refuses
    it while the config is built, saying so and naming the multiprocessing recipe."""
    from vllm.platforms import current_platform

    from tests.engine_utils import engine_config, mtad_spec

    assert current_platform.is_cpu() and current_platform.ray_device_key == ""
    with pytest.raises(ValueError) as err:
        engine_config(tiny_pair_dirs[0], mtad_spec(tiny_pair_dirs[1]),
                      distributed_executor_backend="ray")
    msg = str(err.value)
    assert "distributed_executor_backend='ray'" in msg and "ray_device_key" in msg
    assert "current platform cpu does not support ray." in msg
    assert "--nnodes" in msg and "docs/usage.md#across-nodes" in msg
