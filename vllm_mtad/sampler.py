"""MTAD's acceptance rule inside vLLM's rejection sampler.

A subclass of vLLM's classic RejectionSampler. Its ``forward`` follows vLLM's own
``RejectionSampler.forward`` (vllm/v1/sample/rejection_sampler.py, vLLM 0.32) step for step —
the bonus token from vLLM's Sampler, the logits processors on the target (penalties, bad words,
allowed tokens, min_tokens), logprobs by vLLM's ``_get_logprobs_tensors`` — and swaps two calls:
temperature/top-k/top-p by one k-selection per row when every sampled request uses top-k (the
rule of vLLM's ``apply_sampling_constraints``, which runs otherwise; see :class:`_FlatTarget`),
and vLLM's ``rejection_sample`` for vllm_mtad.core's
:func:`~vllm_mtad.core.acceptance.mtad_accept` (the longest draft prefix
whose joint likelihood ratio p̃/q̃ passes τ, then one token from p̃ at the next position; vLLM's
bonus token when the whole draft is accepted). Greedy rows compare unprocessed target
distributions (after logits processors, before temperature/top-k/top-p), or, in "exact" mode,
argmaxes.

What it reads of the target, without [B, γ, V] temporaries beyond vLLM's own: the log-prob of
each draft token (a gather and a log-sum-exp per row, before and after the sampling
constraints), the argmax per row, and, for the extra token, the K most likely tokens of one row
per request (all V only when a sampled request has no top-k). The draft log-probabilities come
on the device through vLLM's ``draft_probs`` channel ([num_draft_tokens, 1] here).

Output: vLLM's format, int32 [num_requests, max_spec_len + 1], accepted drafts then the extra
token, padded with -1; vLLM's spec-decode metrics derive from it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from vllm.v1.outputs import SamplerOutput
from vllm.v1.sample import rejection_sampler as vllm_rs
from vllm.v1.sample.rejection_sampler import RejectionSampler

from vllm_mtad.config import MTADConfig
from vllm_mtad.core import Bonus, NoiseKeys, is_greedy, mask_top_k_top_p, mtad_accept
from vllm_mtad.core.fly import (DEFAULT_ENTROPY_THRESHOLD, FlyDraft, FlyGate, default_window,
                                fly_accept, top_k_entropy)
from vllm_mtad.core.processing import Candidates, draft_candidates
from vllm_mtad.policy.controller import SpeculationController
from vllm_mtad.request_state import MTADRequestState, row_sampling_params


class MTADRejectionSampler(RejectionSampler):
    def __init__(self, sampler, spec_config, device, mtad: MTADConfig, state: MTADRequestState,
                 speculation: SpeculationController):
        super().__init__(sampler, spec_config, device)
        self.mtad = mtad
        self.state = state  # the requests' settings and drafts, the step's rows
        self.speculation = speculation  # the policy's acceptance statistics
        # Where each verify step's draft log-probs came from (read with worker_rpc.drafter_stats).
        self.stats = {"draft_probs_channel": 0, "draft_store": 0}
        # Rows judged without their draft's probabilities (device; read by drafter_stats only).
        self.store_misses = torch.zeros((), dtype=torch.int64, device=device)
        # The bonus token's sampler: vLLM's, with top-k/top-p by k-selection where vLLM's own
        # would sort the vocabulary (see bonus_sampler).
        self.bonus_sampler = bonus_sampler(sampler, state)
        # A benchmark's baseline on the same drafts (worker_rpc.use_baseline_rule): FLy's rule
        # instead of MTAD's; None, MTAD's. Not a setting of the plugin.
        self.baseline_rule: FlyRule | None = None

    def forward(self, metadata, draft_probs, logits, sampling_metadata) -> SamplerOutput:
        assert metadata.max_spec_len <= vllm_rs.MAX_SPEC_LEN
        self.speculation.verifying(sum(metadata.num_draft_tokens))  # a host list
        if metadata.target_logits_indices.numel() == 0:
            # No request has drafts (a step the policy drafts nothing in, an all-prefill
            # step): one token per request, as vLLM's non-speculative path samples it, by the
            # bonus token's sampler (its top-k/top-p by k-selection on CPU: the same tokens,
            # without vLLM's sort of the vocabulary; docs/policy-decisions.md
            # #no-draft-steps-sampler). (Going on would hand vLLM's apply_top_k_only an empty tensor, which fails when a
            # request uses top-k without top-p.)
            return self.bonus_sampler(logits=logits[metadata.bonus_logits_indices],
                                      sampling_metadata=sampling_metadata)
        # The bonus token, as vLLM samples it (the top-k/top-p mask by k-selection on CPU).
        bonus_out = self.bonus_sampler(
            logits=logits[metadata.bonus_logits_indices],
            sampling_metadata=replace(sampling_metadata, max_num_logprobs=-1),
            predict_bonus_token=True,
            logprobs_mode_override=("processed_logits" if self.is_processed_logprobs_mode
                                    else "raw_logits"))
        # [num_requests, 1] int32
        bonus_token_ids = bonus_out.sampled_token_ids
        # Target logits at the draft positions: [num_draft_tokens, V] float32 (as vLLM).
        raw_target_logits = logits[metadata.target_logits_indices].to(torch.float32)
        target_logits = raw_target_logits
        if not self.is_processed_logprobs_mode:
            target_logits = target_logits.clone()
        target_logits = self.apply_logits_processors(target_logits, sampling_metadata, metadata)

        need_processed = (sampling_metadata.max_num_logprobs is not None
                          and self.is_processed_logprobs_mode)
        req_ids = self.state.req_ids(len(metadata.num_draft_tokens))
        rows = self.state.rows(req_ids)
        # Greedy rows read their draft tokens' target log-probs only under joint acceptance
        # ("exact" compares argmaxes); rows without a request (vLLM's warm-up) count as joint.
        joint = ("joint" in rows.classes or len(req_ids) < len(metadata.num_draft_tokens)
                 or self.baseline_rule is not None)  # (FLy reads them too)
        target = _FlatTarget(metadata, target_logits, sampling_metadata, self.state,
                             need_processed, greedy_logprobs=joint)
        output_token_ids = self._accept(metadata, target, bonus_token_ids, draft_probs,
                                        sampling_metadata, req_ids, rows)

        logprobs_tensors = None
        if sampling_metadata.max_num_logprobs is not None:
            logprobs_tensors = self._get_logprobs_tensors(
                sampling_metadata.max_num_logprobs, metadata, logits,
                target.processed_logits if self.is_processed_logprobs_mode
                else raw_target_logits,
                bonus_out.logprobs_tensors.logprobs, output_token_ids)
        return SamplerOutput(sampled_token_ids=output_token_ids, logprobs_tensors=logprobs_tensors)

    def _accept(self, metadata, target: "_FlatTarget", bonus_token_ids, draft_probs,
                sampling_metadata, req_ids, rows):
        B, dev = target.B, target.device
        state = self.state
        greedy = ~target.sampled
        drafts = target.drafts  # [B, γ], -1 past each request's own count

        tau, exact, seeds = list(rows.tau), list(rows.exact), list(rows.seeds)
        num_real = len(req_ids)
        if len(req_ids) < B:
            # Rows without a request: vLLM's warm-up (_dummy_sampler_run, profile_run) calls
            # the sampler on a dummy batch with an empty input batch.
            pad = B - len(req_ids)
            tau += [self.mtad.acceptance_threshold] * pad
            exact += [False] * pad
            seeds += [0] * pad
        draft_lp, known = self._draft_logprobs(draft_probs, target, req_ids)
        if known is not None:  # drafts MTAD did not make (no probabilities): accept none
            drafts = torch.where(known[:, None], drafts, -1)
        positions = _positions(state.input_batch, B)
        to = lambda x, dtype: torch.tensor(x, dtype=dtype).to(dev, non_blocking=True)  # noqa: E731
        keys = NoiseKeys(greedy, to(seeds, torch.int64), positions.to(dev, non_blocking=True),
                         any_sampled=not sampling_metadata.all_greedy)
        if self.baseline_rule is not None:
            result = self._fly(drafts, draft_lp, target, bonus_token_ids[:, 0], keys, req_ids)
        else:
            result = mtad_accept(drafts, draft_lp, target, to(tau, torch.float32),
                                 to(exact, torch.bool), keys,
                                 bonus=Bonus(target.counts, bonus_token_ids[:, 0]))
        if num_real:  # acceptance statistics of the speculation policy (device-side counts)
            widths = [state.widths.get(r, self.mtad.beam_width) for r in req_ids]
            self.speculation.record_acceptance(rows.classes, widths, target.counts[:num_real],
                                               result.prefix_accepted[:num_real])
        return result.output_token_ids

    def _fly(self, drafts, draft_lp, target: "_FlatTarget", bonus_token_ids, keys, req_ids):
        """FLy's rule on this step's drafts (the baseline): greedy rows with
        target-only acceptance, sampled rows with the p/q test and the residual at a rejection
        (their drafts must be one-beam samples, whose distributions the drafter kept). Its
        entropy gate reads the target's processed distribution at each draft position (greedy
        rows: the logits as vLLM's greedy sampling reads them, in an all-greedy batch)."""
        rule = self.baseline_rule
        if keys.sampled_any_host_sync():
            wide = [r for r, g in zip(req_ids, keys.greedy.tolist())
                    if not g and self.state.widths.get(r, 1) != 1]
            if wide:
                raise RuntimeError("the FLy comparison rule verifies one-beam drafts only "
                                   f"(force W=1); requests {wide[:4]} drafted with more beams")
        if target.processed_logits is not None:
            entropy = top_k_entropy(target.processed_logits.log_softmax(dim=-1))  # [N]
        else:  # sampled rows with top-k: the processed distribution's candidates
            entropy = top_k_entropy(target.cands.logprobs)
        entropy = torch.where(target.valid, entropy[target.flat], 0.0)  # [B, γ]
        window = rule.window if rule.window is not None else (
            default_window(target.gamma) if target.gamma >= 2 else 0)  # γ = 1: no window
        draft = FlyDraft(drafts, draft_lp,
                         lambda index, needed: self.state.distributions.at(req_ids, index,
                                                                           needed))
        return fly_accept(draft, target, entropy, Bonus(target.counts, bonus_token_ids),
                          FlyGate(window, rule.entropy_threshold), keys)

    def _draft_logprobs(self, draft_probs, target: "_FlatTarget", req_ids):
        """[B, γ] float32 draft log-probs of the scheduled draft tokens (0 past each count),
        and [B] bool, rows whose drafts are MTAD's (None: all of them)."""
        if draft_probs is not None:  # vLLM's channel: [num_draft_tokens, 1]
            assert draft_probs.ndim == 2 and draft_probs.shape[1] == 1, (
                f"MTAD's draft_probs are [num_draft_tokens, 1], got {tuple(draft_probs.shape)}")
            self.stats["draft_probs_channel"] += 1
            return torch.where(target.valid, draft_probs[target.flat, 0],
                               torch.zeros((), device=target.device)), None
        if len(req_ids) < target.B:  # vLLM's warm-up on a dummy batch: nothing to look up
            return torch.zeros(target.B, target.gamma, device=target.device), None
        # The channel is empty: a request missing from vLLM's last round (skipped by the
        # scheduler for a step) is verified against its own latest draft, from the store.
        # Drafts the store does not hold are not MTAD's: vLLM's placeholder drafts of token 0,
        # without probabilities, when it skips the drafter for a batch (near max_model_len it
        # no longer does for MTAD runners: patch_gpu_model_runner). Those rows accept no draft
        # token (their step emits the target's own token), so MTAD never accepts a token its
        # draft did not propose.
        logprobs, matches = self.state.drafts.lookup(list(req_ids), target.drafts)
        self.stats["draft_store"] += 1
        self.store_misses += (~matches).sum()
        return torch.where(matches[:, None], logprobs, 0.0), matches


class _FlatTarget:
    """vllm_mtad.core's TargetView over vLLM's flat target logits.

    Legend: N = draft tokens in the step (all requests), B = requests, γ = max_spec_len,
    V = vocabulary, K = candidates per row. Reads, per draft token, its log-prob before the
    sampling constraints (greedy rows compare unprocessed distributions) and after them
    (sampled rows), and the argmax. When every sampled request uses top-k (the paper's
    setting), the processed distribution comes from one k-selection per row
    (vllm_mtad.core.processing.draft_candidates, the rule the draft side uses) instead of
    vLLM's full sort; otherwise, and when processed logprobs are requested, from vLLM's
    apply_sampling_constraints itself. The two agree but for the order among tokens with equal
    logits at the top-p boundary: vLLM's CPU sort is unstable (its choice there is arbitrary),
    the k-selection path uses the stable order of processed_logprobs, so the target's p̃ and
    the draft's q̃ break such ties the same way.
    """

    def __init__(self, metadata, target_logits: torch.Tensor, sampling_metadata,
                 state: MTADRequestState, need_processed_logits: bool,
                 greedy_logprobs: bool = True):
        counts = metadata.num_draft_tokens  # list, per request
        self.B, self.gamma = B, gamma = len(counts), metadata.max_spec_len
        self.device = dev = target_logits.device
        N, self.V = target_logits.shape
        # [B] int64, and [B, γ] indices into the N rows; -1 drafts past a request's own count.
        self.counts = torch.tensor(counts, dtype=torch.int64).to(dev, non_blocking=True)
        starts = metadata.cu_num_draft_tokens.to(torch.int64) - self.counts
        j = torch.arange(gamma, device=dev)
        self.valid = j[None, :] < self.counts[:, None]
        self.flat = (starts[:, None] + j[None, :]).clamp(min=0, max=max(N - 1, 0))
        tok = metadata.draft_token_ids.to(torch.int64)  # [N]; -1 marks an invalid draft
        self.drafts = torch.where(self.valid, tok[self.flat], torch.full_like(self.flat, -1))
        tok = tok.clamp(min=0)  # (the rule ends a chain at -1; any value will do to gather)

        temp, _, _ = row_sampling_params(sampling_metadata, B, dev)
        self.sampled = ~is_greedy(temp)  # [B]
        per_token = lambda x: None if x is None else x[:B].repeat_interleave(  # noqa: E731
            self.counts, output_size=N)
        greedy_tok = ~per_token(self.sampled)  # [N]
        lp = torch.zeros(N, device=dev)
        self.argmax = torch.zeros(N, dtype=torch.int64, device=dev)
        if not sampling_metadata.all_random:  # greedy rows: before the constraints
            if greedy_logprobs:  # (not read when every greedy row is "exact")
                lp = (target_logits.gather(1, tok[:, None])[:, 0]
                      - target_logits.logsumexp(dim=-1))
            self.argmax = target_logits.argmax(dim=-1)

        self.cands = None  # Candidates over the N rows, when sparse
        self.processed_logits = None  # [N, V], when dense
        if not sampling_metadata.all_greedy:
            _, sizing = state.candidate_sizing(B, self.V, 1)
            if sizing.num_candidates is not None and not need_processed_logits:
                self.cands = sparse_candidates_unless_overflow_host_sync(
                    target_logits, per_token(temp), per_token(sampling_metadata.top_k),
                    per_token(sampling_metadata.top_p), replace(sizing, any_greedy=False))
            if self.cands is not None:
                hit = self.cands.token_ids == tok[:, None]  # [N, K]
                processed = torch.where(hit, self.cands.logprobs,
                                        float("-inf")).amax(dim=1)  # -inf: not a candidate
            else:
                # vLLM's temperature/top-k/top-p (in place, as in vLLM's sampler).
                self.processed_logits = vllm_rs.apply_sampling_constraints(
                    target_logits, metadata.cu_num_draft_tokens, sampling_metadata)
                processed = (self.processed_logits.gather(1, tok[:, None])[:, 0]
                             - self.processed_logits.logsumexp(dim=-1))
            lp = torch.where(greedy_tok, lp, processed)
        else:
            self.processed_logits = target_logits  # vLLM leaves all-greedy logits as they are
        self.token_logprobs = lp  # [N]

    def at_drafts(self, draft_token_ids):
        """The answers for this view's own drafts (``self.drafts``, read from vLLM's metadata
        once): ``draft_token_ids`` must be those, with some positions set to -1 (drafts the
        sampler refuses); the answers there are 0 and ignored by the rule."""
        assert draft_token_ids.shape == self.drafts.shape, (
            f"draft_token_ids must be [B, γ] = {tuple(self.drafts.shape)}, "
            f"got {tuple(draft_token_ids.shape)}")
        valid = draft_token_ids >= 0
        return (torch.where(valid, self.token_logprobs[self.flat], 0.0),
                torch.where(valid, self.argmax[self.flat], 0))

    def candidates_at(self, index):
        rows = self.flat.gather(1, index[:, None])[:, 0]  # [B] rows of the N
        no_overflow = torch.zeros(self.B, dtype=torch.bool, device=self.device)
        if self.cands is not None:
            lp, ids = self.cands.logprobs[rows], self.cands.token_ids[rows]  # [B, K]
            # Greedy rows take the argmax over the whole row (the first among ties, as vLLM's
            # greedy sampling): it becomes their only candidate.
            first = torch.arange(lp.shape[1], device=self.device)[None, :] == 0
            greedy = ~self.sampled[:, None]
            lp = torch.where(greedy, torch.where(first, 0.0, float("-inf")), lp)
            ids = torch.where(greedy & first, self.argmax[rows][:, None], ids)
            return Candidates(lp, ids, no_overflow)
        logits = self.processed_logits[rows]  # [B, V]
        return Candidates(logits.log_softmax(dim=-1), None, no_overflow)


class SelectingTopKTopP(torch.nn.Module):
    """vLLM's TopKTopPSampler with the top-k/top-p mask computed by one k-selection per row
    (:func:`vllm_mtad.core.processing.draft_candidates`, the rule MTAD's draft and target
    rows use) instead of vLLM's sort of the whole vocabulary; the masked logits then go to
    vLLM's own sampler with no top-k/top-p left to apply (its noise, generators and
    processed logprobs unchanged). Taken when the rows' top-k covers every sampled row and no
    row's ties at its k-th value reach past the candidates; otherwise vLLM's own call.

    Why: on CPU vLLM sorts each row's V logits whenever a request uses top-p (its
    apply_top_k_top_p without Triton), which costs far more than one k-selection a row
    (docs/policy-decisions.md#bonus-token-k-selection). The masks agree but for the order among tokens with equal logits at the top-p
    boundary (vLLM's sort is unstable there; this one is the stable order of
    processed_logprobs) and float rounding of the normaliser: tests/test_sampler.py
    compares the tokens drawn."""

    def __init__(self, inner: torch.nn.Module, state: MTADRequestState):
        super().__init__()
        self.inner = inner
        self.state = state
        self.selected = 0  # calls that took the k-selection (host counters, for tests)
        self.fallbacks = 0

    def forward(self, logits, generators, k, p):
        masked = self._mask(logits, k, p)
        if masked is None:
            self.fallbacks += 1
            return self.inner(logits, generators, k, p)
        self.selected += 1
        return self.inner(masked, generators, None, None)

    def _mask(self, logits: torch.Tensor, k, p) -> torch.Tensor | None:
        R, V = logits.shape
        if k is None or p is None or self.state.input_batch is None \
                or len(self.state.req_ids(R)) < R:  # top-k only: vLLM's sorts nothing
            return None
        greedy, sizing = self.state.candidate_sizing(R, V, 1)
        return mask_top_k_top_p(logits, k, p, sizing,
                                torch.tensor(greedy, dtype=torch.bool).to(logits.device))


def bonus_sampler(sampler, state: MTADRequestState):
    """``sampler`` (vLLM's Sampler) with its top-k/top-p step replaced by
    :class:`SelectingTopKTopP` where vLLM's would sort the vocabulary on the host (its
    PyTorch path: no Triton, a CPU or native forward); ``sampler`` itself otherwise. It draws
    the bonus tokens and the tokens of steps without drafts (MTADRejectionSampler.forward). A
    copy: the runner's own sampler stays vLLM's."""
    import copy

    from vllm.v1.sample.ops import topk_topp_sampler as ops

    inner = getattr(sampler, "topk_topp_sampler", None)
    forward = getattr(getattr(inner, "forward", None), "__func__", None)
    if getattr(ops, "HAS_TRITON", True) or forward not in (
            ops.TopKTopPSampler.forward_cpu, ops.TopKTopPSampler.forward_native):
        return sampler
    bonus = copy.copy(sampler)
    bonus._modules = dict(sampler._modules)  # (a shallow copy would share the dict)
    bonus.topk_topp_sampler = SelectingTopKTopP(inner, state)
    return bonus


def sparse_candidates_unless_overflow_host_sync(logits, temperature, top_k, top_p, sizing):
    """The processed distribution of the target rows as candidates (one k-selection per row),
    or None when some row's ties at its k-th value reach past the K candidates (rare: the
    slack grows with k); the caller then takes vLLM's dense path. Reading that flag is a host
    sync: one per verify step, on batches where every sampled request uses top-k."""
    cands = draft_candidates(logits, temperature, top_k, top_p, sizing)
    return None if bool(cands.overflow.any()) else cands


def _positions(input_batch, num_rows: int) -> torch.Tensor:
    """[num_rows] int64 on the host: each row's position after its computed tokens (rows of
    vLLM's warm-up before any step: 1)."""
    if input_batch is None:
        return torch.ones(num_rows, dtype=torch.int64)
    return torch.from_numpy(input_batch.num_computed_tokens_cpu[:num_rows].astype("int64")) + 1


@dataclass(frozen=True)
class FlyRule:
    """FLy's settings as published: the window (None: min(6, γ − 1) of the step's γ) and the
    entropy threshold (nats, over the target's top-3 probabilities)."""

    window: int | None = None
    entropy_threshold: float = DEFAULT_ENTROPY_THRESHOLD
