"""Tensor parallelism across two "nodes" on one machine, and what a lost node does to it.

The recipe is docs/usage.md#across-nodes: one ``vllm-mtad serve`` per node (node 0 serves the
API, node 1 runs ``--headless``), read from the docs and run as written, ports changed
(:func:`node_scripts`, :func:`deployment`). The fault program kills part of a deployment while
requests stream, and times what every client sees:

    python -m devtools.multinode faults --out DIR     # MTAD and vLLM's draft_model
    python -m devtools.multinode equality --target DIR --draft DIR --out DIR   # another pair

Faults (``--cases``): ``node1``, every process of node 1 at once (what a lost machine does to
the other's sockets); ``launcher``, node 1's ``vllm-mtad serve`` process alone (its worker
lives on, or not); ``worker``, one tensor-parallel worker of a single-node TP=2 server;
``node0``, every process of node 0 at once (does node 1 notice?); ``freeze``, node 1's
processes stopped (SIGSTOP: a machine that stops answering without closing its connections,
as a partitioned or hung one does), with VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=30 on both nodes
(vLLM's default is 300; the bound is that variable).
For each: the time from the kill to every open request's end and how it ended, what ``/health``
answers, whether the API server exits, which processes are left (and whether they burn CPU),
and whether a restarted deployment gives the same seeded requests the same tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "usage.md"
DOC_PORT, DOC_MASTER_PORT = "--port 8000", "--master-port 29501"
# The speculative config as the recipe writes it, and vLLM's own draft-model form of it.
MTAD_SPEC = r'\"method\": \"mtad\"'
DRAFT_MODEL_SPEC = r'\"method\": \"draft_model\"'
BEAMS = r', \"beam_width\": 4'


def recipe() -> dict[int, str]:
    """{node rank: its bash block} of docs/usage.md's "Across nodes" section."""
    text = DOC.read_text().split("\n## Across nodes\n", 1)[1].split("\n## ", 1)[0]
    blocks = {int(rank): block for rank, block in
              re.findall(r"\*\*Node (\d)\*\*.*?```bash\n(.*?)```", text, flags=re.S)}
    assert sorted(blocks) == [0, 1], f"docs/usage.md#across-nodes: node blocks {sorted(blocks)}"
    return blocks


def _swap(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"the recipe no longer holds {old!r} once"
    return text.replace(old, new)


def node_scripts(port: int, master_port: int, method: str = "mtad") -> dict[int, str]:
    """The recipe's node blocks with this run's ports; ``method="draft_model"``: vLLM's own
    speculative decoding with the same draft and γ (the baseline), else as written."""
    out = {}
    for rank, block in recipe().items():
        block = _swap(block, DOC_MASTER_PORT, f"--master-port {master_port}")
        if rank == 0:
            block = _swap(block, DOC_PORT, f"--port {port}")
        if method == "draft_model":
            block = _swap(_swap(block, MTAD_SPEC, DRAFT_MODEL_SPEC), BEAMS, "")
        out[rank] = block
    return out


def single_node_tp2_script(port: int, method: str = "mtad") -> str:
    """Node 0's block as one TP=2 server on this machine (both workers, threads "0|1")."""
    block = node_scripts(port, 0, method)[0]
    block = re.sub(r" --nnodes 2 --node-rank 0 --master-addr \S+ --master-port \d+", "", block)
    return _swap(block, "VLLM_CPU_OMP_THREADS_BIND=0 ", 'VLLM_CPU_OMP_THREADS_BIND="0|1" ')


def free_port() -> int:
    from devtools.server import free_port as free

    return free()


# ---------------------------------------------------------------- processes


@dataclass
class Node:
    """One node: a ``bash -c`` running its block, in a process group of its own. A process
    orphaned by its launcher keeps the group, so the group finds it."""
    rank: int
    proc: subprocess.Popen
    log: Path

    def processes(self) -> list:
        import psutil

        out = []
        for p in psutil.process_iter(["pid"]):
            try:
                if os.getpgid(p.pid) == self.proc.pid:
                    out.append(p)
            except (ProcessLookupError, psutil.Error):
                pass
        return out

    def launcher(self):
        """The ``vllm-mtad serve`` process (not a worker that multiprocessing spawned)."""
        found = [p for p in self.processes() if _cmd(p).count("vllm-mtad") and " serve " in _cmd(p)]
        assert len(found) == 1, [(_cmd(p), p.pid) for p in self.processes()]
        return found[0]

    def workers(self) -> list:
        """The tensor-parallel workers (vLLM retitles them "VLLM::Worker_TP<rank>")."""
        return [p for p in self.processes() if "Worker_" in _name(p) + _cmd(p)]

    def signal_all(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
            if sig in (signal.SIGTERM, signal.SIGINT):  # a stopped process acts on it once woken
                os.killpg(self.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def alive(self) -> list:
        """Its processes that have not ended (zombies awaiting their parent count as ended)."""
        return [p for p in self.processes() if _live(p)]

    def gone(self) -> bool:
        return not self.alive()


def _live(p) -> bool:
    import psutil

    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # it ended since it was listed
        return False


def _cmd(p) -> str:
    try:
        return " ".join(p.cmdline())
    except Exception:  # noqa: BLE001  (a process that ended meanwhile)
        return ""


def _name(p) -> str:
    try:
        return p.name()
    except Exception:  # noqa: BLE001
        return ""


def describe(p, sample_s: float = 1.0) -> dict:
    """A process's pid, parent, title and CPU use over ``sample_s`` (a spinning process: ~100)."""
    try:
        p.cpu_percent(None)
        time.sleep(sample_s)
        return {"pid": p.pid, "ppid": p.ppid(), "name": _name(p), "status": p.status(),
                "cpu_percent": p.cpu_percent(None), "cmd": _cmd(p)[:120]}
    except Exception as exc:  # noqa: BLE001  (it ended while sampled)
        return {"pid": p.pid, "ended_while_sampled": repr(exc)}


@dataclass
class Deployment:
    nodes: list[Node]
    base: str

    @property
    def model(self) -> str:
        import requests

        return requests.get(f"{self.base}/v1/models", timeout=30).json()["data"][0]["id"]

    def stop(self, grace_s: float = 30) -> None:
        for node in self.nodes:
            node.signal_all(signal.SIGTERM)
        deadline = time.time() + grace_s
        while time.time() < deadline and not all(n.gone() for n in self.nodes):
            time.sleep(0.5)
        for node in self.nodes:
            node.signal_all(signal.SIGKILL)
        for node in self.nodes:
            try:
                node.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.time() + 30
        while time.time() < deadline and not all(n.gone() for n in self.nodes):
            time.sleep(0.5)


@contextmanager
def deployment(scripts: dict[int, str], port: int, log_dir: Path, startup_s: float = 400,
               env_extra: dict | None = None):
    """Start every node's block (highest rank first), wait for node 0's /health, and stop every
    process of every node afterwards (SIGTERM, then SIGKILL after 30 s)."""
    from devtools.server import wait_healthy

    log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **(env_extra or {}))
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the real process layout
    nodes: list[Node] = []
    dep = Deployment(nodes, f"http://127.0.0.1:{port}")
    try:
        for rank in sorted(scripts, reverse=True):
            log = log_dir / f"node{rank}.log"
            with open(log, "w") as fh:
                proc = subprocess.Popen(["bash", "-c", scripts[rank]], stdout=fh,
                                        stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                        start_new_session=True)
            nodes.append(Node(rank, proc, log))
        nodes.sort(key=lambda n: n.rank)
        wait_healthy(dep.base, [(f"node {n.rank}", n.proc, n.log) for n in nodes], startup_s)
        yield dep
    finally:
        dep.stop()


# ---------------------------------------------------------------- requests


def complete(base: str, model: str, prompt: list[int], max_tokens: int, **body) -> list[int]:
    """One non-streamed completion's token ids."""
    import requests

    r = requests.post(f"{base}/v1/completions", timeout=300, json={
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
        "return_token_ids": True, **body})
    assert r.status_code == 200, (r.status_code, r.text[:500])
    return r.json()["choices"][0]["token_ids"]


def seeded_requests(method: str) -> list[dict]:
    """Requests whose output must not depend on the run: greedy, and T=1 with a seed (MTAD: the
    fixed policy, whose seeded output does not depend on timings)."""
    fixed = {"vllm_xargs": {"speculation_policy": "fixed"}} if method == "mtad" else {}
    prompts = [[5, 6, 7, 8, 9], list(range(10, 50))]
    out = []
    for i, prompt in enumerate(prompts):
        out.append({"prompt": prompt, "temperature": 0.0, **fixed})
        out.append({"prompt": prompt, "temperature": 1.0, "seed": i, **fixed, **_top_k(method)})
    return out


def _top_k(method: str) -> dict:
    """top-k 10 for MTAD's T=1 requests; none for vLLM's draft_model: its two-node engine died
    on the first T=1 top-k request (RuntimeError "max(): Expected reduction dim to be
    specified for input.numel() == 0" in apply_top_k_only, from the rejection sampler's
    apply_sampling_constraints; benchmarks/reports/multinode-faults-cpu/), and the faults are
    compared, not the sampling."""
    return {"top_k": 10} if method == "mtad" else {}


@dataclass
class Request:
    client: int
    start: float
    end: float | None = None
    outcome: str = "open"  # finished | error-event | cut | refused | open
    chunks: int = 0
    detail: str = ""


@dataclass
class Clients:
    """Streaming clients that send long requests one after another until one ends in an error
    (or ``stop`` is set): the requests of ``body(i)`` for client i."""
    base: str
    model: str
    bodies: list[dict]
    requests: list[Request] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    streaming: list[threading.Event] = field(default_factory=list)

    def start(self) -> list[threading.Thread]:
        self.streaming = [threading.Event() for _ in self.bodies]
        threads = [threading.Thread(target=self._loop, args=(i,), daemon=True)
                   for i in range(len(self.bodies))]
        for t in threads:
            t.start()
        return threads

    def _loop(self, i: int) -> None:
        while not self.stop.is_set():
            req = Request(i, time.monotonic())
            self.requests.append(req)
            self._one(i, req)
            req.end = time.monotonic()
            if req.outcome != "finished":
                return

    def _one(self, i: int, req: Request) -> None:
        import requests

        body = {"model": self.model, "max_tokens": 900, "min_tokens": 900,
                "ignore_eos": True, "stream": True, **self.bodies[i]}
        try:
            with requests.post(f"{self.base}/v1/completions", json=body, stream=True,
                               timeout=(10, 600)) as r:
                if r.status_code != 200:
                    req.outcome, req.detail = "refused", f"HTTP {r.status_code} {r.text[:200]}"
                    return
                for line in r.iter_lines():
                    if not line:
                        continue
                    if b'"error"' in line:
                        req.outcome, req.detail = "error-event", line.decode()[:300]
                        return
                    if line == b"data: [DONE]":
                        req.outcome = "finished"
                        return
                    req.chunks += 1
                    self.streaming[i].set()
            req.outcome, req.detail = "cut", "stream ended without [DONE]"
        except requests.RequestException as exc:
            req.outcome = "refused" if req.chunks == 0 else "cut"
            req.detail = repr(exc)[:300]


def stream_bodies(method: str) -> list[dict]:
    """Two greedy clients and two seeded T=1 clients (MTAD: the T=1 ones ask for the fixed
    policy, so the batch drafts W=4, γ=4 with beams whatever the adaptive policy would pick)."""
    fixed = {"vllm_xargs": {"speculation_policy": "fixed"}} if method == "mtad" else {}
    return [{"prompt": [5, 6, 7], "temperature": 0.0},
            {"prompt": list(range(20, 60)), "temperature": 0.0},
            {"prompt": [8, 9, 10], "temperature": 1.0, "seed": 1, **fixed, **_top_k(method)},
            {"prompt": list(range(60, 90)), "temperature": 1.0, "seed": 2, **fixed,
             **_top_k(method)}]


# ---------------------------------------------------------------- faults

BOUND_S = 120.0  # a request still open this long after the kill counts as hung
CASES = ("node1", "launcher", "worker", "node0")
METHODS = ("mtad", "draft_model")


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _kill(dep: Deployment, case: str) -> list[dict]:
    """SIGKILL what ``case`` names; the processes killed, described."""
    if case == "freeze":
        victims = dep.nodes[1].alive()
        dep.nodes[1].signal_all(signal.SIGSTOP)
        return [{"pid": p.pid, "name": _name(p), "signal": "SIGSTOP"} for p in victims]
    if case in ("node0", "node1"):
        node = dep.nodes[int(case[-1])]
        victims = node.alive()
        described = [{"pid": p.pid, "name": _name(p)} for p in victims]
        node.signal_all(signal.SIGKILL)
        return described
    if case == "launcher":
        victim = dep.nodes[1].launcher()
    else:
        workers = dep.nodes[0].workers()
        assert len(workers) == 2, [(_name(p), _cmd(p)) for p in dep.nodes[0].processes()]
        victim = next((p for p in workers if "TP1" in _name(p)), max(workers, key=lambda p: p.pid))
    described = [{"pid": victim.pid, "name": _name(victim)}]
    victim.send_signal(signal.SIGKILL)
    return described


def _watch_health(base: str, t0: float, stop: threading.Event, out: list) -> None:
    """Every 0.25 s: /health's status (or "no answer"), kept where it changes: [(s, status)]."""
    import requests

    while not stop.is_set():
        try:
            status = str(requests.get(f"{base}/health", timeout=2).status_code)
        except requests.RequestException:
            status = "no answer"
        if not out or out[-1][1] != status:
            out.append((round(time.monotonic() - t0, 2), status))
        time.sleep(0.25)


def _alive(dep: Deployment) -> list[dict]:
    return [describe(p) for node in dep.nodes for p in node.alive()]


def _ended(p) -> bool:
    import psutil

    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _after_kill(dep: Deployment, clients: Clients, t0: float, api) -> dict:
    """Wait (up to BOUND_S) for every request open at the kill to end, node 0's API server to
    exit and every node's processes to end; what the clients, /health and the processes did
    meanwhile. A deployment that keeps serving (healthy 45 s after the kill, every open request
    ended) is not waited for further."""
    health: list = []
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_health, args=(dep.base, t0, stop, health),
                               daemon=True)
    watcher.start()
    open_at_kill = [r for r in clients.requests if r.start < t0]
    api_exit, gone = None, {}
    while time.monotonic() < t0 + BOUND_S:
        now = round(time.monotonic() - t0, 2)
        if api_exit is None and _ended(api):
            api_exit = now
        for node in dep.nodes:
            if node.rank not in gone and node.gone():
                gone[node.rank] = now
        settled = all(r.end is not None for r in open_at_kill)
        if settled and len(gone) == len(dep.nodes):
            break
        if settled and api_exit is None and now > 45 and health and health[-1][1] == "200":
            break
        time.sleep(0.1)
    clients.stop.set()
    time.sleep(3)  # let the processes settle before they are listed
    stop.set()
    watcher.join()
    rel = lambda x: None if x is None else round(x - t0, 2)  # noqa: E731
    return {
        "requests_open_at_kill": [{"client": r.client, "outcome": r.outcome,
                                   "end_s": rel(r.end), "chunks": r.chunks,
                                   "detail": r.detail} for r in open_at_kill],
        "requests_after_kill": [{"client": r.client, "start_s": rel(r.start),
                                 "end_s": rel(r.end), "outcome": r.outcome,
                                 "detail": r.detail[:160]}
                                for r in clients.requests if r.start >= t0][:8],
        "health": health, "api_exit_s": api_exit,
        "nodes_gone_s": {str(k): v for k, v in sorted(gone.items())}, "left": _alive(dep)}


def _head_stop_probe(dep: Deployment) -> dict:
    """Stop node 0 as an operator would (SIGTERM to its processes); does node 1 follow?"""
    t0 = time.monotonic()
    dep.nodes[0].signal_all(signal.SIGTERM)
    while time.monotonic() < t0 + 30 and not dep.nodes[0].gone():
        time.sleep(0.2)
    node0_gone = round(time.monotonic() - t0, 2) if dep.nodes[0].gone() else None
    while time.monotonic() < t0 + 60 and not dep.nodes[1].gone():
        time.sleep(0.5)
    return {"node0_gone_s": node0_gone,
            "node1_gone_s": round(time.monotonic() - t0, 2) if dep.nodes[1].gone() else None,
            "node1_left_after_60s": [describe(p) for p in dep.nodes[1].alive()]}


def run_fault(method: str, case: str, log_dir: Path, env_extra: dict | None = None) -> dict:
    """One fault on a fresh deployment, then a restarted one (``env_extra``: for every node)."""
    port, master_port = free_port(), free_port()
    scripts = ({0: single_node_tp2_script(port, method)} if case == "worker"
               else node_scripts(port, master_port, method))
    seeded = seeded_requests(method)
    result: dict = {"method": method, "case": case}
    if case == "freeze":
        env_extra = {**(env_extra or {}), "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "30"}
        result["env"] = {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "30"}
    t_start = time.monotonic()
    with deployment(scripts, port, log_dir / "first", env_extra=env_extra) as dep:
        result["startup_s"] = round(time.monotonic() - t_start, 1)
        model = dep.model
        before = [complete(dep.base, model, r["prompt"], 32,
                           **{k: v for k, v in r.items() if k != "prompt"}) for r in seeded]
        clients = Clients(dep.base, model, stream_bodies(method))
        clients.start()
        for ev in clients.streaming:
            assert ev.wait(120), "a client's stream did not start"
        api = dep.nodes[0].launcher()
        t0 = time.monotonic()
        result["killed"] = _kill(dep, case)
        _log(f"{method} {case}: killed {result['killed']}")
        result.update(_after_kill(dep, clients, t0, api))
        if case == "launcher" and result["api_exit_s"] is None:
            result["head_stop_probe"] = _head_stop_probe(dep)
    result["left_after_stop"] = "every process of both nodes ended (SIGTERM/SIGKILL)"
    t_start = time.monotonic()
    with deployment(scripts, port, log_dir / "restart", env_extra=env_extra) as dep:
        result["restart_startup_s"] = round(time.monotonic() - t_start, 1)
        model = dep.model
        after = [complete(dep.base, model, r["prompt"], 32,
                          **{k: v for k, v in r.items() if k != "prompt"}) for r in seeded]
    result["restart_same_tokens"] = after == before
    result["seeded_tokens"] = before
    ends = [r["end_s"] for r in result["requests_open_at_kill"]]
    result["max_end_s"] = None if None in ends else max(ends)
    return result


def _summary_row(r: dict) -> str:
    outcomes = sorted({x["outcome"] for x in r["requests_open_at_kill"]})
    ends = [x["end_s"] for x in r["requests_open_at_kill"]]
    unhealthy = next((s for s, status in r["health"] if status != "200"), None)
    left = [f"{x.get('name')} ({x.get('cpu_percent')} % CPU, ppid {x.get('ppid')})"
            for x in r["left"]]
    gone = r.get("nodes_gone_s", {})
    node1 = "-" if r["case"] == "worker" else gone.get("1", "no")
    probe = r.get("head_stop_probe")
    if probe:
        node1 = f"no; after node 0 stopped: {probe['node1_gone_s'] or 'no'}"
    span = f"{min(ends)}–{max(ends)}" if ends and None not in ends else "hung"
    return (f"| {r['method']} | {r['case']} | {len(ends)} | {', '.join(outcomes)} | {span} | "
            f"{unhealthy if unhealthy is not None else 'stayed 200'} | "
            f"{r['api_exit_s'] if r['api_exit_s'] is not None else 'no'} | {node1} | "
            f"{'; '.join(left) or 'none'} | {r['restart_same_tokens']} |")


def faults_main(args) -> int:
    from devtools.engine import cpu_model_and_flags

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    import vllm

    record = {"command": " ".join(["python -m devtools.multinode"] + sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M"), "commit": commit,
              "vllm": vllm.__version__, **cpu_model_and_flags(), "bound_s": BOUND_S,
              "runs": []}
    previous = out / "multinode_faults.json"
    if args.append and previous.exists():  # runs of an earlier command, kept with its name
        earlier = json.loads(previous.read_text())
        record["earlier"] = earlier.get("earlier", []) + [
            {k: v for k, v in earlier.items() if k not in ("runs", "earlier")}]
        record["runs"] = earlier["runs"]
    for method in args.methods.split(","):
        for case in args.cases.split(","):
            _log(f"{method} {case}: starting")
            result = run_fault(method, case, out / "logs" / f"{method}-{case}")
            record["runs"].append(result)
            (out / "multinode_faults.json").write_text(json.dumps(record, indent=1))
            _log(f"{method} {case}: {_summary_row(result)}")
    header = ("| engine | fault | open requests | how they ended | kill → end (s) | "
              "/health not 200 after (s) | API server exited after (s) | node 1 ended after (s) | "
              "processes left 3 s later | restart: same tokens |\n"
              "|---|---|---|---|---|---|---|---|---|---|")
    table = header + "\n" + "\n".join(_summary_row(r) for r in record["runs"]) + "\n"
    (out / "multinode_faults.md").write_text(table)
    print(table)
    return 0


# ---------------------------------------------------------------- equality (any pair)


def pair_scripts(port: int, master_port: int, target: str, draft: str,
                 dtype: str = "float32") -> dict[int, str]:
    """The recipe's blocks for another pair (TARGET and DRAFT set instead of the tiny pair's
    build) and dtype: the same commands otherwise."""
    out = {}
    for rank, block in node_scripts(port, master_port).items():
        first, rest = block.split("\n", 1)
        assert "devtools.tiny_models --env" in first, first
        rest = _swap(rest, "--dtype float32", f"--dtype {dtype}")
        out[rank] = f"TARGET={target!s}\nDRAFT={draft!s}\n{rest}"
    return out


def equality_requests(prompts: list[list[int]], tokens: int) -> dict[str, list[dict]]:
    """{kind: one request body a prompt}: greedy "joint" and seeded T=1 (top-k 10) on the fixed
    policy, greedy "exact" on the engine's (adaptive) default."""
    fixed = {"vllm_xargs": {"speculation_policy": "fixed"}}
    return {
        "greedy": [{"prompt": p, "max_tokens": tokens, "temperature": 0.0, **fixed}
                   for p in prompts],
        "sampled": [{"prompt": p, "max_tokens": tokens, "temperature": 1.0, "top_k": 10,
                     "seed": i, **fixed} for i, p in enumerate(prompts)],
        "exact": [{"prompt": p, "max_tokens": tokens, "temperature": 0.0,
                   "vllm_xargs": {"greedy_acceptance": "exact"}} for p in prompts]}


def _tp1_tokens(target: str, draft: str, dtype: str, reqs: dict[str, list[dict]]) -> dict:
    """The same requests on one in-process TP=1 engine with the fixed policy (W=4, γ=4)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from devtools.engine import build_llm, close, mtad_spec

    llm = build_llm(target, mtad_spec(draft, 4, 4, 0.5), dtype=dtype, kv_cache_bytes=1 << 30)
    out = {}
    for kind, bodies in reqs.items():
        params = [SamplingParams(max_tokens=b["max_tokens"], temperature=b["temperature"],
                                 top_k=b.get("top_k", 0) or -1, seed=b.get("seed"),
                                 ignore_eos=True,
                                 extra_args=({"greedy_acceptance": "exact"} if kind == "exact"
                                             else None)) for b in bodies]
        gens = llm.generate([TokensPrompt(prompt_token_ids=b["prompt"]) for b in bodies],
                            params, use_tqdm=False)
        out[kind] = [list(g.outputs[0].token_ids) for g in gens]
    close(llm)
    return out


def equality_main(args) -> int:
    """Two nodes against TP=1 and, for greedy "exact", the plain-PyTorch reference."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from devtools import reference as ref

    tok = AutoTokenizer.from_pretrained(args.target)
    prompts = [tok(text)["input_ids"] for text in args.prompts.split("|")]
    reqs = equality_requests(prompts, args.tokens)
    port = free_port()
    t_start = time.monotonic()
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    with deployment(pair_scripts(port, free_port(), args.target, args.draft, args.dtype), port,
                    args.out / "logs", env_extra=env) as dep:
        startup = time.monotonic() - t_start
        model = dep.model
        two = {k: [complete(dep.base, model, b["prompt"], b["max_tokens"],
                            **{x: y for x, y in b.items() if x not in ("prompt", "max_tokens")})
                   for b in bodies] for k, bodies in reqs.items()}
    _log("two nodes done; TP=1 next")
    tp1 = _tp1_tokens(args.target, args.draft, args.dtype, reqs)
    _log("TP=1 done; the reference's greedy decoding next")
    dtype = {"float32": "float32", "bfloat16": "bfloat16"}[args.dtype]
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).eval()
    reference = [ref.greedy_decode(target, p, args.tokens) for p in prompts]
    result = {"target": args.target, "draft": args.draft, "dtype": args.dtype,
              "prompts": args.prompts.split("|"), "tokens": args.tokens,
              "startup_s": round(startup, 1), "two_nodes": two, "tp1": tp1,
              "reference_exact": reference,
              "equal": {k: two[k] == tp1[k] for k in two},
              "exact_equals_reference": two["exact"] == reference}
    (args.out / "equality.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("equal", "exact_equals_reference", "startup_s")}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    faults = sub.add_parser("faults", help="kill parts of a deployment while requests stream")
    faults.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "multinode")
    faults.add_argument("--methods", default=",".join(METHODS))
    faults.add_argument("--cases", default=",".join(CASES))
    faults.add_argument("--append", action="store_true",
                        help="keep the runs already in OUT/multinode_faults.json")
    equality = sub.add_parser("equality", help="two nodes against TP=1 and the reference")
    equality.add_argument("--target", required=True)
    equality.add_argument("--draft", required=True)
    equality.add_argument("--dtype", default="float32")
    equality.add_argument("--tokens", type=int, default=32)
    equality.add_argument("--prompts", default="def fibonacci(n):|Write a function that "
                          "reverses a string.|import numpy as np\n\ndef softmax(x):")
    equality.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.cmd == "equality":
        args.out.mkdir(parents=True, exist_ok=True)
        return equality_main(args)
    return faults_main(args)


if __name__ == "__main__":
    sys.exit(main())
