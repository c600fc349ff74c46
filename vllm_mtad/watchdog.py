"""Ends a multi-node worker that what it serves has left behind.

Across nodes (``--nnodes N``; docs/usage.md#across-nodes) a node other than node 0 runs
``vllm serve --headless``: a launcher process and its tensor-parallel workers, fed each step
over a socket from node 0. In vLLM 0.32 such a worker outlives what it serves (measured with
``python -m devtools.multinode faults``, benchmarks/reports/multinode-faults-cpu/):

- **its launcher killed**: the worker lives on with parent pid 1 and keeps serving. vLLM's death
  pipe sees the parent go (it logs "Parent process exited, terminating worker queues"), but
  the queue shutdown it calls wakes only a shared-memory reader, and a follower reads from a
  socket (``MessageQueue.shutdown`` in shm_broadcast.py);
- **node 0 gone** (stopped or crashed): the worker waits for the next step forever, and the
  launcher, which waits for its workers, never exits either.

Either way a process holding the model's memory is left that nothing supervises and that no new
deployment can use (a restarted node 0 waits for a rank that will never join). This watchdog
ends such a worker: a daemon thread checks every ``INTERVAL_S`` that the worker's parent is the
one that started it and, on a node other than node 0, that node 0's rendezvous port (the
``--master-addr``/``--master-port`` TCP store, hosted by node 0's first worker) still accepts a
connection; once either fails (the port: ``MISSES`` times in a row, after it has answered once),
it logs why and ends the worker (``os._exit``). Node 0 then sees the rank go (its collective fails) and ends
every open request with an error, as when the whole node is lost.

Started by patches/platform/patch_worker_base.py for MTAD engines with ``nnodes`` > 1 only:
vLLM's own engines keep vLLM's behaviour (the baseline the fault runs compare against).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any, Callable

INTERVAL_S = 1.0  # how often the checks run: a lost parent or node 0 is acted on within ~1-3 s
MISSES = 3  # refused connections in a row before node 0 counts as gone (not one dropped SYN)

Check = Callable[[], "str | None"]  # None: fine; else why the worker must end


def parent_check(parent_pid: int | None = None) -> Check:
    """Fails once this process's parent is no longer ``parent_pid`` (default: the current one):
    the parent died and the process was re-parented (to init or a subreaper)."""
    expected = os.getppid() if parent_pid is None else parent_pid

    def check() -> str | None:
        now = os.getppid()
        if now != expected:
            return f"its parent (pid {expected}, the node's launcher) exited (parent now {now})"
        return None

    return check


def port_check(host: str, port: int, misses: int = MISSES, timeout_s: float = 2.0) -> Check:
    """Fails after ``misses`` failed connections in a row to ``host:port``, counted only once a
    connection has succeeded (before that, node 0 may still be starting)."""
    state = {"seen": False, "failed": 0}

    def check() -> str | None:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                pass
            state["seen"], state["failed"] = True, 0
            return None
        except OSError as exc:
            if not state["seen"]:
                return None
            state["failed"] += 1
            if state["failed"] >= misses:
                return (f"node 0's rendezvous {host}:{port} refused {misses} connections in a "
                        f"row ({exc!r})")
            return None

    return check


def end_process(reason: str) -> None:
    """Log ``reason`` and exit at once. Not vLLM's graceful SIGTERM: once its death pipe has
    fired, the worker's SIGTERM handler does nothing (it has already set its shutdown flag),
    and the main thread sits in a socket read no shutdown wakes. A worker of a deployment
    that is gone has nothing to save; the multiprocessing resource tracker removes its
    shared-memory segments when it exits."""
    from vllm_mtad.log import get_logger

    get_logger(__name__).error(
        "vllm-mtad watchdog: ending this worker (pid %d): %s (docs/usage.md#across-nodes)",
        os.getpid(), reason)
    os._exit(1)


def watch(checks: list[Check], on_fail: Callable[[str], None] = end_process,
          interval_s: float = INTERVAL_S) -> threading.Thread:
    """Run ``checks`` every ``interval_s`` in a daemon thread; call ``on_fail`` with the first
    failure's reason, once, and stop."""
    def loop() -> None:
        while True:
            time.sleep(interval_s)
            for check in checks:
                reason = check()
                if reason is not None:
                    on_fail(reason)
                    return

    thread = threading.Thread(target=loop, name="MTADWatchdog", daemon=True)
    thread.start()
    return thread


def start_for(vllm_config: Any) -> threading.Thread | None:
    """Start the watchdog in a worker of an MTAD engine that spans nodes (else do nothing)."""
    from vllm_mtad.config import from_additional_config

    parallel = vllm_config.parallel_config
    if getattr(parallel, "nnodes", 1) <= 1 or from_additional_config(
            vllm_config.additional_config) is None:
        return None
    checks = [parent_check()]
    if parallel.node_rank > 0:
        checks.append(port_check(parallel.master_addr, parallel.master_port))
    return watch(checks)
