"""Which requests' draft KV lags after steps without drafting (vllm_mtad.draft_kv)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_draft_kv_tracker_gaps_after_skipped_steps():
    """Which tokens the draft must catch up on: none after one skipped step (the last first
    pass wrote the token at the next start), the tokens of the skipped steps after more; a
    request first seen (or seen going backwards: resumed after preemption) with tokens already
    computed once any step skipped is caught up from 0; finished requests are forgotten."""
    from vllm_mtad.draft_kv import DraftKVTracker

    kv = DraftKVTracker()

    def step(req_ids, starts, drafting):
        # owed() says, without recording anything, what a drafting step would catch up on.
        owed = kv.owed(req_ids, starts)
        gaps = kv.step(req_ids, starts, drafting)
        if drafting:
            assert owed == {r: b - a for r, (a, b) in gaps.items()}
        return gaps

    assert step(["a", "b"], [10, 0], drafting=True) == {}  # never skipped: vLLM's rule
    assert step(["a", "b"], [14, 5], drafting=False) == {}  # a skipped step: stale now
    assert kv.owed(["a", "b"], [15, 6]) == {"a": 1, "b": 1}
    assert step(["a", "b"], [15, 6], drafting=False) == {}
    assert step(["a", "b"], [16, 7], drafting=True) == {"a": (14, 16), "b": (5, 7)}
    assert step(["a", "b"], [20, 9], drafting=True) == {}  # current again
    step(["a"], [24], drafting=False)
    # A new request with a prefix-cache hit, and "b" resumed after preemption at 3 < 9.
    assert step(["a", "b", "c"], [25, 3, 32], drafting=True) == {
        "a": (24, 25), "b": (0, 3), "c": (0, 32)}
    # Where the draft reads each from: "a" was first seen at 10 before any skipped step (its
    # cached draft KV valid), "c" at 32 after one (read again from 0).
    assert kv.first_start == {"a": 10, "b": 0, "c": 0}
    kv.forget(["b", "c"])  # finished
    assert set(kv.last_start) == {"a"} and kv.valid == {} and set(kv.first_start) == {"a"}


def test_draft_kv_tracker_catches_a_hit_up_from_the_hole_its_blocks_hold():
    """With the step's tokens known, a prefix-cache hit after skipped steps is caught up from
    where the draft KV of the blocks it shares stops (a stale request's hole, registered once
    the block where it starts is full), and not at all where it shares no such block; past
    ``max_holes`` the tracker falls back to reading every hit from 0."""
    import numpy as np

    from vllm_mtad.draft_kv import DraftKVTracker

    bs = 4
    a = np.arange(100, 140)  # request "a"'s tokens
    other = np.arange(500, 540)

    def tokens(*rows):  # the input batch's host rows (padded) and the tokens known per row
        out = np.zeros((len(rows), 64), dtype=np.int32)
        for i, r in enumerate(rows):
            out[i, :len(r)] = r
        return out, [len(r) for r in rows]

    kv = DraftKVTracker()
    rows, known = tokens(a[:10], other[:20])
    kv.set_tokens(["a", "b"], rows, known, bs)
    assert kv.step(["a", "b"], [9, 16], drafting=True) == {}
    # Steps without drafting: "a" stale from 10, "b" from 17. "b"'s block [16, 20) is full
    # (21 tokens known): registered; "a"'s [8, 12) is not yet (11 known).
    rows, known = tokens(a[:11], other[:21])
    kv.set_tokens(["a", "b"], rows, known, bs)
    kv.step(["a", "b"], [10, 17], drafting=False)
    assert list(kv.holes.values()) == [17]
    rows, known = tokens(a[:12], other[:22])
    kv.set_tokens(["a", "b"], rows, known, bs)
    kv.step(["a", "b"], [11, 18], drafting=False)
    assert sorted(kv.holes.values()) == [10, 17]  # "a": block [8, 12) full, valid below 10
    # "a" resumed after preemption at 8 < 11 (its blocks hit again): its own draft KV is
    # valid below 10, and the hit on [0, 8) holds no hole: nothing to catch up (the rule
    # without the tokens reads it again from 0).
    rows, known = tokens(a[:12])
    kv.set_tokens(["a"], rows, known, bs)
    assert kv.owed(["a"], [8]) == {}
    kv.forget(["a"])  # finished stale: its blocks stay cached, its hole registered

    def first_seen(req_id, row, start):
        rows, known = tokens(row)
        kv.set_tokens([req_id], rows, known, bs)
        return kv.owed([req_id], [start])

    # A hit on 12 of "a"'s tokens: its draft KV is valid below 10 only.
    assert first_seen("c", np.concatenate([a[:12], other[:3]]), 12) == {"c": 2}
    # A hit on 8 of "a"'s tokens (below the hole) and one on tokens no stale request had.
    assert first_seen("d", np.concatenate([a[:8], other[:5]]), 8) == {}
    assert first_seen("e", np.concatenate([other[30:40], a[:5]]), 8) == {}
    # Without the step's tokens, and past max_holes: every hit read again from 0.
    blind = DraftKVTracker()
    blind.step(["x"], [5], drafting=False)
    assert blind.owed(["y"], [8]) == {"y": 8}
    small = DraftKVTracker(max_holes=0)
    rows, known = tokens(a[:12])
    small.set_tokens(["a"], rows, known, bs)
    small.step(["a"], [9], drafting=False)
    assert small.holes_overflow
    rows, known = tokens(np.concatenate([other[30:40], a[:5]]))
    small.set_tokens(["e"], rows, known, bs)
    assert small.owed(["e"], [8]) == {"e": 8}
