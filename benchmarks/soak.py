"""Load and soak: the real OpenAI-compatible server with MTAD under many streaming clients.

    python -m benchmarks.soak                  # 64 clients for 5 minutes on the tiny pair
    python -m benchmarks.soak --duration 60    # shorter
    python -m benchmarks.soak --target DIR --draft DIR --dtype bfloat16 --kv-bytes 1e9

Starts ``vllm-mtad serve`` on 127.0.0.1 (loopback only) with MTAD and a KV cache small enough
that vLLM must preempt, then runs ``--clients`` concurrent streaming clients for ``--duration``
seconds (or until ``--max-requests`` have been sent). Each client sends a mix of requests to
``/v1/completions`` and ``/v1/chat/completions``: greedy "joint" and "exact", sampled with
different temperature / top-k / top-p, per-request τ, n=2, logprobs, stop strings and
structured outputs (choice and regex), every sampled one seeded. ``--cancel-fraction`` of them
(10 %) are cancelled mid-stream by closing the connection. Every 2 s it records the resident
memory of the server's processes and vLLM's gauges (running, waiting, preemptions).

Afterwards: the engine must have nothing running or waiting; every completed request is sent
again *alone* (one at a time, each from an empty prefix cache: the server runs with vLLM's dev
routes for ``/reset_prefix_cache``) and compared (text, finish reasons, token counts); the server
must still answer. A seeded request's output is the same in any batch, but a request vLLM preempts
resumes with a prefill that samples its next token from the target alone and then drafts from
there: its rounds start at other positions, so its sampled (and greedy "joint") output after
the preemption point differs from an unpreempted run — as vLLM's own speculative decoding's
seeded samples do (docs/usage.md#limits-in-detail; vLLM does not say which requests it preempted). The run
fails if a greedy "exact" request differs (its output is the target's greedy output whatever
happens), if any request differs without a preemption in the run, or if a differing request
gives two different outputs in two runs alone (it is then run a third time alone, and the
failure line says which of its runs agree and what vLLM's running/waiting gauges read after
each run alone). Reports (JSON for every raw figure, Markdown, PNG) go to
``benchmarks/results/`` (``--out`` elsewhere): requests sent / completed / cancelled / failed,
HTTP statuses, preemptions, the spec-decode counters, the requests that differ alone by kind,
and memory at the end of warm-up and at the end with the drift between them.
``tests/test_soak.py`` runs a short version of it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.lib.server import Server, free_port, read_metrics, running_server, serve_command

GAMMA, WIDTH, TAU = 4, 4, 0.5
# The soak server's environment: vLLM's dev routes, for /reset_prefix_cache before each run alone.
SERVER_ENV = {"VLLM_SERVER_DEV_MODE": "1"}


def server_spec(draft: str) -> dict:
    """The soak server's MTAD settings. "fixed": the soak replays requests alone and checks that
    two such runs agree; the adaptive policy (the default) chooses W and γ from timings, so a
    seeded request's output may change between two runs alone (README, the adaptive policy)."""
    return {"method": "mtad", "model": draft, "num_speculative_tokens": GAMMA,
            "beam_width": WIDTH, "acceptance_threshold": TAU, "speculation_policy": "fixed"}

STOP_STRINGS = ["e ", "\n"]
CHOICES = ["yes", "no", "maybe", "later"]
REGEX = r"[a-z]{2,6}-[0-9]{1,3}"
KINDS = ("greedy_joint", "greedy_exact", "sampled", "sampled_tau", "n2", "logprobs", "stop",
         "choice", "regex", "chat", "chat_logprobs")


# ---------------------------------------------------------------- the requests


def make_request(i: int, model: str, seed: int = 0) -> dict:
    """Request number ``i`` of the mix: (kind, path, body, cancel_after_chunks or None)."""
    rng = random.Random(seed * 1_000_003 + i)
    kind = KINDS[rng.randrange(len(KINDS))]
    prompt = [rng.randrange(10, 380) for _ in range(rng.randrange(16, 320))]
    body: dict = {"model": model, "max_tokens": rng.randrange(8, 128), "stream": True,
                  "stream_options": {"include_usage": True}}
    sampled = {"temperature": rng.choice([0.6, 1.0, 1.3]), "seed": rng.randrange(1 << 30),
               "top_p": rng.choice([1.0, 0.9, 0.7])}
    if rng.random() < 0.7:
        sampled["top_k"] = rng.choice([1, 5, 20, 50])
    path = "/v1/completions"
    if kind == "greedy_joint":
        body.update(prompt=prompt, temperature=0.0, ignore_eos=True)
    elif kind == "greedy_exact":
        body.update(prompt=prompt, temperature=0.0, ignore_eos=True,
                    vllm_xargs={"greedy_acceptance": "exact"})
    elif kind == "sampled":
        body.update(prompt=prompt, ignore_eos=rng.random() < 0.5, **sampled)
    elif kind == "sampled_tau":
        body.update(prompt=prompt, ignore_eos=True, **sampled,
                    vllm_xargs={"acceptance_threshold": rng.choice([0.05, 0.3, 0.9, 1.0])})
    elif kind == "n2":
        body.update(prompt=prompt, n=2, ignore_eos=True, **sampled)
    elif kind == "logprobs":
        body.update(prompt=prompt, logprobs=3, ignore_eos=True, **sampled)
    elif kind == "stop":
        body.update(prompt=prompt, stop=STOP_STRINGS, **sampled)
    elif kind in ("choice", "regex"):
        # A text prompt: after a prompt of random ids (invalid UTF-8 at its end) vLLM's
        # incremental detokenizer lets prompt bytes into the first output text, with or
        # without MTAD, which would hide whether the constraint held.
        body.update(prompt=" ".join(_words(rng)), max_tokens=16 if kind == "choice" else 24,
                    structured_outputs={"choice": CHOICES} if kind == "choice"
                    else {"regex": REGEX}, **sampled)
    else:  # chat, chat_logprobs: text messages through the tiny pair's chat template
        path = "/v1/chat/completions"
        body.update(messages=[{"role": "user", "content": " ".join(_words(rng))}], **sampled)
        if kind == "chat_logprobs":
            body.update(logprobs=True, top_logprobs=2)
    return {"i": i, "kind": kind, "path": path, "body": body}


def _words(rng: random.Random) -> list[str]:
    return [rng.choice(["split", "the", "list", "into", "parts", "return", "sum", "of", "each",
                        "row", "file", "path", "json", "value"])
            for _ in range(rng.randrange(3, 60))]


@dataclass
class Outcome:
    i: int
    kind: str
    status: int | None = None  # HTTP status; None: no response
    cancelled: bool = False
    done: bool = False  # the stream ended with [DONE]
    texts: dict = field(default_factory=dict)  # choice index -> text
    finish: dict = field(default_factory=dict)  # choice index -> finish_reason
    completion_tokens: int | None = None
    error: str | None = None
    seconds: float = 0.0
    engine_after: tuple | None = None  # replays: vLLM's (running, waiting) just after


async def _sse_lines(resp):
    """Lines of a server-sent-event stream split on newlines only (httpx's aiter_lines also
    splits on U+0085, U+2028 and the like, which JSON leaves unescaped in generated text)."""
    buf = b""
    async for data in resp.aiter_bytes():
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode()
    if buf:
        yield buf.decode()


async def send(client, base: str, req: dict, cancel_after: int | None) -> Outcome:
    """Stream one request; close the connection after ``cancel_after`` chunks if given."""
    out = Outcome(req["i"], req["kind"])
    t0 = time.perf_counter()
    chunks = 0
    try:
        async with client.stream("POST", base + req["path"], json=req["body"]) as resp:
            out.status = resp.status_code
            if resp.status_code != 200:
                out.error = (await resp.aread()).decode(errors="replace")[:500]
                return out
            async for line in _sse_lines(resp):
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    out.done = True
                    break
                chunk = json.loads(data)
                if chunk.get("error"):
                    out.error = json.dumps(chunk["error"])[:500]
                    break
                if chunk.get("usage"):
                    out.completion_tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices") or []:
                    idx = choice["index"]
                    piece = choice.get("text")
                    if piece is None:
                        piece = (choice.get("delta") or {}).get("content") or ""
                    out.texts[idx] = out.texts.get(idx, "") + piece
                    if choice.get("finish_reason"):
                        out.finish[idx] = choice["finish_reason"]
                chunks += 1
                if cancel_after is not None and chunks >= cancel_after:
                    out.cancelled = True
                    break  # leaving the block closes the connection: the server aborts
    except Exception as exc:  # noqa: BLE001 — every failure is recorded and counted
        out.error = f"{type(exc).__name__}: {exc}"[:500]
    out.seconds = time.perf_counter() - t0
    return out


def check_outcome(out: Outcome, req: dict) -> str | None:
    """What is wrong with a completed (not cancelled) request, or None."""
    body = req["body"]
    if out.status != 200 or out.error or not out.done:
        return f"status {out.status}, done={out.done}, error={out.error}"
    n = body.get("n", 1)
    if sorted(out.finish) != list(range(n)):
        return f"finish reasons for choices {sorted(out.finish)}, expected {n}"
    if req["kind"] == "choice" and any(out.texts.get(k) not in CHOICES for k in range(n)):
        return f"structured choice violated: {out.texts!r}"
    if req["kind"] == "regex" and any(out.finish[k] == "stop" and
                                      not re.fullmatch(REGEX, out.texts.get(k, ""))
                                      for k in range(n)):
        return f"structured regex violated: {out.texts!r}"
    return None


def signature(out: Outcome) -> tuple:
    return (tuple(sorted(out.texts.items())), tuple(sorted(out.finish.items())),
            out.completion_tokens)


# ---------------------------------------------------------------- the run


async def _load(server: Server, clients: int, duration: float, max_requests: int,
                cancel_fraction: float, seed: int, progress: bool):
    import httpx

    from tqdm import tqdm

    reqs: dict[int, dict] = {}
    outcomes: list[Outcome] = []
    samples: list[dict] = []
    counter = iter(range(max_requests))
    t_start = time.perf_counter()
    deadline = t_start + duration
    bar = tqdm(total=max_requests, desc="requests", unit="req", disable=not progress)

    async def client_loop(cid: int, client):
        rng = random.Random(seed * 7919 + cid)
        while time.perf_counter() < deadline:
            i = next(counter, None)
            if i is None:
                return
            req = make_request(i, server.model, seed)
            cancel = rng.randrange(1, 5) if rng.random() < cancel_fraction else None
            req["cancel_after"] = cancel
            reqs[i] = req
            outcomes.append(await send(client, server.base, req, cancel))
            bar.update(1)

    async def sampler(stop: asyncio.Event):
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            rss = await loop.run_in_executor(None, server.rss_bytes)
            try:
                m = await loop.run_in_executor(None, read_metrics, server.base)
            except Exception:  # noqa: BLE001 — a missed sample is not a failure
                m = {}
            samples.append({"t": time.perf_counter() - t_start, "rss": sum(rss.values()),
                            "rss_by_pid": rss,
                            "running": m.get("vllm:num_requests_running"),
                            "waiting": m.get("vllm:num_requests_waiting"),
                            "preemptions": m.get("vllm:num_preemptions_total")})
            try:
                await asyncio.wait_for(stop.wait(), timeout=2.0)
            except asyncio.TimeoutError:
                pass

    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    timeout = httpx.Timeout(600.0, connect=30.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        stop = asyncio.Event()
        sampling = asyncio.create_task(sampler(stop))
        await asyncio.gather(*(client_loop(c, client) for c in range(clients)))
        load_seconds = time.perf_counter() - t_start
        stop.set()
        await sampling
    bar.close()
    return reqs, outcomes, samples, load_seconds


async def _replay(server: Server, reqs: dict, outcomes: list[Outcome], progress: bool):
    """Each completed request again, alone: (outcome during the load, outcome alone)."""
    import httpx

    from tqdm import tqdm

    pairs = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        for out in tqdm(outcomes, desc="alone", unit="req", disable=not progress):
            # Every run alone starts from an empty prefix cache: a prefix cached under the load
            # (or by another replay) was computed in other batch shapes.
            r = await client.post(f"{server.base}/reset_prefix_cache")
            assert r.status_code == 200, (
                f"/reset_prefix_cache answered {r.status_code}: the soak server needs "
                f"{SERVER_ENV} (vLLM's dev routes)")
            alone = await send(client, server.base, reqs[out.i], None)
            # What vLLM's gauges said just after: a replay that was not alone shows here.
            m = await asyncio.get_running_loop().run_in_executor(None, read_metrics, server.base)
            alone.engine_after = (m.get("vllm:num_requests_running"),
                                  m.get("vllm:num_requests_waiting"))
            pairs.append((out, alone))
    return pairs


def _idle(base: str, timeout: float = 60.0) -> dict:
    """Wait until vLLM reports nothing running or waiting (aborted requests released)."""
    deadline = time.time() + timeout
    while True:
        m = read_metrics(base)
        if (m.get("vllm:num_requests_running") == 0
                and m.get("vllm:num_requests_waiting") == 0) or time.time() > deadline:
            return m  # a missing gauge (None) never counts as idle; failures() reports it
        time.sleep(0.5)


def memory_summary(samples: list[dict], warmup_s: float) -> dict:
    after = [s for s in samples if s["t"] >= warmup_s and s["rss"] > 0]
    if len(after) < 2:
        return {"warmup_s": warmup_s, "samples_after_warmup": len(after)}
    k = max(1, len(after) // 10)  # mean of the first and last tenth of the samples
    start = sum(s["rss"] for s in after[:k]) / k
    end = sum(s["rss"] for s in after[-k:]) / k
    return {"warmup_s": warmup_s, "samples_after_warmup": len(after),
            "rss_start_mib": start / 2**20, "rss_end_mib": end / 2**20,
            "rss_max_mib": max(s["rss"] for s in after) / 2**20,
            "rss_min_mib": min(s["rss"] for s in after) / 2**20,
            "drift_mib": (end - start) / 2**20, "drift_fraction": (end - start) / start}


def run_soak(server: Server, *, clients: int = 64, duration: float = 300.0,
             max_requests: int = 100_000, cancel_fraction: float = 0.1, seed: int = 0,
             replay: int | None = None, warmup_s: float | None = None,
             progress: bool = True) -> dict:
    """The load, the checks after it and the replay alone; returns every figure."""
    before = read_metrics(server.base)
    reqs, outcomes, samples, load_seconds = asyncio.run(
        _load(server, clients, duration, max_requests, cancel_fraction, seed, progress))
    after = _idle(server.base)

    cancelled = [o for o in outcomes if o.cancelled]
    completed = [o for o in outcomes if not o.cancelled]
    problems = {o.i: p for o in completed if (p := check_outcome(o, reqs[o.i]))}
    ok = [o for o in completed if o.i not in problems]
    to_replay = ok if replay is None else random.Random(seed).sample(ok, min(replay, len(ok)))
    pairs = asyncio.run(_replay(server, reqs, sorted(to_replay, key=lambda o: o.i), progress))
    mismatches = [{"i": a.i, "kind": a.kind, "request": reqs[a.i]["body"],
                   "under_load": asdict(a), "alone": asdict(b)}
                  for a, b in pairs if signature(a) != signature(b)]
    # The requests that differ, once more alone: alone, a request must give the same output
    # every time (else the difference is not preemption but state leaking between requests).
    again = asyncio.run(_replay(server, reqs, [a for a, b in pairs
                                               if signature(a) != signature(b)], False))
    first = {x.i: y for x, y in pairs}
    unstable = [a.i for (a, b) in again if signature(b) != signature(first[a.i])]
    # Each of those a third time alone, and every run of it kept: which runs agree, and
    # whether the engine was idle around them, say more than the fact that two differ.
    third = asyncio.run(_replay(server, reqs, [a for a, _ in again if a.i in unstable], False))
    second = {x.i: y for x, y in again}
    unstable_runs = [{"i": a.i, "kind": a.kind, "request": reqs[a.i]["body"],
                      "runs": {name: asdict(o) for name, o in
                               (("under_load", a), ("alone_1", first[a.i]),
                                ("alone_2", second[a.i]), ("alone_3", c))}}
                     for a, c in third]

    import requests

    alive = requests.get(f"{server.base}/health", timeout=30).status_code == 200
    final = requests.post(f"{server.base}/v1/completions", timeout=120, json={
        "model": server.model, "prompt": [11, 12, 13], "max_tokens": 4, "temperature": 0})
    alive = alive and final.status_code == 200
    end = read_metrics(server.base)

    def delta(key):
        return after.get(key, 0.0) - before.get(key, 0.0)

    statuses = _count(str(o.status) for o in outcomes)
    kinds = _count(o.kind for o in completed)
    warm = warmup_s if warmup_s is not None else min(60.0, 0.4 * load_seconds)
    return {
        "settings": {"clients": clients, "duration_s": duration, "max_requests": max_requests,
                     "cancel_fraction": cancel_fraction, "seed": seed, "replayed": len(pairs)},
        "load_seconds": load_seconds,
        "requests_sent": len(outcomes), "completed": len(completed),
        "cancelled": len(cancelled), "failed": len(problems), "problems": problems,
        "http_statuses": statuses, "completed_by_kind": kinds,
        "server_5xx": sum(v for k, v in statuses.items() if k.startswith("5")),
        "completion_tokens": sum(o.completion_tokens or 0 for o in completed),
        "preemptions": delta("vllm:num_preemptions_total"),
        "spec_decode": {k: delta(f"vllm:spec_decode_{k}_total")
                        for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")},
        "finished_by_reason": {k.split("[")[1][:-1]: delta(k) for k in after
                               if k.startswith("vllm:request_success_total[")},
        "after_load": {"running": after.get("vllm:num_requests_running"),
                       "waiting": after.get("vllm:num_requests_waiting"),
                       "kv_cache_usage": after.get("vllm:kv_cache_usage_perc")},
        "replay_mismatches": mismatches,
        "replay_mismatches_by_kind": _count(m["kind"] for m in mismatches),
        "differing_requests_unstable_alone": unstable,
        "unstable_alone_runs": unstable_runs,
        "replayed_by_kind": _count(a.kind for a, _ in pairs),
        "alive_after": alive,
        "memory": memory_summary(samples, warm),
        "samples": samples,
        "end_metrics": {k: v for k, v in end.items() if "spec_decode" in k or "preempt" in k},
    }


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return dict(sorted(out.items()))


def failures(result: dict, memory_bound: float) -> list[str]:
    """The soak's pass criteria, each a line saying what failed."""
    out = []
    if result["failed"] or result["server_5xx"]:
        out.append(f"{result['failed']} requests failed ({result['server_5xx']} 5xx): "
                   f"{list(result['problems'].items())[:3]}")
    by_kind = result["replay_mismatches_by_kind"]
    if by_kind.get("greedy_exact"):
        out.append(f"{by_kind['greedy_exact']} greedy 'exact' requests differ alone (their "
                   "output is the target's greedy output, whatever the batch or preemption)")
    if result["differing_requests_unstable_alone"]:
        out.append(f"requests {result['differing_requests_unstable_alone'][:5]} gave different "
                   "outputs in two runs alone: " + "; ".join(
                       _runs_line(r) for r in result.get("unstable_alone_runs", [])[:3]))
    if result["replay_mismatches"] and result["preemptions"] <= 0:
        out.append(f"{len(result['replay_mismatches'])} requests differ alone without any "
                   "preemption")
    if result["preemptions"] <= 0:
        out.append("no preemption: the KV cache was not small enough")
    if result["cancelled"] == 0:
        out.append("no request was cancelled")
    if result["after_load"]["running"] != 0 or result["after_load"]["waiting"] != 0:
        out.append(f"requests left in the engine after the load (or vLLM's gauges missing): "
                   f"{result['after_load']}")
    sd = result["spec_decode"]
    if not (sd["num_drafts"] > 0 and 0 <= sd["num_accepted_tokens"] <= sd["num_draft_tokens"]):
        out.append(f"spec-decode counters inconsistent: {sd}")
    if not result["alive_after"]:
        out.append("the server did not answer after the load")
    mem = result["memory"]
    if "drift_fraction" not in mem:
        out.append("too few memory samples after warm-up")
    elif mem["drift_fraction"] > memory_bound:
        out.append(f"resident memory grew {mem['drift_mib']:.0f} MiB "
                   f"({100 * mem['drift_fraction']:.1f} %) after warm-up, bound "
                   f"{100 * memory_bound:.0f} %")
    return out


def _runs_line(record: dict) -> str:
    """One unstable request: its kind, which of its runs agree (same letter: same output)
    and vLLM's (running, waiting) gauges just after each run alone."""
    runs = record["runs"]
    sigs: list = []
    letters = []
    for o in runs.values():
        sig = signature(Outcome(**o))
        if sig not in sigs:
            sigs.append(sig)
        letters.append("ABCD"[sigs.index(sig)])
    gauges = [tuple(o["engine_after"] or ()) for name, o in runs.items() if name != "under_load"]
    return (f"#{record['i']} {record['kind']}: under load/alone 1/2/3 = {'/'.join(letters)}, "
            f"tokens {[o['completion_tokens'] for o in runs.values()]}, engine (running, "
            f"waiting) after each alone run {gauges}")


# ---------------------------------------------------------------- the program


def _table(result: dict) -> str:
    mem = result["memory"]
    sd = result["spec_decode"]
    rows = [
        ("duration of the load", f"{result['load_seconds']:.0f} s, "
                                 f"{result['settings']['clients']} streaming clients"),
        ("requests sent / completed / cancelled / failed",
         f"{result['requests_sent']} / {result['completed']} / {result['cancelled']} / "
         f"{result['failed']}"),
        ("HTTP statuses", ", ".join(f"{k}: {v}" for k, v in sorted(result["http_statuses"].items()))),
        ("completion tokens (completed requests)", str(result["completion_tokens"])),
        ("preemptions (vLLM counter)", f"{result['preemptions']:.0f}"),
        ("spec decode: drafts / draft tokens / accepted",
         f"{sd['num_drafts']:.0f} / {sd['num_draft_tokens']:.0f} / {sd['num_accepted_tokens']:.0f}"),
        ("replayed alone / differing", f"{result['settings']['replayed']} / "
                                       f"{len(result['replay_mismatches'])}"),
        ("of those, different in two runs alone",
         str(len(result["differing_requests_unstable_alone"]))),
        ("differing, by kind (of replayed)", ", ".join(
            f"{k} {result['replay_mismatches_by_kind'].get(k, 0)}/{n}"
            for k, n in result["replayed_by_kind"].items())),
        ("running / waiting after the load", f"{result['after_load']['running']:.0f} / "
                                             f"{result['after_load']['waiting']:.0f}"),
        ("resident memory after warm-up → end (MiB)",
         f"{mem.get('rss_start_mib', float('nan')):.0f} → {mem.get('rss_end_mib', float('nan')):.0f}"
         f" (drift {mem.get('drift_mib', float('nan')):+.0f} MiB, "
         f"{100 * mem.get('drift_fraction', float('nan')):+.1f} %; warm-up {mem['warmup_s']:.0f} s)"),
        ("server alive after", str(result["alive_after"])),
    ]
    return "\n".join(["| figure | value |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows])


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["samples"]
    t = [x["t"] for x in s]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    ax1.plot(t, [x["rss"] / 2**20 for x in s])
    ax1.axvline(result["memory"]["warmup_s"], color="grey", ls="--", lw=0.8)
    ax1.set_ylabel("server RSS, MiB")
    ax1.set_title("Soak: resident memory and vLLM's gauges")
    ax2.plot(t, [x["running"] or 0 for x in s], label="running")
    ax2.plot(t, [x["waiting"] or 0 for x in s], label="waiting")
    pre = [x["preemptions"] or 0 for x in s]
    ax2.plot(t, [p - pre[0] for p in pre], label="preemptions (cumulative)")
    ax2.set_xlabel("seconds into the load")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", help="target model directory (default: the tiny pair)")
    parser.add_argument("--draft", help="draft model directory (with --target)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    parser.add_argument("--max-requests", type=int, default=100_000)
    parser.add_argument("--cancel-fraction", type=float, default=0.1)
    parser.add_argument("--replay", type=int, default=500,
                        help="replay this many completed requests alone, drawn at random "
                             "(default 500, ~2.5 min here; 0 for all)")
    parser.add_argument("--kv-bytes", type=float, default=16 * 2**20,
                        help="KV cache bytes: small, so that vLLM preempts (default 16 MiB)")
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--memory-bound", type=float, default=0.05,
                        help="largest allowed RSS growth after warm-up, as a fraction")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    from benchmarks.lib.report import environment, write_outputs

    if args.target:
        target, draft = args.target, args.draft
    else:
        from benchmarks.lib.models import build_tiny_pair
        from vllm_mtad import envs

        target, draft = map(str, build_tiny_pair(envs.cache_dir() / "tiny"))
    spec = server_spec(draft)
    port = free_port()
    out_dir = Path(args.out) if args.out else None
    log = (out_dir or Path(__file__).parent / "results") / "soak_server.log"
    cmd = serve_command(target, spec, port, dtype=args.dtype, max_num_seqs=args.max_num_seqs,
                        kv_bytes=int(args.kv_bytes))
    print("server:", " ".join(cmd), flush=True)
    with running_server(cmd, target, log, port, env_extra=SERVER_ENV) as server:
        result = run_soak(server, clients=args.clients, duration=args.duration,
                          max_requests=args.max_requests, cancel_fraction=args.cancel_fraction,
                          seed=args.seed, replay=args.replay or None)
    result["command"] = "python -m benchmarks.soak " + " ".join(argv or sys.argv[1:])
    result["server_command"] = cmd
    result["environment"] = environment()
    bad = failures(result, args.memory_bound)
    result["failures"] = bad
    table = _table(result)
    out = write_outputs("soak", result, table, out_dir)
    plot(result, out / "soak.png")
    print(table)
    print(f"\nwrote {out}/soak.json, soak.md, soak.png; server log {log}")
    for line in bad:
        print("FAIL:", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
