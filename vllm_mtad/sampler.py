"""MTAD's acceptance rule inside vLLM's rejection sampler.

A subclass of vLLM's classic RejectionSampler that keeps everything but the accept/resample
rule: the bonus token (vLLM's Sampler), the logits processors on the target (penalties, bad
words, allowed tokens, min_tokens), temperature/top-k/top-p (vLLM's apply_sampling_constraints),
and logprobs. The rule itself is vllm_mtad.core's: the longest draft prefix whose joint
likelihood ratio p̃/q̃ passes τ, then one token from p̃ at the next position (vLLM's bonus token
when the whole draft is accepted). Greedy rows compare unprocessed (after logits processors,
before temperature/top-k/top-p) target distributions, or, in "exact" mode, argmaxes.

Output: vLLM's format, int32 [num_requests, max_spec_len + 1], accepted drafts then the extra
token, padded with -1; vLLM's spec-decode metrics derive from it unchanged.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from vllm.v1.outputs import SamplerOutput
from vllm.v1.sample import rejection_sampler as vllm_rs
from vllm.v1.sample.rejection_sampler import RejectionSampler

from vllm_mtad.config import MTADConfig, request_settings
from vllm_mtad.core import accepted_lengths, assemble_output, extra_tokens, is_greedy
from vllm_mtad.proposer import request_seed
from vllm_mtad.log import get_logger

logger = get_logger(__name__)


def num_valid_prefix(drafts: list[int]) -> int:
    """Length of the row's draft positions up to its padding (-1 past its own count)."""
    n = len(drafts)
    while n and drafts[n - 1] == -1:
        n -= 1
    return n


class MTADRejectionSampler(RejectionSampler):
    def __init__(self, sampler, spec_config, device, runner, mtad: MTADConfig):
        super().__init__(sampler, spec_config, device)
        self.runner = runner
        self.mtad = mtad
        self._warned_missing_draft = False

    def forward(self, metadata, draft_probs, logits, sampling_metadata) -> SamplerOutput:
        assert metadata.max_spec_len <= vllm_rs.MAX_SPEC_LEN
        if metadata.target_logits_indices.numel() == 0:
            # No request has drafts (e.g. an all-prefill step): sample as vLLM's
            # non-speculative path does. (Going on would hand vLLM's apply_top_k_only an empty
            # tensor, which fails when a request uses top-k without top-p.)
            return self.sampler(logits=logits[metadata.bonus_logits_indices],
                                sampling_metadata=sampling_metadata)
        # The bonus token, exactly as vLLM samples it.
        bonus_out = self.sampler(
            logits=logits[metadata.bonus_logits_indices],
            sampling_metadata=replace(sampling_metadata, max_num_logprobs=-1),
            predict_bonus_token=True,
            logprobs_mode_override=("processed_logits" if self.is_processed_logprobs_mode
                                    else "raw_logits"))
        # [num_requests, 1] int32
        bonus_token_ids = bonus_out.sampled_token_ids
        # Target logits at the draft positions: [num_draft_tokens, V] float32.
        raw_target_logits = logits[metadata.target_logits_indices].to(torch.float32)
        target_logits = raw_target_logits
        if not self.is_processed_logprobs_mode:
            target_logits = target_logits.clone()
        target_logits = self.apply_logits_processors(target_logits, sampling_metadata, metadata)
        unconstrained = target_logits.clone()  # greedy rows: before temperature/top-k/top-p
        target_logits = vllm_rs.apply_sampling_constraints(
            target_logits, metadata.cu_num_draft_tokens, sampling_metadata)

        output_token_ids = self._accept(metadata, target_logits, unconstrained, bonus_token_ids,
                                        sampling_metadata)

        logprobs_tensors = None
        if sampling_metadata.max_num_logprobs is not None:
            logprobs_tensors = self._get_logprobs_tensors(
                sampling_metadata.max_num_logprobs, metadata, logits,
                target_logits if self.is_processed_logprobs_mode else raw_target_logits,
                bonus_out.logprobs_tensors.logprobs, output_token_ids)
        return SamplerOutput(sampled_token_ids=output_token_ids, logprobs_tensors=logprobs_tensors)

    def _accept(self, metadata, target_logits, unconstrained, bonus_token_ids, sampling_metadata):
        num_draft = metadata.num_draft_tokens  # list, per request
        B = len(num_draft)
        gamma = metadata.max_spec_len
        dev = target_logits.device

        req_ids = self.runner.input_batch.req_ids[:B]
        requests = self.runner.requests
        temp = (torch.zeros(B, device=dev) if sampling_metadata.temperature is None
                else sampling_metadata.temperature[:B].to(torch.float32))
        greedy = is_greedy(temp)

        # Pad every request to γ draft positions (+1 for the bonus row): [B, γ] indices into
        # the flat [num_draft_tokens] rows; -1 drafts past a request's own count end its chain.
        counts = torch.tensor(num_draft, device=dev)
        starts = metadata.cu_num_draft_tokens.to(torch.int64) - counts
        j = torch.arange(gamma, device=dev)
        valid = j[None, :] < counts[:, None]
        flat = (starts[:, None] + j[None, :]).clamp(min=0, max=max(target_logits.shape[0] - 1, 0))
        drafts = torch.where(valid, metadata.draft_token_ids[flat].to(torch.int64),
                             torch.full_like(flat, -1))

        rows_lp = torch.where(greedy[:, None, None], unconstrained[flat].log_softmax(-1),
                              target_logits[flat].log_softmax(-1))  # [B, γ, V]
        V = rows_lp.shape[-1]
        target_lp = torch.cat([rows_lp, rows_lp.new_zeros(B, 1, V)], dim=1)  # bonus row unused

        draft_lp, tau, exact, seeds = self._request_inputs(req_ids, requests, drafts, B, gamma,
                                                           dev)
        k = accepted_lengths(drafts, draft_lp, target_lp, tau, greedy & exact)
        positions = torch.tensor(
            self.runner.input_batch.num_computed_tokens_cpu[:B], dtype=torch.int64,
            device=dev) + 1  # position of the first draft token
        # k* < number of drafts: a token from p̃ at position k*+1; else vLLM's bonus token.
        extra = extra_tokens(target_lp, k.clamp(max=gamma - 1), greedy, seeds, positions)
        extra = torch.where(k >= counts, bonus_token_ids[:, 0].to(torch.int64), extra)
        return assemble_output(drafts, k, extra)

    def _request_inputs(self, req_ids, requests, drafts, B, gamma, dev):
        """Per request: draft log-probs [B, γ], τ [B], exact-greedy flag [B], seeds [B]."""
        store = self.runner.drafter.drafts
        draft_lp = torch.zeros(B, gamma, dtype=torch.float32)
        tau = torch.empty(B, dtype=torch.float32)
        exact = torch.zeros(B, dtype=torch.bool)
        seeds = torch.empty(B, dtype=torch.int64)
        scheduled = drafts.tolist()
        for b, req_id in enumerate(req_ids):
            params = requests[req_id].sampling_params
            try:
                tau[b], mode = request_settings(params.extra_args, self.mtad)
            except ValueError:  # refused in the front end; never crash the engine here
                tau[b], mode = self.mtad.acceptance_threshold, self.mtad.greedy_acceptance
            exact[b] = mode == "exact"
            seeds[b] = request_seed(params, req_id)
            row = scheduled[b][: num_valid_prefix(scheduled[b])]
            lps = store.logprobs_for(req_id, row) if row else []
            if lps is None:
                # Drafts without their probabilities (not from this drafter): treated as
                # q = 1, i.e. accepted while the target's joint probability passes τ.
                if not self._warned_missing_draft:
                    logger.warning("vllm-mtad: request %s has drafts without draft "
                                   "probabilities; accepting them on the target's alone",
                                   req_id)
                    self._warned_missing_draft = True
            else:
                draft_lp[b, : len(lps)] = torch.tensor(lps)
        return draft_lp.to(dev), tau.to(dev), exact.to(dev), seeds.to(dev)
