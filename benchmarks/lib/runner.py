"""The runner: how a benchmark feeds an engine, orders its configurations and runs a repeat in a
process of its own; vLLM's log kept off the terminal (``output_to``, ``tail``: devtools.console's)
and the policy's decisions recorded (``recording``: devtools.policy_trace's), named here for the
programs.

Every speed program warms each engine up on other prompts before timing, interleaves the
configurations (:func:`run_order`) and repeats them; the report gives the median and [min, max]
of the repeats (benchmarks.lib.stats.summary).
"""

from __future__ import annotations

import os

from devtools.console import output_to, tail  # noqa: F401
from devtools.policy_trace import recording  # noqa: F401


def generate_in_batches(llm, prompts: list, params: list, batch: int) -> list:
    """``llm.generate`` over ``prompts`` with at most ``batch`` requests at once, in order:
    closed batches (the next starts when the whole batch has finished)."""
    outs = []
    for i in range(0, len(prompts), batch):
        outs += llm.generate(prompts[i:i + batch], params[i:i + batch], use_tqdm=False)
    return outs


def generate_queued(llm, prompts: list, params: list, concurrency: int) -> list:
    """``llm.generate`` over all ``prompts`` at once, with vLLM's scheduler admitting at most
    ``concurrency`` of them into the running batch (its ``max_num_active_seqs``): a queued
    request starts as soon as a running one finishes, as on a server held at that many
    requests in flight. Needs the engine in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    core = getattr(getattr(llm.llm_engine, "engine_core", None), "engine_core", None)
    scheduler = getattr(core, "scheduler", None)
    if scheduler is None or not hasattr(scheduler, "max_num_active_reqs"):
        raise RuntimeError("generate_queued needs an in-process vLLM engine "
                           "(VLLM_ENABLE_V1_MULTIPROCESSING=0) whose scheduler has "
                           "max_num_active_reqs (vLLM >= 0.32)")
    if concurrency > scheduler.max_num_running_reqs:
        raise ValueError(f"concurrency {concurrency} > the engine's max_num_seqs "
                         f"{scheduler.max_num_running_reqs}")
    before = scheduler.max_num_active_reqs
    scheduler.max_num_active_reqs = concurrency
    try:
        return llm.generate(prompts, params, use_tqdm=False)
    finally:
        scheduler.max_num_active_reqs = before


def per_request_acceptance(outs) -> tuple[int, int]:
    """(verify steps with a draft, draft tokens accepted) over finished requests, from vLLM's
    per-request spec-decode metrics (``per_request_spec_decode_metrics="summary"``: each engine
    reports its own, where vLLM's global counters belong to the engine built last)."""
    drafts = accepted = 0
    for out in outs:
        metrics = out.outputs[0].spec_decode_metrics
        if metrics is not None:
            drafts += sum(metrics.histogram)
            accepted += sum(j * count for j, count in enumerate(metrics.histogram))
    return drafts, accepted


def run_order(configs: list, repeat: int) -> list:
    """The configurations' order in repeat ``repeat``: rotated by repeat // 2, and in odd
    repeats reversed (and, from three configurations on, rotated by one more, so that no
    configuration runs twice in a row), so that a configuration does not always run right after
    the same one (a fixed cyclic order put one MTAD configuration right after another on the
    same engine in every repeat). Two configurations simply alternate which runs first (the
    rotation gave them the same order in every repeat: in the verdict at 97a6346, vLLM SD on
    equal samplers ran before vLLM SD as shipped in both repeats)."""
    k = (repeat // 2) % len(configs)
    order = configs[k:] + configs[:k]
    if repeat % 2:
        order = order[::-1]
        if len(order) > 2:
            order = order[1:] + order[:1]
    return order


def in_own_process(work, args: tuple, progress, what: str):
    """``work(report, *args)`` in a process spawned for it and gone after it (memory closed
    engines leave behind goes with the process: in one process, the third set of three
    real-pair engines ran out of 24 GiB). ``work`` calls ``report(n)`` after each run, which
    calls ``progress(n)`` here; its return value is returned. ``what`` names it in errors."""
    import multiprocessing
    import queue

    ctx = multiprocessing.get_context("spawn")
    messages = ctx.Queue()
    child = ctx.Process(target=_child, args=(messages, os.getpid(), work, args))
    child.start()
    try:
        while True:
            try:
                kind, payload = messages.get(timeout=5)
            except queue.Empty:
                if child.is_alive():
                    continue
                try:  # its last message may have arrived between the wait and the check
                    kind, payload = messages.get(timeout=1)
                except queue.Empty:
                    raise RuntimeError(f"the process of {what} ended with exit code "
                                       f"{child.exitcode} (-9: killed, out of memory?)") from None
            if kind == "run":
                progress(payload)
            elif kind == "error":
                raise RuntimeError(f"{what}:\n{payload}")
            else:
                return payload
    finally:
        child.join(timeout=120)
        if child.is_alive():
            child.kill()


def _child(messages, parent: int, work, args) -> None:
    import traceback

    die_with_parent(parent)
    try:
        messages.put(("done", work(lambda n: messages.put(("run", n)), *args)))
    except BaseException:  # the parent raises it, with this traceback
        messages.put(("error", traceback.format_exc()))


def die_with_parent(parent: int) -> None:
    """Linux: this process gets SIGKILL when ``parent`` ends, however it ends (a benchmark
    stopped by hand left its repeat's process running, 20 GB and both cores)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except AttributeError:  # not Linux
        return
    if os.getppid() != parent:  # it ended before the request
        os._exit(1)


def run_view(views: dict, argv, usage: str) -> None:
    """A program of several views (``python -m benchmarks.phases step ...``): the view named by
    ``argv[0]`` (sys.argv[1:] when None) runs with the rest; none named: ``usage`` and exit."""
    import sys

    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in views:
        raise SystemExit(f"{usage}\nerror: name a view: {' or '.join(views)}")
    views[argv[0]](argv[1:])


def run_config(llm, config: dict, prompts: list[str], max_tokens: int, stop=None
               ) -> list[dict]:
    """One run of a rules' grid ``config`` (benchmarks.lib.engines.configurations): one record
    per prompt, its verify steps, accepted tokens and their histogram, and the output (token
    ids, text, why it ended). ``stop``: stop strings (None: none)."""
    from benchmarks.lib.engines import prepare_rule, sampling_params

    prepare_rule(llm, config)
    params = sampling_params(config, len(prompts), max_tokens, stop)
    outs = llm.generate(prompts, params, use_tqdm=False)
    records = []
    for i, out in enumerate(outs):
        metrics = out.outputs[0].spec_decode_metrics  # None: the target alone
        hist = list(metrics.histogram) if metrics is not None else []
        steps, accepted = per_request_acceptance([out])
        records.append(dict(prompt=i, tokens=len(out.outputs[0].token_ids), steps=steps,
                            accepted=accepted, histogram=hist,
                            token_ids=list(out.outputs[0].token_ids), text=out.outputs[0].text,
                            finish_reason=out.outputs[0].finish_reason))
    return records


def drafter_counters(llm) -> dict:
    """The MTAD engine's drafter counters (vllm_mtad.worker_rpc.drafter_stats)."""
    from vllm_mtad.worker_rpc import drafter_stats

    return llm.collective_rpc(drafter_stats)[0]


def chosen_since(before: dict, after: dict) -> dict:
    """The policy's chosen arms ("W{w}_g{g}" -> steps) between two drafter_stats()."""
    old = before.get("policy_chosen", {})
    return {k: n - old.get(k, 0) for k, n in after.get("policy_chosen", {}).items()
            if n > old.get(k, 0)}
