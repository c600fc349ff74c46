"""A short run of the load-and-soak program (benchmarks/soak.py) against the real server.

64 streaming clients with the program's mix of requests for about a minute, 10 % cancelled
mid-stream, a 16 MiB KV cache so that vLLM preempts. Every criterion of the program must hold:
no request lost or answered with an error, structured outputs respected, nothing left in the
engine, greedy "exact" requests identical alone and no more requests differing alone than vLLM
preempted, spec-decode counters consistent, the server alive after. The memory bound is looser
than the program's (15 % instead of 5 %) because the run is short: resident memory grows for
about the first minute of load (allocator warm-up) and is flat after it in the long run. (10 %
held on the faster machines; on a 2-core EPYC without AVX-512 the 45 s warm-up covers fewer
requests, and one run under the whole suite grew 13.5 % after it, where the same test alone
stayed within 10 %. The long run, ``python -m benchmarks.soak``, keeps 5 %.)
Under parallel workers it runs with no other test beside it (the ``alone`` marker,
tests/conftest.py).
"""

from __future__ import annotations

import pytest

from benchmarks import soak
from devtools.server import free_port, running_server, serve_command

pytestmark = [pytest.mark.system, pytest.mark.alone]


def test_short_soak(tiny_pair_dirs, tmp_path):
    target_dir, draft_dir = tiny_pair_dirs
    spec = soak.server_spec(str(draft_dir))
    port = free_port()
    cmd = serve_command(str(target_dir), spec, port, max_num_seqs=32, kv_bytes=16 << 20)
    with running_server(cmd, str(target_dir), tmp_path / "server.log", port,
                        env_extra=soak.SERVER_ENV) as server:
        result = soak.run_soak(server, clients=64, duration=70, replay=30, warmup_s=45,
                               progress=False)
    assert soak.failures(result, memory_bound=0.15) == []
    # How many requests finish in the 70 s is the machine's speed, not a criterion (CI's 2-core
    # machine finished 162 where this one had finished over 200): as many as there are clients
    # is enough for the checks above to have something to check.
    assert result["completed"] >= 64 and result["cancelled"] > 0
    assert result["preemptions"] > 0 and result["finished_by_reason"].get("length", 0) > 0
    assert set(result["completed_by_kind"]) == set(soak.KINDS)
