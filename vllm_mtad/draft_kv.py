"""Which requests' draft KV lags the target's, after steps in which the policy drafted nothing.

A step without drafting runs no draft forward, so the draft's KV misses that step's tokens;
:class:`DraftKVTracker` says what each request's draft must catch up on when it next drafts,
and what it would owe if this step drafted (the policy prices that). Host-side only.
"""

from __future__ import annotations

import hashlib

import numpy as np


def _prefix_digest(data: bytes = b""):
    """The digest the hole registry keys a token prefix by (fed block by block or whole)."""
    return hashlib.blake2b(data, digest_size=16)


def _token_bytes(tokens) -> bytes:
    return np.ascontiguousarray(tokens, dtype=np.int64).tobytes()


class DraftKVTracker:
    """Which requests' draft KV lags the target's, on the host.

    A request is *current* when the draft has processed every token before the step's first
    query position (``start``): true after any step whose first draft pass included it. In a
    step without drafting it becomes *stale* with its draft KV valid below ``start`` (the
    previous first pass wrote the token at ``start``; one token of slack costs nothing). When
    it next drafts, the tokens [valid, start) are fed to the draft first (a catch-up pass).

    A request first seen with tokens already computed (a prefix-cache hit, or resumed after
    preemption) reads blocks another request filled; once any step has skipped drafting, some
    of those may hold no draft KV. Where the step's tokens are known (:meth:`set_tokens`) the
    tracker keeps a registry of *holes*: for every stale request whose tokens fill the block
    where its valid draft KV ends, a digest of its tokens up to that block's end, with where
    its draft KV stops. A hit whose tokens share such a prefix is caught up from there (the
    lowest such point); a hit that shares none has valid draft KV. Without the tokens (or
    past ``max_holes`` registered), a hit after any skipped step is caught up from 0.
    """

    def __init__(self, max_holes: int = 1 << 16):
        self.valid: dict[str, int] = {}  # stale requests: draft KV valid for positions < value
        self.last_start: dict[str, int] = {}
        # Where the draft began reading each request (> 0: a prefix-cache hit whose draft KV
        # is cached too).
        self.first_start: dict[str, int] = {}
        self.skipped_any = False
        self.max_holes = max_holes
        # digest of a token prefix ending at a block boundary -> draft KV valid below this
        self.holes: dict[bytes, int] = {}
        self.holes_overflow = False
        self._registered: dict[str, int] = {}  # stale request -> the valid it registered
        self._step = None  # this step's (req_ids, token rows, tokens known), see set_tokens
        self._index: dict | None = None  # req_id -> row of this step, built on first use
        self.block_size = 0

    def set_tokens(self, req_ids, tokens, known, block_size: int) -> None:
        """This step's tokens: rows of ``tokens`` (vLLM's InputBatch.token_ids_cpu) and
        ``known`` (num_tokens_no_spec) in ``req_ids``' order; ``block_size``: the KV cache's
        (prefix-cache hits are whole blocks). Kept by reference: read only in steps without
        drafting and for prefix-cache hits after one."""
        self.block_size = int(block_size)
        self._step, self._index = (req_ids, tokens, known), None

    def _row(self, req_id: str):
        """(token row, tokens known) of a request in this step, None if unknown."""
        if self._step is None:
            return None
        req_ids, tokens, known = self._step
        if self._index is None:
            self._index = {r: i for i, r in enumerate(req_ids)}
        i = self._index.get(req_id)
        return None if i is None else (tokens[i], int(known[i]))

    def _valid(self, req_id: str, start: int) -> int | None:
        """Where the request's draft KV stops being valid, None if it is current."""
        last = self.last_start.get(req_id)
        if (last is None or start < last) and start > 0 and self.skipped_any:
            hit = self._hit_valid(req_id, start)  # unknown history: what the blocks hold
            own = self.valid.get(req_id)
            return hit if own is None else own if hit is None else min(hit, own)
        return self.valid.get(req_id)

    def _hit_valid(self, req_id: str, start: int) -> int | None:
        row = self._row(req_id)
        if row is None or self.holes_overflow or self.block_size <= 0:
            return 0
        if not self.holes:
            return None
        bs, digest = self.block_size, _prefix_digest()
        for end in range(bs, start + 1, bs):
            digest.update(_token_bytes(row[0][end - bs:end]))
            valid = self.holes.get(digest.digest())
            if valid is not None:  # the first, shortest shared prefix ends the lowest
                return valid
        return None

    def _register(self, req_ids) -> None:
        """Holes of the stale rows whose block where the draft KV ends is filled."""
        if self._step is None or self.block_size <= 0 or self.holes_overflow:
            return
        bs = self.block_size
        for req_id in req_ids:
            valid = self.valid.get(req_id)
            if valid is None or self._registered.get(req_id) == valid:
                continue
            row = self._row(req_id)
            end = (valid // bs + 1) * bs  # the end of the block where the draft KV stops
            if row is None or row[1] < end:
                continue  # that block is not full yet: no hit can reach it
            key = _prefix_digest(_token_bytes(row[0][:end])).digest()
            self.holes[key] = min(self.holes.get(key, valid), valid)
            self._registered[req_id] = valid
            if len(self.holes) > self.max_holes:
                self.holes.clear()
                self.holes_overflow = True
                return

    def step(self, req_ids, starts, drafting: bool) -> dict[str, tuple[int, int]]:
        """Update for one step; returns {req_id: (valid, start)} to catch up (drafting only)."""
        gaps = {}
        for req_id, start in zip(req_ids, starts):
            start = int(start)
            valid = self._valid(req_id, start)
            self.last_start[req_id] = start
            self.first_start.setdefault(req_id, start if valid is None else valid)
            if drafting:
                self.valid.pop(req_id, None)
                if valid is not None and valid < start:
                    gaps[req_id] = (valid, start)
            else:
                self.valid[req_id] = start if valid is None else valid
        if not drafting:
            self.skipped_any = True
            self._register(req_ids)
        return gaps

    def read_from(self, req_id: str, start: int) -> int:
        """Where the draft reads the request from: its first step's start, or 0 where that
        step found no valid draft KV below it (see _valid)."""
        if req_id in self.first_start:
            return self.first_start[req_id]
        valid = self._valid(req_id, start)
        return start if valid is None else valid

    def owed(self, req_ids, starts) -> dict[str, int]:
        """{req_id: tokens} the draft would catch up on if this step drafted (what
        ``step(..., drafting=True)`` would return, without recording the step)."""
        out = {}
        for req_id, start in zip(req_ids, starts):
            valid = self._valid(req_id, int(start))
            if valid is not None and valid < int(start):
                out[req_id] = int(start) - valid
        return out

    def forget(self, req_ids) -> None:
        """Finished requests; the holes they registered stay (their blocks stay cached)."""
        for req_id in req_ids:
            self.valid.pop(req_id, None)
            self.last_start.pop(req_id, None)
            self.first_start.pop(req_id, None)
            self._registered.pop(req_id, None)
