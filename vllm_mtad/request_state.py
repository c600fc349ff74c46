"""What one MTAD runner knows per request, in one object its drafter and its sampler share.

:class:`MTADRequestState` is created where the model runner is patched
(patches/worker/patch_gpu_model_runner.py) and handed to both
:class:`vllm_mtad.proposer.MTADProposer` and :class:`vllm_mtad.sampler.MTADRejectionSampler`;
neither holds the runner nor the other. It holds:

- the step's rows: vLLM's ``InputBatch`` of the current step and the runner's requests
  (``CachedRequestState`` by id), handed over at the start of every step;
- each request's MTAD settings — τ, greedy mode ("joint"/"exact") and noise seed — resolved
  once, with the front end's rule (:func:`vllm_mtad.config.request_settings`);
- each request's latest draft (tokens and draft log-probs, :class:`DraftStore`), and, only
  while a baseline rule asks for it, the draft's distribution at each of its positions
  (:class:`DraftDistributions`);
- the batch's candidate sizing (:meth:`MTADRequestState.candidate_sizing`: greedy rows and how
  the draft's and the target's distributions are processed);
- the speculation policy's per-request bookkeeping: the beams of each request's latest draft
  (its acceptance statistics are counted by that width), where its draft KV stops
  (:class:`vllm_mtad.draft_kv.DraftKVTracker`), and what pricing a step reads of the
  rows (:meth:`MTADRequestState.demand`). The policy's engine-wide state — cost lines,
  acceptance counts, chosen plans — is the
  :class:`vllm_mtad.policy.controller.SpeculationController`'s.

One pruning rule: a request is forgotten everywhere when vLLM's runner forgets it (the
scheduler's ``finished_req_ids``, at the start of the step that reports them).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from vllm_mtad.config import MTADConfig, request_settings
from vllm_mtad.core.processing import Candidates, CandidateSizing, is_greedy, size_candidates
from vllm_mtad.policy.batch import RowDemand
from vllm_mtad.draft_kv import DraftKVTracker


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
    req_ids: tuple = ()  # the rows' request ids (the policy's cold start counts requests)


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


class DraftDistributions:
    """The draft's processed distribution q̃ at each position of each request's latest
    one-beam draft, for a rule that reads more of the draft than its tokens' log-probs (FLy's
    residual at T > 0, a benchmark's baseline: vllm_mtad.sampler.FlyRule). Kept
    only while such a rule is on: MTAD's own rule never reads it."""

    def __init__(self):
        self._rows: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}

    def put(self, req_ids: list[str], steps: list[Candidates]) -> None:
        """steps: the round's candidates, one [B, K] per draft position."""
        lp = torch.stack([c.logprobs for c in steps], dim=1)  # [B, γ, K]
        ids = None if steps[0].token_ids is None else torch.stack(
            [c.token_ids for c in steps], dim=1)
        for b, req_id in enumerate(req_ids):
            self._rows[req_id] = (lp[b], None if ids is None else ids[b])

    def forget(self, req_ids) -> None:
        for req_id in req_ids:
            self._rows.pop(req_id, None)

    def at(self, req_ids: list[str], index: torch.Tensor,
           needed: torch.Tensor | None = None) -> Candidates:
        """q̃ at draft position ``index`` ([B] int64, 0-based) of each request's latest draft,
        [B, K] (sparse rows padded with probability 0; all dense if one is). ``needed`` ([B]
        bool, None: all): the rows the rule will read. A row not needed and not kept (a
        request in its prefill step, which has no draft yet) holds a placeholder, probability
        1 on token 0; a needed row not kept is an error."""
        want = [True] * len(req_ids) if needed is None else needed.tolist()[:len(req_ids)]
        missing = [r for r, w in zip(req_ids, want) if w and r not in self._rows]
        if missing:
            raise RuntimeError(f"no draft distribution kept for requests {missing[:4]}: the "
                               "baseline rule needs one-beam drafts made while it was on")
        kept = [self._rows.get(r) for r in req_ids]
        kept += [None] * (index.shape[0] - len(kept))  # vLLM's dummy rows past the requests
        rows = []
        for entry, j in zip(kept, index.tolist()):
            if entry is None:
                rows.append(None)
                continue
            lp, ids = entry
            j = min(j, lp.shape[0] - 1)
            rows.append((lp[j], None if ids is None else ids[j]))
        dev, none = index.device, torch.zeros(len(rows), dtype=torch.bool, device=index.device)
        present = [r for r in rows if r is not None]
        dtype = present[0][0].dtype if present else torch.float32
        if any(ids is None for _, ids in present):  # one dense row: all dense
            V = next(lp.shape[0] for lp, ids in present if ids is None)
            placeholder = torch.full((V,), float("-inf"), dtype=dtype, device=dev)
            placeholder[0] = 0.0
            dense = [placeholder if r is None else r[0].to(dev, dtype) if r[1] is None else
                     torch.full((V,), float("-inf"), dtype=dtype,
                                device=dev).scatter(0, r[1].to(dev), r[0].to(dev, dtype))
                     for r in rows]
            return Candidates(torch.stack(dense), None, none)
        one = (torch.zeros(1, dtype=dtype, device=dev),
               torch.zeros(1, dtype=torch.int64, device=dev))
        rows = [one if r is None else (r[0].to(dev, dtype), r[1].to(dev)) for r in rows]
        K = max(lp.shape[0] for lp, _ in rows)
        pad = lambda t, v: torch.nn.functional.pad(t, (0, K - t.shape[0]), value=v)  # noqa: E731
        return Candidates(torch.stack([pad(lp, float("-inf")) for lp, _ in rows]),
                          torch.stack([pad(ids, 0) for _, ids in rows]), none)


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
        # The draft's distributions of each request's latest draft; None: not kept (only a
        # baseline rule asks for them: vllm_mtad.worker_rpc.use_baseline_rule).
        self.distributions: DraftDistributions | None = None
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
        if self.distributions is not None:
            self.distributions.forget(req_ids)
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
                    classes, any(s.fixed for s in settings), tuple(req_ids))

    def demand(self, req_ids: list[str], starts, classes: list[str]) -> RowDemand:
        """What pricing the step reads of its rows: output tokens each may still generate and
        in all, the prompt tokens the draft reads of each (a prefix-cache hit's are cached),
        and what the draft would catch up on if this step drafted (of which the prompts of
        requests whose prompt is still being read: arrivals). ``starts``: each row's
        computed tokens."""
        kv = self.kv
        owed = kv.owed(req_ids, starts) if kv.skipped_any else {}
        left, prompts, budgets, arriving = [], [], [], 0
        for r, start in zip(req_ids, starts):
            req, start = self.requests[r], int(start)
            max_tokens = getattr(req.sampling_params, "max_tokens", None)
            left.append(max(1, (max_tokens or 0) - len(req.output_token_ids)))
            budgets.append(max_tokens or float("inf"))  # vLLM always sets one for generation
            prompts.append(max(0, req.num_prompt_tokens - kv.read_from(r, start)))
            if r in owed and start < req.num_prompt_tokens:
                arriving += owed[r]
        return RowDemand(classes, left, prompts, budgets, sum(owed.values()), arriving)

    # --- the batch ----------------------------------------------------------------------------
    def candidate_sizing(self, num_rows: int, vocab_size: int, beam_width: int
                         ) -> tuple[list[bool], CandidateSizing]:
        """Per batch, on the host: which rows are greedy, and how draft_candidates processes
        them, from vLLM's own host arrays (temperature_cpu, top_k_cpu, top_p_cpu; no device
        read)."""
        ib = self.input_batch
        greedy = is_greedy(ib.temperature_cpu[:num_rows]).tolist()
        return greedy, size_candidates(vocab_size, beam_width, greedy,
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
