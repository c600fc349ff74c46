"""What one MTAD runner knows per request, in one object its drafter and its sampler share.

:class:`MTADRequestState` is created where the model runner is patched
(patches/worker/patch_gpu_model_runner.py) and handed to both
:class:`vllm_mtad.proposer.MTADProposer` and :class:`vllm_mtad.sampler.MTADRejectionSampler`;
neither holds the runner nor the other. It holds:

- the step's rows: vLLM's ``InputBatch`` of the current step and the runner's requests
  (``CachedRequestState`` by id), handed over at the start of every step;
- each request's MTAD settings — τ, greedy mode ("joint"/"exact") and noise seed — resolved
  once, with the front end's rule (:func:`vllm_mtad.config.request_settings`);
- each request's latest draft (tokens and draft log-probs, :class:`DraftStore`);
- the batch's beam plan (:meth:`MTADRequestState.batch_plan`: greedy rows and how the draft's
  and the target's distributions are processed);
- the speculation policy's per-request bookkeeping: the beams of each request's latest draft
  (its acceptance statistics are counted by that width) and where its draft KV stops
  (:class:`DraftKVTracker`). The policy's engine-wide state — cost models, acceptance
  histogram, chosen plans — stays in :class:`vllm_mtad.speculation.SpeculationController`.

One pruning rule: a request is forgotten everywhere when vLLM's runner forgets it (the
scheduler's ``finished_req_ids``, at the start of the step that reports them).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from vllm_mtad.config import MTADConfig, request_settings
from vllm_mtad.core.processing import CandidatePlan, is_greedy, plan_candidates


def request_seed(sampling_params, req_id: str) -> int:
    """The request's seed, or a stable hash of its id (identical on every TP rank)."""
    seed = getattr(sampling_params, "seed", None)
    if seed is not None:
        return int(seed)
    return int.from_bytes(hashlib.blake2b(req_id.encode(), digest_size=8).digest(), "little") >> 1


@dataclass(frozen=True)
class RequestSettings:
    """A request's MTAD settings, resolved once."""

    tau: float  # acceptance threshold τ
    exact: bool  # greedy acceptance "exact" (else "joint")
    seed: int  # key of the request's noise
    fixed: bool = False  # asked for speculation_policy "fixed" in an adaptive engine


@dataclass
class Rows:
    """Per batch row, on the host."""

    tau: list[float]
    exact: list[bool]  # greedy acceptance "exact"
    seeds: list[int]
    greedy: list[bool]  # temperature 0
    classes: list[str]  # policy.CLASSES: "sampled", "joint" or "exact"
    fixed: bool = False  # a row asked for the fixed policy: the step drafts the configured plan


class DraftStore:
    """Each request's latest draft (tokens and draft log-probs), on the device, for the rare
    step where vLLM's ``draft_probs`` channel has none for it.

    vLLM hands the last round's draft probabilities to the rejection sampler only when every
    request in the step was in that round; a running request that the scheduler skipped for a
    step is verified later against drafts from an earlier round. Rows are views into each
    round's tensors (no copy, no host transfer).
    """

    def __init__(self):
        self._rows: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # req_id -> ([γ], [γ])

    def put(self, req_ids: list[str], tokens: torch.Tensor, logprobs: torch.Tensor) -> None:
        """tokens: [B, γ] int64, logprobs: [B, γ] float32."""
        for b, req_id in enumerate(req_ids):
            self._rows[req_id] = (tokens[b], logprobs[b])

    def forget(self, req_ids) -> None:
        for req_id in req_ids:
            self._rows.pop(req_id, None)

    def lookup(self, req_ids: list[str], scheduled: torch.Tensor):
        """Draft log-probs of the scheduled drafts, per request.

        Args:
            scheduled: [B, γ] int, the drafts being verified (-1: invalid or past the count).
        Returns:
            [B, γ] float32 log-probs (0 at -1 positions) and [B] bool: rows whose scheduled
            drafts are this store's tokens (a request without an entry, e.g. a new one with no
            drafts, or with other tokens, is False: its log-probs must not be used).
        """
        gamma = scheduled.shape[1]
        dev = scheduled.device
        none = (torch.full((gamma,), -2, dtype=torch.int64, device=dev),
                torch.zeros(gamma, device=dev))
        entries = [self._rows.get(r, none) for r in req_ids]
        pad = lambda t, v: torch.nn.functional.pad(t[:gamma], (0, max(0, gamma - t.shape[0])),  # noqa: E731
                                                   value=v)
        tokens = torch.stack([pad(t.to(dev), -2) for t, _ in entries])
        logprobs = torch.stack([pad(lp.to(dev), 0.0) for _, lp in entries])
        invalid = scheduled < 0
        matches = ((tokens == scheduled) | invalid).all(dim=1)
        return logprobs.masked_fill(invalid, 0.0), matches


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


class MTADRequestState:
    """Per-request facts of one MTAD runner (see the module docstring)."""

    def __init__(self, cfg: MTADConfig, requests: dict | None = None, input_batch=None):
        self.cfg = cfg
        # vLLM's runner.requests ({req_id: CachedRequestState}): one dict for the runner's life.
        self.requests = {} if requests is None else requests
        # vLLM's InputBatch of the current step (the runner may replace the object when it
        # sizes the KV cache, so it is handed over again at every step).
        self.input_batch = input_batch
        self.settings: dict[str, RequestSettings] = {}
        self.drafts = DraftStore()
        self.widths: dict[str, int] = {}  # req_id -> beams of its latest draft
        self.kv = DraftKVTracker()

    # --- the step ---------------------------------------------------------------------------
    def begin_step(self, input_batch, finished_req_ids) -> None:
        """The runner applied a scheduler output: its rows, and the requests it forgot."""
        self.input_batch = input_batch
        self.forget(finished_req_ids)

    def forget(self, req_ids) -> None:
        """The one pruning rule: finished requests leave every per-request map."""
        req_ids = list(req_ids)
        for d in (self.settings, self.widths):
            for req_id in req_ids:
                d.pop(req_id, None)
        self.drafts.forget(req_ids)
        self.kv.forget(req_ids)

    def req_ids(self, num_rows: int) -> list[str]:
        """The first ``num_rows`` rows' request ids (fewer in vLLM's warm-up on a dummy
        batch, before any step)."""
        return [] if self.input_batch is None else list(self.input_batch.req_ids[:num_rows])

    # --- per request --------------------------------------------------------------------------
    def settings_of(self, req_id: str) -> RequestSettings:
        """τ, greedy mode and seed of a request, resolved on first use with the front end's
        rule. A bad override was refused in the front end (HTTP 400); one that got here anyway
        fails here, naming the request, instead of running with other settings."""
        s = self.settings.get(req_id)
        if s is None:
            params = self.requests[req_id].sampling_params
            try:
                tau, mode, fixed = request_settings(params.extra_args, self.cfg)
            except ValueError as e:
                raise ValueError(f"request {req_id!r}: {e}") from e
            s = self.settings[req_id] = RequestSettings(tau, mode == "exact",
                                                        request_seed(params, req_id), fixed)
        return s

    def rows(self, req_ids: list[str]) -> Rows:
        """The batch rows' settings, whether each is greedy (vLLM's host temperatures) and its
        class for the speculation policy."""
        settings = [self.settings_of(r) for r in req_ids]
        greedy = is_greedy(self.input_batch.temperature_cpu[:len(req_ids)]).tolist()
        exact = [s.exact for s in settings]
        classes = [("exact" if e else "joint") if g else "sampled" for g, e in zip(greedy, exact)]
        return Rows([s.tau for s in settings], exact, [s.seed for s in settings], greedy,
                    classes, any(s.fixed for s in settings))

    # --- the batch ----------------------------------------------------------------------------
    def batch_plan(self, num_rows: int, vocab_size: int, beam_width: int
                   ) -> tuple[list[bool], CandidatePlan]:
        """Per batch, on the host: which rows are greedy, and how draft_candidates processes
        them, from vLLM's own host arrays (temperature_cpu, top_k_cpu, top_p_cpu; no device
        read)."""
        ib = self.input_batch
        greedy = is_greedy(ib.temperature_cpu[:num_rows]).tolist()
        return greedy, plan_candidates(vocab_size, beam_width, greedy,
                                       ib.top_k_cpu[:num_rows].tolist(),
                                       ib.top_p_cpu[:num_rows].tolist())


def row_sampling_params(sampling_metadata, num_rows: int, device):
    """[num_rows] temperature (0 = greedy), top-k and top-p (None when no row uses them), from
    vLLM's SamplingMetadata."""
    if sampling_metadata.temperature is None:  # all greedy
        temp = torch.zeros(num_rows, dtype=torch.float32, device=device)
    else:
        temp = sampling_metadata.temperature[:num_rows].to(torch.float32)
    top_k = None if sampling_metadata.top_k is None else sampling_metadata.top_k[:num_rows]
    top_p = None if sampling_metadata.top_p is None else sampling_metadata.top_p[:num_rows]
    return temp, top_k, top_p
