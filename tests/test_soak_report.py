"""The soak's failure lines (benchmarks/soak.py) on made-up results: no server."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from benchmarks import soak

pytestmark = pytest.mark.unit


def _run(text: str, tokens: int, after=(0.0, 0.0)) -> dict:
    out = soak.Outcome(471, "chat", status=200, done=True, texts={0: text},
                       finish={0: "length"}, completion_tokens=tokens, engine_after=after)
    return asdict(out)


def _result(unstable_runs: list[dict]) -> dict:
    return {"failed": 0, "server_5xx": 0, "problems": {}, "replay_mismatches_by_kind": {},
            "replay_mismatches": [{"i": r["i"]} for r in unstable_runs], "preemptions": 3.0,
            "differing_requests_unstable_alone": [r["i"] for r in unstable_runs],
            "unstable_alone_runs": unstable_runs, "cancelled": 2,
            "after_load": {"running": 0.0, "waiting": 0.0},
            "spec_decode": {"num_drafts": 5, "num_draft_tokens": 20, "num_accepted_tokens": 9},
            "alive_after": True,
            "memory": {"drift_fraction": 0.0, "drift_mib": 0.0}}


def test_a_stable_run_has_no_failure_line():
    assert soak.failures(_result([]), memory_bound=0.1) == []


def test_an_unstable_request_is_reported_with_which_runs_agree_and_the_engine_gauges():
    record = {"i": 471, "kind": "chat", "request": {},
              "runs": {"under_load": _run("ab", 2), "alone_1": _run("ac", 2),
                       "alone_2": _run("ab", 2, after=(1.0, 0.0)), "alone_3": _run("ac", 2)}}
    [line] = soak.failures(_result([record]), memory_bound=0.1)
    assert "requests [471] gave different outputs in two runs alone" in line
    assert "#471 chat: under load/alone 1/2/3 = A/B/A/B" in line
    assert "after each alone run [(0.0, 0.0), (1.0, 0.0), (0.0, 0.0)]" in line
