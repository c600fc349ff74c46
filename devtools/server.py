"""The real OpenAI-compatible server (``vllm-mtad serve``) in a subprocess, for the soak program
and the server tests: command line, environment, start/wait/stop, resident memory, metrics."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    base: str
    model: str
    log: Path

    def rss_bytes(self) -> dict[int, int]:
        """Resident memory of the server and every process under it, by pid."""
        import psutil

        try:
            root = psutil.Process(self.proc.pid)
            procs = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            return {}
        out = {}
        for p in procs:
            try:
                out[p.pid] = p.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return out


def serve_command(target: str, spec: dict | None, port: int, *, dtype: str = "float32",
                  max_model_len: int = 1024, max_num_seqs: int = 8, block_size: int = 32,
                  kv_bytes: int | None = None, extra: list[str] = ()) -> list[str]:
    cli = Path(sys.executable).with_name("vllm-mtad")
    cmd = [str(cli), "serve", str(target), "--host", "127.0.0.1", "--port", str(port),
           "--dtype", dtype, "--max-model-len", str(max_model_len), "--max-num-seqs",
           str(max_num_seqs), "--enforce-eager", "--block-size", str(block_size)]
    if spec is not None:  # None: the target alone
        cmd += ["--speculative-config", json.dumps(spec)]
    if kv_bytes is not None:
        cmd += ["--kv-cache-memory-bytes", str(kv_bytes)]
    return cmd + list(extra)


def serve_env(cmd: list[str] = ()) -> dict:
    env = dict(os.environ)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server runs vLLM's real layout
    if "--kv-cache-memory-bytes" not in cmd:
        # vLLM's CPU worker sizes the KV cache from this (default: a share of RAM); it would
        # also override --kv-cache-memory-bytes, hence only without that flag.
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    else:
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    return env


def wait_healthy(base: str, procs: list, startup_s: float) -> None:
    """Wait until ``base``/health answers 200; ``procs``: (name, Popen, log path) of the
    processes serving it, the first one's log quoted on a timeout. Raises RuntimeError with
    the log's end if one of them exits first or ``startup_s`` passes."""
    import requests

    deadline = time.time() + startup_s
    while True:
        for name, proc, log in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited ({proc.returncode}): "
                                   f"{log.read_text()[-3000:]}")
        try:
            if requests.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        if time.time() > deadline:
            raise RuntimeError(f"{procs[0][0]} not ready in {startup_s:.0f} s: "
                               f"{procs[0][2].read_text()[-3000:]}")
        time.sleep(1)


@contextmanager
def running_server(cmd: list[str], model: str, log: Path, port: int, startup_s: float = 300,
                   env_extra: dict | None = None, cwd: Path | None = None):
    """Start ``cmd`` (a ``vllm-mtad serve`` command line, or a shell running one) in its own
    process group, wait for /health, and stop the whole group after."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**serve_env(cmd), **(env_extra or {})}
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, [("server", proc, log)], startup_s)
        yield Server(proc, base, model, log)
    finally:
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:  # the group is gone already
        pass


def read_metrics(base: str) -> dict[str, float]:
    """vLLM's Prometheus counters and gauges summed over their labels (finished requests by
    reason are kept apart)."""
    import requests

    values: dict[str, float] = {}
    for line in requests.get(f"{base}/metrics", timeout=30).text.splitlines():
        if not line.startswith("vllm:") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        key = name.split("{")[0]
        if key == "vllm:request_success_total":
            reason = re.search(r'finished_reason="([^"]+)"', name)
            key += f"[{reason.group(1) if reason else '?'}]"
        try:
            values[key] = values.get(key, 0.0) + float(value)
        except ValueError:
            pass
    return values
