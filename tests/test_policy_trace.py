"""The speculation policy's choices on a recorded engine trace stay what they were.

tests/data/policy-trace.jsonl.gz holds 437 decisions of the adaptive policy on the tiny pair
(devtools.policy_trace record: the target as its own draft, then the tiny draft; sampled,
joint and exact requests at batch 1 and 6). Each decision's inputs are rebuilt with today's
code and must give the same arm at the same predicted goodput. Re-recorded (issue 57) when the
decisions were meant to change: the cold start drafts the long arm until each class has 16
drafts of it, the step without a draft is explored first only where the budget allows, and
the optimistic exploration's bound grows with the step count (docs/policy-decisions.md,
cold-start-measures-the-long-arm); re-recorded again (issue 57) when a length no draft
reaches began to age a draft a step towards the shorter lengths continued
(#stale-lengths-age: the same plans, other predicted goodputs, at 49 of the 438 decisions of
the trace before); re-recorded again (issue 57) when the cold start began to last until four
requests of each class drafted the long arm (#cold-start-spans-requests: the trace before
replays with 353 of its 437 decisions changed, since it holds no request counts; the new one
drafts the cold start's long arm in 121 of 402 decisions, the one before in 84 of 437); and
again when each drafting arm began to be priced by its own measured step time and stale
lengths below their prior to age faster (#step-price-measured-per-arm,
#stale-pessimism-fades: 410 decisions, 406 of them with measured arms in their inputs; the
trace before replays unchanged, since it holds none). The trace before (643 decisions,
recorded before the policy became a package) is in git history (c8ec52c).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TRACE = Path(__file__).parent / "data" / "policy-trace.jsonl.gz"


def test_the_recorded_decisions_replay_to_the_same_plans():
    from devtools.policy_trace import replay

    n, differ = replay(str(TRACE))
    assert n == 410
    assert differ == []


def test_the_replay_notices_a_changed_policy(monkeypatch):
    """The check can fail: a policy that prices beam steps at half their cost chooses
    otherwise somewhere in the trace."""
    from devtools.policy_trace import replay
    from vllm_mtad.policy.cost import CostModel

    step_time = CostModel.step_time
    monkeypatch.setattr(CostModel, "step_time",
                        lambda self, batch, w, g, owed_share=1.0:
                        step_time(self, batch, w, g, owed_share) * (0.5 if g else 1.0))
    _, differ = replay(str(TRACE))
    assert differ
