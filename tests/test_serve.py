"""The real OpenAI-compatible server (``vllm-mtad serve``, multi-process engine) with MTAD."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from devtools.server import free_port, running_server, serve_command, serve_env
from devtools import reference as ref
from vllm_mtad.config import MTADConfig

pytestmark = pytest.mark.system

GAMMA, WIDTH, TAU = 4, 4, 0.5


def _serve_cmd(target_dir, spec: dict, port: int) -> list[str]:
    return serve_command(str(target_dir), spec, port, max_num_seqs=8)


@pytest.fixture(scope="module")
def server(tiny_pair_dirs, tmp_path_factory):
    target_dir, draft_dir = tiny_pair_dirs
    port = free_port()
    # "fixed": the tests below compare greedy output with the reference and refuse a request
    # asking for "adaptive" (the README's quick start serves the default, adaptive).
    spec = {"method": "mtad", "model": str(draft_dir), "num_speculative_tokens": GAMMA,
            "beam_width": WIDTH, "acceptance_threshold": TAU, "speculation_policy": "fixed"}
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with running_server(_serve_cmd(target_dir, spec, port), str(target_dir), log, port) as srv:
        SERVER_PIDS["api"] = srv.proc.pid  # vllm-mtad serve runs vLLM's API server in-process
        yield srv.base, srv.model, log


SERVER_PIDS: dict[str, int] = {}


def _client(base):
    from openai import OpenAI

    return OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=120)


PROMPT_IDS = list(range(10, 50))


def test_completion_greedy_matches_reference_and_streams(server, tiny_pair):
    base, model, _ = server
    client = _client(base)
    resp = client.completions.create(model=model, prompt=PROMPT_IDS, max_tokens=32,
                                     temperature=0.0, extra_body={"ignore_eos": True,
                                                                  "return_token_ids": True})
    want = ref.generate(*tiny_pair, PROMPT_IDS, 32, MTADConfig(GAMMA, WIDTH, TAU),
                        ref.Sampling(temperature=0.0)).token_ids
    assert resp.choices[0].token_ids == want
    streamed = client.completions.create(model=model, prompt=PROMPT_IDS, max_tokens=32,
                                         temperature=0.0, stream=True,
                                         extra_body={"ignore_eos": True})
    chunks = [c.choices[0].text for c in streamed if c.choices]
    assert len(chunks) > 1 and "".join(chunks) == resp.choices[0].text


def test_chat_streaming_and_not(server):
    base, model, _ = server
    client = _client(base)
    messages = [{"role": "user", "content": "Split the string at the separator"}]
    resp = client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                          temperature=1.0, top_p=0.9, seed=3,
                                          extra_body={"ignore_eos": True})
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 24
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                            temperature=1.0, top_p=0.9, seed=3, stream=True,
                                            extra_body={"ignore_eos": True})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == resp.choices[0].message.content  # same seed, same output


def test_per_request_threshold_and_bad_requests_while_others_carry_on(server):
    import requests

    base, model, _ = server
    url = f"{base}/v1/completions"
    good_results = []

    def good(i):
        r = requests.post(url, json={"model": model, "prompt": PROMPT_IDS, "max_tokens": 24,
                                     "temperature": 1.0, "seed": i, "ignore_eos": True,
                                     "vllm_xargs": {"acceptance_threshold": 0.3}}, timeout=120)
        good_results.append((r.status_code, r.json()["usage"]["completion_tokens"]
                             if r.status_code == 200 else r.text))

    threads = [threading.Thread(target=good, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    bad = [
        ({"vllm_xargs": {"acceptance_threshold": 5}}, "acceptance_threshold"),
        ({"vllm_xargs": {"acceptance_threshold": 0}}, "acceptance_threshold"),
        ({"vllm_xargs": {"greedy_acceptance": "fast"}}, "greedy_acceptance"),
        ({"vllm_xargs": {"acceptnce_threshold": 0.3}}, "did you mean 'acceptance_threshold'"),
        ({"vllm_xargs": {"beam_width": 2}}, "'beam_width' is engine-wide"),
        ({"vllm_xargs": {"speculation_policy": "adaptive"}}, "'adaptive' needs an engine"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"temperature": -1.0}, "temperature"),
    ]
    for change, key in bad:
        body = {"model": model, "prompt": "Return a list", "max_tokens": 8, **change}
        r = requests.post(url, json=body, timeout=60)
        assert 400 <= r.status_code < 500 and key in r.text, (change, r.status_code, r.text)
    r = requests.post(url, data="{not json", headers={"Content-Type": "application/json"},
                      timeout=60)
    assert 400 <= r.status_code < 500
    r = requests.post(url, json={"model": "no-such-model", "prompt": "x"}, timeout=60)
    assert 400 <= r.status_code < 500
    for t in threads:
        t.join()
    assert good_results == [(200, 24)] * 6


def test_metrics_endpoint_reports_spec_decode(server):
    import requests

    base, model, _ = server
    requests.post(f"{base}/v1/completions", json={"model": model, "prompt": PROMPT_IDS,
                                                  "max_tokens": 16, "temperature": 0.0,
                                                  "ignore_eos": True}, timeout=120)
    text = requests.get(f"{base}/metrics", timeout=30).text
    values = {}
    for line in text.splitlines():
        if line.startswith("vllm:spec_decode_num_") and "_total{" in line:
            name = line.split("{")[0]
            values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    drafts = values["vllm:spec_decode_num_drafts_total"]
    assert drafts > 0
    assert values["vllm:spec_decode_num_draft_tokens_total"] == GAMMA * drafts
    accepted = values["vllm:spec_decode_num_accepted_tokens_total"]
    assert 0 <= accepted <= GAMMA * drafts
    assert values["vllm:spec_decode_num_accepted_tokens_per_pos_total"] == accepted


def _metric_totals(base, prefix: str) -> dict[str, float]:
    """Sums of the /metrics samples whose line starts with ``prefix``, by their full label set."""
    import requests

    values = {}
    for line in requests.get(f"{base}/metrics", timeout=30).text.splitlines():
        if line.startswith(prefix):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_metrics_endpoint_counts_the_policys_choices(server):
    """The (W, γ) of every step reaches /metrics through the worker's output, the scheduler's
    stats and the stat-logger plugin (vllm_mtad/metrics.py). One request alone on the fixed
    policy: every step drafts W=4, γ=4, and there is one step more than verified drafts (the
    draft after the prefill; the last step's draft is never verified) or as many."""
    import requests

    base, model, _ = server

    def snapshot():
        steps = _metric_totals(base, "vllm:mtad_policy_steps_total{")
        drafts = sum(_metric_totals(base, "vllm:spec_decode_num_drafts_total{").values())
        return steps, drafts

    steps0, drafts0 = snapshot()
    r = requests.post(f"{base}/v1/completions", json={"model": model, "prompt": PROMPT_IDS,
                                                      "max_tokens": 40, "temperature": 0.0,
                                                      "ignore_eos": True}, timeout=120)
    assert r.status_code == 200
    deadline = time.time() + 20  # the last step's stats may reach the logger after the reply
    while True:
        steps1, drafts1 = snapshot()
        gained = {k: v - steps0.get(k, 0.0) for k, v in steps1.items() if v != steps0.get(k, 0.0)}
        new_drafts = drafts1 - drafts0
        if sum(gained.values()) >= new_drafts > 0 or time.time() > deadline:
            break
        time.sleep(0.5)
    assert len(gained) == 1, gained
    (labels, n), = gained.items()
    assert f'beam_width="{WIDTH}"' in labels and f'num_speculative_tokens="{GAMMA}"' in labels
    assert f'model_name="{model}"' in labels
    assert new_drafts > 0 and new_drafts <= n <= new_drafts + 1, (n, new_drafts)


def test_periodic_log_line_reports_spec_decode(server):
    """vLLM's own periodic stats line (every 10 s) carries MTAD's acceptance figures."""
    _, _, log = server
    deadline = time.time() + 30
    while time.time() < deadline and "SpecDecoding metrics: Mean acceptance length" not in log.read_text():
        time.sleep(1)
    text = log.read_text()
    assert "vllm-mtad: MTAD enabled with {'num_speculative_tokens': 4, 'beam_width': 4" in text
    line = next(x for x in text.splitlines() if "SpecDecoding metrics:" in x)
    mean = float(line.split("Mean acceptance length: ")[1].split(",")[0])
    assert 1.0 <= mean <= GAMMA + 1


def test_worker_patches_are_applied_in_the_worker_only(server):
    """register() runs in every server process; the model-runner patches are applied where a
    worker is built (patches/platform/patch_worker_base.py), not in the API server."""
    import re

    _, _, log = server
    pids = [int(m) for m in re.findall(r"worker patches applied in \S+ \(pid (\d+)\)",
                                       log.read_text())]
    assert len(pids) == 1, pids  # TP=1: one worker process
    assert pids[0] != SERVER_PIDS["api"]
    # and MTAD ran there: the greedy test above matched the reference token for token


def test_bad_mtad_config_stops_server_startup(tiny_pair_dirs):
    target_dir, draft_dir = tiny_pair_dirs
    spec = {"method": "mtad", "model": str(draft_dir), "num_speculative_tokens": 4,
            "beam_width": 0}
    proc = subprocess.run(_serve_cmd(target_dir, spec, free_port()), capture_output=True,
                          text=True, timeout=240, env=serve_env())
    assert proc.returncode != 0
    assert "'beam_width' must be an integer >= 1, got 0" in proc.stdout + proc.stderr


def test_readme_openai_example_runs_with_the_current_client(server):
    """The README's OpenAI snippet, as written (model and URL swapped for this server's)."""
    base, model, _ = server
    snippet = _readme_block("**Call it**", "python")
    assert "extra_body" in snippet and "top_k" in snippet
    code = (snippet.replace("http://localhost:8000/v1", f"{base}/v1")
            .replace('"TARGET"', repr(model)).replace("print(out.choices[0].text)", ""))
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    out = scope["out"]
    assert out.choices[0].finish_reason in ("length", "stop") and out.usage.completion_tokens > 0


def test_fuzzed_requests_get_200_or_4xx_and_the_server_lives(server, tiny_pair_dirs, tmp_path):
    """Property-based fuzz (hypothesis) of /v1/completions and /v1/chat/completions with MTAD
    on: bodies mixing valid and invalid values of the parameters vLLM and MTAD read. Every
    answer is a 200 or a 4xx, never a dropped connection, and the engine still serves a normal
    request afterwards. A 5xx is allowed only where plain vLLM 0.32 (the same server without
    MTAD, started on first need) answers the same body with a 5xx too: those are vLLM's own
    (e.g. ``"structured_outputs": false`` fails in vLLM's request validator) and are listed,
    not hidden."""
    import requests
    from hypothesis import HealthCheck, assume, given, settings
    from hypothesis import strategies as st

    base, model, _ = server
    junk = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                     st.lists(st.integers(-5, 500), max_size=5), st.dictionaries(
                         st.text(max_size=6), st.integers(-3, 3), max_size=3))

    def field(valid):  # a valid value, or junk one time in eight
        return st.integers(0, 7).flatmap(lambda k: junk if k == 0 else valid)

    common = {
        "max_tokens": field(st.integers(1, 12)),
        "temperature": field(st.sampled_from([0.0, 0.5, 1.0, 1.5])),
        "top_p": field(st.floats(0.05, 1.0)),
        "top_k": field(st.sampled_from([-1, 0, 1, 5, 50, 1000])),
        "n": field(st.integers(1, 3)),
        "seed": field(st.integers(0, 2**31)),
        "stop": field(st.lists(st.text(min_size=1, max_size=3), max_size=2)),
        "min_tokens": field(st.integers(0, 4)),
        "presence_penalty": field(st.floats(-2, 2)),
        "repetition_penalty": field(st.floats(0.5, 2)),
        "ignore_eos": field(st.booleans()),
        "stream": st.booleans(),
        "structured_outputs": field(st.sampled_from([{"choice": ["a", "b"]},
                                                     {"regex": "[a-c]{1,3}"}, {"json": {}}])),
        "vllm_xargs": field(st.dictionaries(
            st.sampled_from(["acceptance_threshold", "greedy_acceptance", "beam_width",
                             "acceptnce_threshold", "other_key"]),
            st.one_of(st.floats(-1, 2), st.sampled_from(["joint", "exact", "fast"]),
                      st.integers(-1, 3)), max_size=2)),
    }
    completion = st.fixed_dictionaries(
        {"prompt": field(st.one_of(st.text(min_size=1, max_size=40),
                                   st.lists(st.integers(0, 383), min_size=1, max_size=40)))},
        optional={**common, "logprobs": field(st.integers(0, 5)),
                  "echo": field(st.booleans())})
    chat = st.fixed_dictionaries(
        {"messages": field(st.lists(st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "assistant", "system", "robot"]),
             "content": field(st.text(max_size=40))}), min_size=1, max_size=3))},
        optional={**common, "logprobs": field(st.booleans()),
                  "top_logprobs": field(st.integers(0, 5))})
    answers = []
    vllm_own_5xx = []
    plain = {}

    def plain_status(path, body):
        if "base" not in plain:  # the target alone, same flags
            port = free_port()
            cmd = serve_command(str(tiny_pair_dirs[0]), None, port, max_num_seqs=8)
            plain["ctx"] = running_server(cmd, model, tmp_path / "plain.log", port)
            plain["base"] = plain["ctx"].__enter__().base
        r = requests.post(plain["base"] + path, data=json.dumps(body, allow_nan=True),
                          headers={"Content-Type": "application/json"}, timeout=120)
        return r.status_code

    @settings(max_examples=120, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.one_of(st.tuples(st.just("/v1/completions"), completion),
                     st.tuples(st.just("/v1/chat/completions"), chat)))
    def one(case):
        path, body = case
        # vLLM 0.32's own bug, not MTAD's: a streamed completion with echo, logprobs and n > 1
        # sometimes ends with a 500 (KeyError in _create_completion_logprobs: the second
        # choice's echo pairs the prompt's tokens with its output's logprobs), e.g.
        # {"prompt": "0", "echo": true, "logprobs": 0, "n": 2, "stream": true}: 8 of 20 fail on
        # the target alone without speculation (docs/vllm-quirks.md). Intermittent, so the
        # plain-vLLM comparison below cannot vouch for it; left out of the fuzz.
        n = body.get("n")
        assume(not (body.get("stream") is True and body.get("echo") is True
                    and isinstance(body.get("logprobs"), int) and isinstance(n, int) and n > 1))
        body = {"model": model, **body}
        try:
            r = requests.post(base + path, data=json.dumps(body, allow_nan=True),
                              headers={"Content-Type": "application/json"}, timeout=120)
            text = r.text  # reads a streamed body to its end
        except requests.RequestException as exc:
            raise AssertionError(f"{path} {body!r}: no answer ({exc!r})") from exc
        answers.append(r.status_code)
        if r.status_code >= 500 and plain_status(path, body) >= 500:
            vllm_own_5xx.append((path, body, text[:200]))
            return
        assert r.status_code == 200 or 400 <= r.status_code < 500, (path, body, r.status_code,
                                                                      text[:500])
        if r.status_code == 200 and body.get("stream") is True:
            assert '"code": 5' not in text and "InternalServerError" not in text, (body, text)

    try:
        one()
    finally:
        if "ctx" in plain:
            plain["ctx"].__exit__(None, None, None)
    print(f"{len(answers)} fuzzed requests: {answers.count(200)} x 200, "
          f"{sum(400 <= a < 500 for a in answers)} x 4xx, {len(vllm_own_5xx)} x 5xx that plain "
          f"vLLM gives too: {vllm_own_5xx[:3]}")
    assert answers.count(200) >= 25 and sum(400 <= a < 500 for a in answers) >= 25, answers
    ok = requests.post(f"{base}/v1/completions", timeout=120, json={
        "model": model, "prompt": PROMPT_IDS, "max_tokens": 8, "temperature": 0.0})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 8


def _readme_block(heading: str, lang: str) -> str:
    import re

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    return re.search(re.escape(heading) + r".*?```" + lang + r"\n(.*?)```", readme, re.S).group(1)


def test_readme_structured_outputs_example_runs(server):
    base, model, _ = server
    code = _readme_block("**Structured outputs**", "python").replace('"TARGET"', repr(model))
    scope = {"client": _client(base)}
    exec(compile(code.replace("print(out.choices[0].message.content)", ""), "README.md",
                 "exec"), scope)
    assert scope["out"].choices[0].message.content in ("yes", "no")


def test_readme_cpu_quick_start_serves(tmp_path):
    """The README's CPU quick start, run as written (port swapped; the tiny pair built in a
    fresh cache directory), answers a completion."""
    import requests

    block = _readme_block("### CPU quick start", "bash")
    assert "--port 8000" in block and "VLLM_CPU_KVCACHE_SPACE=1" in block
    port = free_port()
    cmd = ["bash", "-c", block.replace("--port 8000", f"--port {port}")]
    with running_server(cmd, "", tmp_path / "quick_start.log", port,
                        env_extra={"VLLM_MTAD_CACHE_DIR": str(tmp_path / "cache")},
                        cwd=Path(__file__).parent.parent) as srv:
        target = requests.get(f"{srv.base}/v1/models", timeout=30).json()["data"][0]["id"]
        r = requests.post(f"{srv.base}/v1/completions", timeout=120, json={
            "model": target, "prompt": "def split(", "max_tokens": 16, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16
        log = srv.log.read_text()
        assert "MTAD enabled with" in log and "'speculation_policy': 'adaptive'" in log
        # What the adaptive policy chose is on /metrics (steps per W and γ, within bounds).
        deadline = time.time() + 20
        while not (steps := _metric_totals(srv.base, "vllm:mtad_policy_steps_total{")):
            assert time.time() < deadline, "no vllm:mtad_policy_steps_total on /metrics"
            time.sleep(0.5)
        for labels in steps:
            width = int(labels.split('beam_width="')[1].split('"')[0])
            tokens = int(labels.split('num_speculative_tokens="')[1].split('"')[0])
            assert 1 <= width <= 4 and 0 <= tokens <= 4, labels


def test_worker_killed_under_the_server(server):
    """SIGKILL the model-runner process mid-stream: the open stream ends with an error, new
    requests are refused, and the server exits (no hang). On the module's server, which it
    ends: keep this test last here."""
    import signal

    import psutil
    import requests

    base, model, log = server
    api = psutil.Process(SERVER_PIDS["api"])  # vllm-mtad serve: vLLM's API server
    procs = api.children(recursive=True)
    workers = [p for p in procs if "Worker" in p.name() + " ".join(p.cmdline())]
    assert len(workers) == 1, [(p.name(), p.cmdline()) for p in procs]
    stream_result = {"lines": []}
    started = threading.Event()

    def stream():
        try:
            with requests.post(f"{base}/v1/completions", stream=True, timeout=120,
                               json={"model": model, "prompt": [5, 6, 7],
                                     "max_tokens": 1000, "min_tokens": 1000,
                                     "ignore_eos": True, "stream": True}) as r:
                for ln in r.iter_lines():
                    if ln:
                        stream_result["lines"].append(ln)
                        started.set()
        except requests.RequestException as exc:
            stream_result["error"] = repr(exc)
        started.set()

    t = threading.Thread(target=stream)
    t.start()
    # Kill as soon as the stream is under way (a fixed sleep once outlasted the whole stream:
    # 1000 tokens of the tiny pair took under 3 s in one CI run).
    assert started.wait(timeout=120), "the stream did not start"
    workers[0].send_signal(signal.SIGKILL)
    t.join(timeout=120)
    assert not t.is_alive(), "the open stream hung after the worker died"
    lines = stream_result.get("lines", [])
    # vLLM's streaming error event, then the end of the stream (not a hang, not a cut).
    assert len(lines) >= 2 and lines[-1] == b"data: [DONE]", stream_result
    assert b'"error"' in lines[-2] and b"EngineCore encountered an issue" in lines[-2]
    api.wait(timeout=120)  # the server exits by itself
    text = log.read_text()
    assert "Worker proc VllmWorker-0 died unexpectedly" in text, text[-3000:]
