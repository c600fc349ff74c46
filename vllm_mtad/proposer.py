"""MTAD's drafter for vLLM: beam drafts on the paged KV cache.

A subclass of vLLM's DraftModelProposer. Its first pass is vLLM's own (the draft catches up on
the tokens the target just verified and yields the logits for the first draft position); the
W beams of every request then run as B·W rows of one draft forward per step, their KV placed
by :class:`vllm_mtad.beam_kv.BeamKVLayout` (prefix shared by block-table reference, copy-on-write
of the partially filled tail block, in the draft layers only). The beam arithmetic is
vllm_mtad.core's. The chosen beam's tokens go back to the runner; their draft log-probabilities
are kept here per request (:class:`DraftStore`) for :class:`vllm_mtad.sampler.MTADRejectionSampler`.
"""

from __future__ import annotations

import hashlib
import time

import torch
from vllm.config import CUDAGraphMode
from vllm.forward_context import set_forward_context
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.spec_decode.draft_model import DraftModelProposer

from vllm_mtad.beam_kv import BeamKVLayout
from vllm_mtad.config import from_additional_config
from vllm_mtad.core import beam_step, best_beam, is_greedy, processed_logprobs
from vllm_mtad.log import get_logger

logger = get_logger(__name__)


def request_seed(sampling_params, req_id: str) -> int:
    """The request's seed, or a stable hash of its id (identical on every TP rank)."""
    seed = getattr(sampling_params, "seed", None)
    if seed is not None:
        return int(seed)
    return int.from_bytes(hashlib.blake2b(req_id.encode(), digest_size=8).digest(), "little") >> 1


class DraftStore:
    """Each request's latest draft: its tokens and their draft log-probabilities.

    Kept per request (not per round): a running request that the scheduler skips for a step
    is verified a step later against drafts from an earlier round.
    """

    def __init__(self):
        self._drafts: dict[str, tuple[list[int], list[float]]] = {}

    def put(self, req_ids: list[str], tokens: torch.Tensor, logprobs: torch.Tensor,
            active: set[str]) -> None:
        for req_id, toks, lps in zip(req_ids, tokens.tolist(), logprobs.tolist()):
            self._drafts[req_id] = (toks, lps)
        for req_id in [r for r in self._drafts if r not in active]:  # finished requests
            del self._drafts[req_id]

    def logprobs_for(self, req_id: str, scheduled: list[int]) -> list[float] | None:
        """Draft log-probs of the scheduled draft tokens, or None if they are not this
        drafter's (a -1 marks a position the scheduler invalidated; it ends the chain)."""
        entry = self._drafts.get(req_id)
        if entry is None:
            return None
        toks, lps = entry
        n = len(scheduled)
        if n > len(toks) or any(s != t for s, t in zip(scheduled, toks) if s >= 0):
            return None
        return lps[:n]


class MTADProposer(DraftModelProposer):
    def __init__(self, vllm_config, device, runner=None):
        super().__init__(vllm_config=vllm_config, device=device, runner=runner)
        self.runner = runner  # the base class takes but does not keep it
        self.mtad = from_additional_config(vllm_config.additional_config)
        self.drafts = DraftStore()
        self._capture = False
        self._first_pass = None  # (token_indices_to_sample, common_attn_metadata)
        self._first_hidden = None  # [B, hidden] at the first draft position
        # Counters for benchmarks and tests (host-side and cheap; the timings are wall-clock
        # without device synchronisation, exact on CPU). Read with drafter_stats().
        self.stats = {"rounds": 0, "rows": 0, "narrowed_rows": 0, "beam_steps": 0,
                      "copied_blocks": 0, "first_pass_s": 0.0, "beam_steps_s": 0.0}

    # The first pass is vLLM's; these two hooks capture what it computed.
    def set_inputs_first_pass(self, **kwargs):
        num_tokens, token_indices, cad = super().set_inputs_first_pass(**kwargs)
        self._first_pass = (token_indices, cad)
        return num_tokens, token_indices, cad

    def _sample_draft_tokens(self, hidden_states, sampling_metadata):
        if self._capture:
            self._first_hidden = hidden_states
            return torch.zeros(hidden_states.shape[0], dtype=torch.int64,
                               device=hidden_states.device), None
        return super()._sample_draft_tokens(hidden_states, sampling_metadata)

    def propose(self, num_speculative_tokens: int, **kwargs) -> torch.Tensor:
        gamma = num_speculative_tokens
        if gamma == 0:
            return super().propose(num_speculative_tokens=0, **kwargs)
        started = time.perf_counter()
        self._capture = True
        try:  # vLLM's first pass only: one draft position.
            super().propose(num_speculative_tokens=1, **kwargs)
        finally:
            self._capture = False
            self.num_speculative_tokens = gamma
        token_indices, cad = self._first_pass
        sampling_metadata = kwargs["sampling_metadata"]
        B = cad.batch_size()
        W = self.mtad.beam_width
        dev = self._first_hidden.device

        p = self.positions[token_indices].to(torch.int64)  # [B] position of the bonus token
        first_draft_pos = p + 1
        req_ids = self.runner.input_batch.req_ids[:B]
        requests = self.runner.requests
        seeds = torch.tensor([request_seed(requests[r].sampling_params, r) for r in req_ids],
                             dtype=torch.int64, device=dev)
        temp, top_k, top_p = _row_sampling_params(sampling_metadata, B, dev)
        greedy = is_greedy(temp)

        layout = None
        row_width = None
        if gamma > 1:
            bt = self.runner.input_batch.block_table[self.kv_cache_gid]
            num_blocks = torch.from_numpy(bt.num_blocks_per_row[:B].copy()).to(dev)
            layout = BeamKVLayout(cad.block_table_tensor[:B].clone(), num_blocks, p, gamma, W,
                                  self.block_size, self.max_model_len)
            row_width = layout.row_beam_width

        # Step 1: W distinct tokens from the first-pass distribution.
        logits = self.model.compute_logits(self._first_hidden)  # [B, V]
        lp = processed_logprobs(logits, temp, top_k, top_p)
        state = beam_step(lp[:, None], None, W, greedy, seeds, first_draft_pos, 1, row_width)
        beams_started = time.perf_counter()
        self.stats["first_pass_s"] += beams_started - started

        # Steps 2..γ: B·W rows of one draft forward per step.
        rep = lambda t: None if t is None else t.repeat_interleave(W)  # noqa: E731
        for t in range(2, gamma + 1):
            kv = layout.step(state.parents, t)
            self._copy_blocks(kv.copy_src, kv.copy_dst)
            self.stats["copied_blocks"] += int(kv.copy_src.numel())
            logits = self._beam_forward(state.last_tokens().reshape(-1), kv)  # [B*W, V]
            lp = processed_logprobs(logits, rep(temp), rep(top_k), rep(top_p)).view(B, W, -1)
            state = beam_step(lp, state, W, greedy, seeds, first_draft_pos, t, row_width)

        tokens, draft_logprobs = best_beam(state)
        self.drafts.put(list(req_ids), tokens, draft_logprobs, set(requests))
        self.stats["beam_steps_s"] += time.perf_counter() - beams_started
        self.stats["beam_steps"] += gamma - 1
        self.stats["rounds"] += 1
        self.stats["rows"] += B
        if row_width is not None:
            self.stats["narrowed_rows"] += int((row_width < W).sum())
        return tokens

    def _copy_blocks(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy whole blocks src -> dst in every draft layer (gather first: permutation-safe)."""
        if src.numel() == 0:
            return
        forward_context = self.vllm_config.compilation_config.static_forward_context
        for name in self._draft_attn_layer_names:
            cache = forward_context[name].kv_cache
            cache.index_copy_(0, dst, cache.index_select(0, src))

    def _beam_forward(self, input_ids: torch.Tensor, kv) -> torch.Tensor:
        num_rows = input_ids.shape[0]
        qsl = torch.arange(num_rows + 1, dtype=torch.int32, device=input_ids.device)
        beam_cad = CommonAttentionMetadata(
            query_start_loc=qsl, query_start_loc_cpu=qsl.cpu(), seq_lens=kv.seq_lens,
            seq_lens_cpu_upper_bound=kv.seq_lens.cpu(), num_reqs=num_rows,
            num_actual_tokens=num_rows, max_query_len=1, max_seq_len=int(kv.seq_lens.max()),
            block_table_tensor=kv.block_table, slot_mapping=kv.slot_mapping, causal=True,
            positions=kv.positions)
        _, per_layer_metadata = self.build_per_group_and_layer_attn_metadata(beam_cad,
                                                                             draft_index=1)
        with set_forward_context(per_layer_metadata, self.vllm_config, num_tokens=num_rows,
                                 cudagraph_runtime_mode=CUDAGraphMode.NONE,
                                 slot_mapping={n: kv.slot_mapping
                                               for n in self._draft_attn_layer_names}):
            hidden = self.model(input_ids=input_ids.to(torch.int32), positions=kv.positions,
                                inputs_embeds=None)
        return self.model.compute_logits(hidden)


def drafter_stats(worker) -> dict:
    """For ``LLM.collective_rpc(drafter_stats)``: the MTAD drafter's counters on a worker."""
    drafter = getattr(worker.model_runner, "drafter", None)
    return dict(drafter.stats) if isinstance(drafter, MTADProposer) else {}


def _row_sampling_params(sampling_metadata, B: int, device):
    """[B] temperature (0 = greedy), top-k and top-p (None when no row uses them)."""
    if sampling_metadata.temperature is None:  # all greedy
        temp = torch.zeros(B, dtype=torch.float32, device=device)
    else:
        temp = sampling_metadata.temperature[:B].to(torch.float32)
    top_k = None if sampling_metadata.top_k is None else sampling_metadata.top_k[:B]
    top_p = None if sampling_metadata.top_p is None else sampling_metadata.top_p[:B]
    return temp, top_k, top_p
