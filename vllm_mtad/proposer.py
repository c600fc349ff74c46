"""MTAD's drafter for vLLM: beam drafts on the paged KV cache.

A subclass of vLLM's DraftModelProposer. Its first pass is vLLM's own (the draft catches up on
the tokens the target just verified and yields the logits for the first draft position); the
W beams of every request then run as B·W rows of one draft forward per step, their KV placed
by :class:`vllm_mtad.beam_kv.BeamKVLayout` (prefix shared by block-table reference, copy-on-write
of the partially filled tail block, beams 1..W-1 in draft-only scratch blocks from
:mod:`vllm_mtad.draft_scratch`; everything in the draft layers only). The beam arithmetic is
vllm_mtad.core's. The chosen beam's tokens go back to the runner; their draft log-probabilities
go to :class:`vllm_mtad.sampler.MTADRejectionSampler` on the device through vLLM's own
``draft_probs`` channel (``take_last_draft_probs``), with a per-request store for the rare step
that channel leaves empty. What it knows of the requests (their settings, latest drafts, the
step's rows) is the runner's :class:`vllm_mtad.request_state.MTADRequestState`, shared with the
sampler; the speculation policy's engine side
(:class:`vllm_mtad.policy.controller.SpeculationController`) chooses each step's (W, γ) and is
shared with the sampler too.

Vocabulary-wide work per beam step is one k-selection over each beam row's logits
(:func:`vllm_mtad.core.processing.draft_candidates`); noise and selection then touch only the
K candidates of each beam. Nothing in the beam loop reads device values on the host.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from vllm.config import CUDAGraphMode
from vllm.forward_context import set_forward_context
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.spec_decode.draft_model import DraftModelProposer

from vllm_mtad.beam_kv import BeamKVLayout, RequestBlocks, chain_step_kv
from vllm_mtad.config import from_additional_config
from vllm_mtad.core import (NoiseKeys, StepCandidates, beam_step, best_beam, is_greedy,
                            keep_rows)
from vllm_mtad.core.processing import CandidateSizing, Candidates, draft_candidates
from vllm_mtad.draft_scratch import DraftLayers, scratch_rows, wrap_available_memory
from vllm_mtad.log import get_logger
from vllm_mtad.policy import Plan, row_beams
from vllm_mtad.policy.controller import SpeculationController
from vllm_mtad.request_state import MTADRequestState, Rows, row_sampling_params
from vllm_mtad.timing import phase, span

logger = get_logger(__name__)


class MTADProposer(DraftModelProposer):
    def __init__(self, vllm_config, device, state: MTADRequestState,
                 speculation: SpeculationController, runner=None):
        # (vLLM's base class takes the runner and does not keep it; neither does this one.)
        super().__init__(vllm_config=vllm_config, device=device, runner=runner)
        self.mtad = from_additional_config(vllm_config.additional_config)
        self.state = state  # the requests' facts (settings, drafts, the step's rows)
        self.speculation = speculation  # the policy: each step's (W, γ), its timings
        self.scratch = None  # draft_scratch.DraftScratch, set when the KV cache is allocated
        self._capture = False
        self._first_pass_inputs = None  # (token_indices_to_sample, common_attn_metadata)
        self._first_hidden = None  # [B, hidden] at the first draft position
        self._last_logprobs = None  # [B, γ, 1] float32, for vLLM's draft_probs channel
        self._kept_steps = None  # the round's candidates per step, when a rule reads them
        # Counters for benchmarks and tests. Host counters are plain ints; the device ones are
        # summed on the device and read only by worker_rpc.drafter_stats (no sync in the beam
        # loop). Time is the phase timers' (vllm_mtad.timing: phases and spans).
        self.stats = {"rounds": 0, "rows": 0, "beam_steps": 0, "dense_rounds": 0,
                      "dense_redos": 0, "chain_rounds": 0}
        self._device_stats = {"narrowed_rows": torch.zeros((), dtype=torch.int64, device=device),
                              "copied_blocks": torch.zeros((), dtype=torch.int64, device=device)}

    def initialize_attn_backend(self, kv_cache_config, kernel_block_sizes=None) -> None:
        """vLLM's draft attention groups, plus a second set for the beam steps: their metadata
        has B·W rows, and builders keep buffers sized by max_num_seqs (FlashInfer's
        paged_kv_indptr/indices/last_page_len, FA's DCP lengths), so the beam steps' builders
        are made from a config with max_num_seqs·W and no CUDA graphs (beam steps run eager).
        On CPU the attention builder keeps no such buffer; the two sets build the same
        metadata there (tests/test_e2e_engine.py checks the builders' config)."""
        super().initialize_attn_backend(kv_cache_config, kernel_block_sizes)
        self._beam_attn_groups = beam_attn_groups(self.draft_attn_groups, self.vllm_config,
                                                  self.device, self.mtad.beam_width)

    # The first pass is vLLM's; these two hooks capture what it computed.
    def set_inputs_first_pass(self, **kwargs):
        num_tokens, token_indices, attn = super().set_inputs_first_pass(**kwargs)
        self._first_pass_inputs = (token_indices, attn)
        return num_tokens, token_indices, attn

    def _sample_draft_tokens(self, hidden_states, sampling_metadata):
        if self._capture:
            self._first_hidden = hidden_states
            return torch.zeros(hidden_states.shape[0], dtype=torch.int64,
                               device=hidden_states.device), None
        return super()._sample_draft_tokens(hidden_states, sampling_metadata)

    def take_last_draft_probs(self) -> torch.Tensor | None:
        """vLLM's channel from drafter to rejection sampler: [B, γ, 1] float32, the draft
        log-probability of each draft token (MTAD needs only the drafted token's, not a
        distribution over the vocabulary)."""
        return self._last_logprobs

    def propose(self, num_speculative_tokens: int, **kwargs) -> torch.Tensor:
        """Draft for every request of the batch: [B, γ] int64, γ <= num_speculative_tokens as
        the speculation policy chooses (0: no draft forward at all this step)."""
        self._last_logprobs = None
        if num_speculative_tokens == 0:
            return super().propose(num_speculative_tokens=0, **kwargs)
        step = self._step(kwargs)
        plan = self._plan(step, num_speculative_tokens)
        gaps = self.state.kv.step(step.req_ids, step.starts, drafting=plan.num_tokens > 0)
        if plan.num_tokens == 0:  # no draft forward; the draft's KV catches up when it next drafts
            self.speculation.drafting_done(step.size)
            return torch.empty(step.size, 0, dtype=torch.int64, device=self.device)
        with span("first_pass"):
            if gaps:  # the catch-up pass times itself
                self._catch_up(gaps, step.req_ids, step.kwargs["common_attn_metadata"])
        with self.speculation.stopwatch() as watch:
            with span("first_pass"):
                draft, logits = self._first_pass(step, plan, num_speculative_tokens)
            if draft.gamma > 1:
                watch.lap(self.speculation.costs.first_pass, draft.first_pass_size)
            with span("beam_steps"):
                tokens, logprobs, redone = self._draft(draft, logits)
                self._time_draft(watch, draft, redone)
                self._record(step, draft, tokens, logprobs)
        return tokens

    def _step(self, kwargs: dict) -> _Step:
        """The step's rows and their settings, from vLLM's host arrays; the draft KV tracker is
        handed the step's tokens."""
        state, ib = self.state, self.state.input_batch
        num_rows = kwargs["common_attn_metadata"].batch_size()
        req_ids = state.req_ids(num_rows)
        rows = state.rows(req_ids)
        starts = ib.num_computed_tokens_cpu[:num_rows]
        state.kv.set_tokens(req_ids, ib.token_ids_cpu, ib.num_tokens_no_spec, self.block_size)
        return _Step(req_ids=req_ids, rows=rows, starts=starts, size=num_rows, kwargs=kwargs)

    def _plan(self, step: _Step, num_speculative_tokens: int) -> Plan:
        """The policy's (W, γ) for the step, γ at most what vLLM asked for."""
        plan = self.speculation.plan(
            step.rows, int(step.kwargs["target_token_ids"].shape[0]),
            demand=lambda: self.state.demand(step.req_ids, step.starts, step.rows.classes))
        return replace(plan, num_tokens=min(plan.num_tokens, num_speculative_tokens))

    def _first_pass(self, step: _Step, plan: Plan, num_speculative_tokens: int):
        """vLLM's first pass, one draft position (the draft reads the step's verified tokens
        and prefill chunks): the round's per-row inputs and the logits of the first draft
        position [B, V]."""
        self._capture = True
        try:
            super().propose(num_speculative_tokens=1, **step.kwargs)
        finally:
            self._capture = False
            self.num_speculative_tokens = num_speculative_tokens
        token_indices, attn = self._first_pass_inputs
        logits = self.model.compute_logits(self._first_hidden)  # [B, V]
        bonus_pos = self.positions[token_indices].to(torch.int64)  # [B] the bonus token's
        return self._round(step, plan, attn, bonus_pos, logits.shape[-1]), logits

    def _round(self, step: _Step, plan: Plan, attn: CommonAttentionMetadata,
               bonus_pos: torch.Tensor, vocab_size: int) -> _Round:
        """The draft round's per-row inputs. Beams per row: the plan's by class (row_beams),
        one for the rows past those whose beam tails fit in the draft-only blocks."""
        B, dev = attn.batch_size(), self._first_hidden.device
        gamma, W = plan.num_tokens, plan.beam_width
        temp, top_k, top_p = row_sampling_params(step.kwargs["sampling_metadata"], B, dev)
        room = B if gamma < 2 else scratch_rows(self.scratch, W, gamma, self.block_size)
        widths = [row_beams(c, W) if b < room else 1 for b, c in enumerate(step.rows.classes)]
        seeds = torch.tensor(step.rows.seeds, dtype=torch.int64).to(dev)
        prefill = self.speculation.prefill_tokens
        return _Round(
            B=B, W=W, gamma=gamma, V=vocab_size, device=dev, temp=temp, top_k=top_k,
            top_p=top_p, attn=attn, bonus_pos=bonus_pos, room=room, row_widths=widths,
            keys=NoiseKeys(is_greedy(temp), seeds, bonus_pos + 1,
                           any_sampled=not all(step.rows.greedy)),
            # Draft steps per row: the scheduler verifies at most max_model_len - L - 1 drafts
            # of a request of L tokens, so a row near the end of its context drafts fewer
            # (patches/worker/patch_gpu_model_runner.py lets MTAD draft there).
            steps=(self.max_model_len - (bonus_pos + 1) - 1).clamp(0, gamma),
            widths=torch.tensor(widths, dtype=torch.int64).to(dev),
            sizing=self.state.candidate_sizing(B, vocab_size, W)[1],
            argmax_chain=_argmax_chain_only(step.rows.classes, W),
            first_pass_size=(max(int(attn.num_actual_tokens) - prefill, 0), prefill))

    def _draft(self, draft: _Round, logits: torch.Tensor):
        """γ draft tokens per row from the first pass's logits: [B, γ] int64 tokens, [B, γ]
        float32 draft log-probs, and whether the round was drafted twice. A host read after
        the beam loop, in top-k rounds: whether ties at some row's k-th value reached past the
        candidates (rare: the slack grows with k); the round is then redone with every token
        (the beams' KV is rewritten by the redo before anything reads it)."""
        self._kept_steps = None
        if draft.argmax_chain:
            # No row reads a draft probability (the plan's W is 1: row_beams): no
            # log-probabilities, no beam layout; vLLM's own draft loop's work.
            self.stats["chain_rounds"] += 1
            return *self._argmax_chain(draft, logits), False
        tokens, logprobs, overflow = self._draft_round(draft, logits, draft.sizing)
        if draft.sizing.num_candidates is None:
            self.stats["dense_rounds"] += 1
        elif bool(overflow.any()):
            self.stats["dense_redos"] += 1
            tokens, logprobs, _ = self._draft_round(
                draft, logits, replace(draft.sizing, num_candidates=None))
            return tokens, logprobs, True
        return tokens, logprobs, False

    def _time_draft(self, watch, draft: _Round, redone: bool) -> None:
        """The policy's samples of this round: the first pass (lapped before drafting when
        γ > 1) and γ - 1 beam steps of B·W rows; none for a round drafted twice."""
        costs = self.speculation.costs
        if redone:
            watch.discard()
        elif draft.gamma > 1:
            watch.lap(costs.beam_step, draft.B * draft.W, count=draft.gamma - 1)
        else:
            watch.lap(costs.first_pass, draft.first_pass_size)

    def _record(self, step: _Step, draft: _Round, tokens: torch.Tensor,
                logprobs: torch.Tensor) -> None:
        """Hand the drafts on: the tokens go back to vLLM, their log-probs to the sampler
        (vLLM's draft_probs channel, and the store for the step that channel misses)."""
        for req_id, w in zip(step.req_ids, draft.row_widths):
            self.state.widths[req_id] = w
        self._last_logprobs = logprobs[:, :, None].contiguous()
        self.state.drafts.put(step.req_ids, tokens, logprobs)
        if self._kept_steps:  # a baseline rule reads the draft's distributions
            self.state.distributions.put(step.req_ids, self._kept_steps)
        self.stats["beam_steps"] += draft.gamma - 1
        self.stats["rounds"] += 1
        self.stats["rows"] += draft.B
        self.speculation.drafting_done(draft.B)

    def _catch_up(self, gaps: dict, req_ids: list, attn: CommonAttentionMetadata) -> None:
        """Feed the draft the tokens it missed in steps without drafting: for each request in
        ``gaps`` ({req_id: (valid, start)}), positions [valid, start) of its own tokens, as
        causal multi-token queries in one draft forward (more when they exceed the token
        budget). Writes the draft layers' KV only; no logits."""
        budget = self.max_num_tokens
        todo = [(req_ids.index(r), a, b) for r, (a, b) in gaps.items()]
        while todo:
            rows, segs, used, rest = [], [], 0, []
            for row, a, b in todo:
                take = min(b - a, budget - used)
                if take <= 0:
                    rest.append((row, a, b))
                    continue
                rows.append(row)
                segs.append((a, a + take))
                used += take
                if a + take < b:
                    rest.append((row, a + take, b))
            todo = rest
            self._catch_up_pass(rows, segs, attn)
            self.speculation.catch_up_tokens += used

    def _catch_up_pass(self, rows: list[int], segs: list[tuple[int, int]],
                       attn: CommonAttentionMetadata) -> None:
        """One catch-up forward: batch rows ``rows`` read their positions ``segs``."""
        ib, bs, dev = self.state.input_batch, self.block_size, self.device
        with self.speculation.stopwatch() as watch:
            lens = [b - a for a, b in segs]
            n = sum(lens)
            ids = np.concatenate([ib.token_ids_cpu[r, a:b] for r, (a, b) in zip(rows, segs)])
            pos = np.concatenate([np.arange(a, b) for a, b in segs])
            qsl_cpu = torch.tensor([0] + list(np.cumsum(lens)), dtype=torch.int32)
            seq_cpu = torch.tensor([b for _, b in segs], dtype=torch.int32)
            positions = torch.from_numpy(pos.astype(np.int64)).to(dev)
            row_of = torch.repeat_interleave(torch.arange(len(rows)), torch.tensor(lens)).to(dev)
            block_table = attn.block_table_tensor[torch.tensor(rows, device=dev)]  # [R, blocks]
            slots = (block_table[row_of, positions // bs].to(torch.int64) * bs + positions % bs)
            sub = CommonAttentionMetadata(
                query_start_loc=qsl_cpu.to(dev), query_start_loc_cpu=qsl_cpu,
                seq_lens=seq_cpu.to(dev), seq_lens_cpu_upper_bound=seq_cpu, num_reqs=len(rows),
                num_actual_tokens=n, max_query_len=max(lens), max_seq_len=int(seq_cpu.max()),
                block_table_tensor=block_table, slot_mapping=slots, causal=True,
                positions=positions)
            _, per_layer = self.build_per_group_and_layer_attn_metadata(sub)
            input_ids = torch.from_numpy(ids.astype(np.int32)).to(dev)
            with set_forward_context(per_layer, self.vllm_config, num_tokens=n,
                                     cudagraph_runtime_mode=CUDAGraphMode.NONE,
                                     slot_mapping={name: slots
                                                   for name in self._draft_attn_layer_names}):
                self.model(input_ids=input_ids, positions=positions, inputs_embeds=None)
            # Multi-token queries, as a prefill chunk's: priced per prefill token.
            watch.lap(self.speculation.costs.first_pass, (0, n))

    def _draft_round(self, draft: _Round, first_logits: torch.Tensor, sizing: CandidateSizing):
        """Beam drafting from the first pass's logits: γ steps, steps 2..γ as B·W rows of one
        draft forward each (one beam a row: the request's own chain, chain_step_kv, which
        plans what a one-beam BeamKVLayout does without its bookkeeping). Returns the chosen
        beam's tokens [B, γ] int64, their draft log-probs [B, γ] float32 and [B] bool, rows
        whose candidates overflowed."""
        B, W, V = draft.B, draft.W, draft.V
        layout, row_width = self._beam_layout(draft)
        # One beam a row, for a baseline rule (worker_rpc.use_baseline_rule): q̃ at every position.
        self._kept_steps = keep = [] if self.state.distributions is not None and W == 1 \
            else None
        # Step 1: W distinct tokens from the first-pass distribution.
        with phase("draft_vocab"):
            cands = draft_candidates(first_logits, draft.temp, draft.top_k, draft.top_p, sizing)
            overflow = cands.overflow & (draft.steps > 0)  # rows with no step left: unverified
            if keep is not None:
                keep.append(cands)
            beams = beam_step(_step_candidates(cands, B, 1, V), None, W, draft.keys, 1,
                              row_width)
        # Steps 2..γ: B·W rows of one draft forward per step.
        rep = lambda t: None if t is None else t.repeat_interleave(W)  # noqa: E731
        for t in range(2, draft.gamma + 1):
            with phase("beam_kv"):
                if isinstance(layout, RequestBlocks):  # one beam a row (tests/test_beam_kv.py)
                    kv = chain_step_kv(layout, t, self.block_size, self.max_model_len)
                else:
                    kv = layout.step(beams.parents, t)
                    self._copy_blocks(kv.copy_src, kv.copy_dst)
                    self._device_stats["copied_blocks"] += kv.num_copies
            logits = self._beam_forward(beams.last_tokens().reshape(-1), kv, draft, t)
            with phase("draft_vocab"):
                cands = draft_candidates(logits, rep(draft.temp), rep(draft.top_k),
                                         rep(draft.top_p), sizing)
                done = t > draft.steps  # [B] rows whose context ends before this step
                overflow = overflow | (cands.overflow.view(B, W).any(dim=1) & ~done)
                if keep is not None:
                    keep.append(cands)
                beams = keep_rows(beam_step(_step_candidates(cands, B, W, V), beams, W,
                                            draft.keys, t, row_width), beams, done)
        tokens, draft_logprobs = best_beam(beams)
        return tokens, draft_logprobs, overflow

    def _beam_layout(self, draft: _Round):
        """Where the round's beams keep their KV (a BeamKVLayout, or for one beam a row the
        requests' own blocks), and [B] beams per row: the plan's, fewer for rows without
        draft-only room."""
        if draft.gamma < 2:
            return None, draft.widths
        with phase("beam_kv"):
            requests = self._request_blocks(draft)
            if draft.W == 1:  # one beam a row: the request's own chain, as _argmax_chain's
                return requests, draft.widths
            layout = BeamKVLayout(replace(requests, block_table=requests.block_table.clone()),
                                  draft.gamma, draft.W, self.block_size, self.max_model_len,
                                  self.scratch.base if draft.room else 0, draft.room)
            row_width = layout.row_beam_width
            self._device_stats["narrowed_rows"] += (row_width < draft.W).sum()
        return layout, torch.minimum(row_width, draft.widths)

    def _request_blocks(self, draft: _Round) -> RequestBlocks:
        """The round's requests on the paged cache: the first pass's block table, the blocks
        each request owns (vLLM's host block table, copied to the device) and the bonus
        positions."""
        bt = self.state.input_batch.block_table[self.kv_cache_gid]
        num_blocks = torch.from_numpy(bt.num_blocks_per_row[:draft.B].copy()).to(draft.device)
        return RequestBlocks(draft.attn.block_table_tensor[:draft.B], num_blocks,
                             draft.bonus_pos)

    def _argmax_chain(self, draft: _Round, first_logits: torch.Tensor):
        """The draft model's argmax chain of every row (``draft.W`` = 1), as vLLM's own draft
        loop drafts it: [B, γ] int64 tokens and [B, γ] zero log-probs (exact acceptance does
        not read them). A row whose context ends before step t repeats its last token there
        (never verified), as a beam round's placeholder does."""
        with phase("draft_vocab"):
            token = first_logits.argmax(dim=-1)  # [B]
        tokens = [token]
        if draft.gamma > 1:
            with phase("beam_kv"):
                requests = self._request_blocks(draft)
        for t in range(2, draft.gamma + 1):
            with phase("beam_kv"):
                kv = chain_step_kv(requests, t, self.block_size, self.max_model_len)
            logits = self._beam_forward(token, kv, draft, t)  # [B, V]
            with phase("draft_vocab"):
                token = torch.where(t > draft.steps, token, logits.argmax(dim=-1))
            tokens.append(token)
        tokens = torch.stack(tokens, dim=1)
        return tokens, torch.zeros(tokens.shape, dtype=torch.float32, device=draft.device)

    def _copy_blocks(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy whole blocks src -> dst in every draft layer (gather first: permutation-safe)."""
        if src.numel() == 0:
            return
        forward_context = self.vllm_config.compilation_config.static_forward_context
        for name in self._draft_attn_layer_names:
            cache = forward_context[name].kv_cache
            cache.index_copy_(0, dst, cache.index_select(0, src))

    def _beam_forward(self, input_ids: torch.Tensor, kv, draft: _Round, t: int) -> torch.Tensor:
        num_rows = input_ids.shape[0]
        with phase("beam_kv"):
            qsl_cpu, qsl = draft.query_start_loc(num_rows)
            # Host-side bounds as vLLM's own draft loop keeps them (+1 per step), no sync.
            # (vLLM's first-pass metadata extends seq_lens and max_seq_len by the draft's new
            # slots, N = 1, but not seq_lens_cpu_upper_bound: hence + N here.)
            upper = draft.attn.seq_lens_cpu_upper_bound
            if upper is not None:
                n_new = getattr(self, "net_num_new_slots_per_request", 1)
                seq_lens_cpu = (upper[: draft.B] + n_new + (t - 1)).clamp(
                    max=self.max_model_len).repeat_interleave(draft.W)
                max_seq_len = min(draft.attn.max_seq_len + t - 1, self.max_model_len)
            else:  # not provided by this vLLM path: read them (a sync)
                seq_lens_cpu = kv.seq_lens.cpu()
                max_seq_len = int(seq_lens_cpu.max())
            beam_cad = CommonAttentionMetadata(
                query_start_loc=qsl, query_start_loc_cpu=qsl_cpu, seq_lens=kv.seq_lens,
                seq_lens_cpu_upper_bound=seq_lens_cpu, num_reqs=num_rows,
                num_actual_tokens=num_rows, max_query_len=1, max_seq_len=max_seq_len,
                block_table_tensor=kv.block_table, slot_mapping=kv.slot_mapping, causal=True,
                positions=kv.positions)
            per_layer_metadata = {}
            for group in self._beam_attn_groups:
                metadata = group.build_metadata_for_drafting(beam_cad, draft_index=1)
                per_layer_metadata.update((name, metadata) for name in group.layer_names)
        with set_forward_context(per_layer_metadata, self.vllm_config, num_tokens=num_rows,
                                 cudagraph_runtime_mode=CUDAGraphMode.NONE,
                                 slot_mapping={n: kv.slot_mapping
                                               for n in self._draft_attn_layer_names}):
            hidden = self.model(input_ids=input_ids.to(torch.int32), positions=kv.positions,
                                inputs_embeds=None)
        return self.model.compute_logits(hidden)



def beam_attn_groups(groups, vllm_config, device, width: int) -> list:
    """Copies of the drafter's attention groups whose builders are sized for width times
    max_num_seqs rows, with CUDA graphs off (width 1: the groups themselves)."""
    if width <= 1:
        return list(groups)
    import copy

    from vllm.v1.worker.utils import AttentionGroup

    cfg = copy.copy(vllm_config)  # shallow: model, cache and forward context stay shared
    cfg.scheduler_config = copy.copy(vllm_config.scheduler_config)
    cfg.scheduler_config.max_num_seqs = vllm_config.scheduler_config.max_num_seqs * width
    cfg.compilation_config = copy.copy(vllm_config.compilation_config)
    cfg.compilation_config.cudagraph_mode = CUDAGraphMode.NONE
    out = []
    for group in groups:
        beam_group = AttentionGroup(backend=group.backend, layer_names=list(group.layer_names),
                                    kv_cache_spec=group.kv_cache_spec,
                                    kv_cache_group_id=group.kv_cache_group_id)
        beam_group.create_metadata_builders(cfg, device, kernel_block_size=group.kernel_block_size)
        old, new = group.get_metadata_builder(), beam_group.get_metadata_builder()
        if hasattr(old, "_get_workspace_buffer") and hasattr(new, "set_workspace_buffer"):
            new.set_workspace_buffer(old._get_workspace_buffer())  # FlashInfer: one workspace
        out.append(beam_group)
    return out


@dataclass
class _Step:
    """The step's rows on the host (vLLM's propose() arguments with them)."""

    req_ids: list[str]
    rows: Rows  # their MTAD settings and classes
    starts: np.ndarray  # [B] computed tokens of each row
    size: int  # B, rows of the step (more than req_ids only in vLLM's warm-up)
    kwargs: dict  # vLLM's arguments to propose()


@dataclass
class _Round:
    """One draft round's per-row inputs (legend: B requests, W beams, V vocabulary)."""

    B: int
    W: int
    gamma: int
    V: int
    device: torch.device
    temp: torch.Tensor  # [B] float32, 0 = greedy
    top_k: torch.Tensor | None  # [B]
    top_p: torch.Tensor | None  # [B]
    keys: NoiseKeys  # greedy rows, seeds, and positions of the first draft token
    attn: CommonAttentionMetadata  # the first pass's
    bonus_pos: torch.Tensor  # [B] int64, position of the bonus token (the first pass's)
    steps: torch.Tensor  # [B] int64, draft steps of each row (fewer than γ near max_model_len)
    widths: torch.Tensor  # [B] int64, beams of each row (<= W; 1 for exact greedy rows)
    row_widths: list[int]  # the same, on the host
    room: int  # rows whose beam tails fit in the draft-only blocks this round
    sizing: CandidateSizing  # how many candidates each row's distribution keeps
    argmax_chain: bool  # every row is exact: the round drafts the argmax chain
    first_pass_size: tuple[int, int]  # (decode, prefill) tokens the first pass read
    _qsl: tuple | None = None

    def query_start_loc(self, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[B·W + 1] int32 on the host and on the device (one row per beam), once per round."""
        if self._qsl is None:
            cpu = torch.arange(num_rows + 1, dtype=torch.int32)
            self._qsl = (cpu, cpu.to(self.device, non_blocking=True))
        return self._qsl


def _argmax_chain_only(classes: list[str], width: int) -> bool:
    """Whether every row is "exact": no row reads a draft probability, so the round drafts the
    argmax chain (the plan has one beam then: policy.row_beams, batch_beams)."""
    chain = all(c == "exact" for c in classes)
    assert not chain or width == 1, f"an all-exact step planned {width} beams (batch_beams: 1)"
    return chain


def _step_candidates(cands: Candidates, B: int, W: int, V: int):
    """A draft_candidates result as beam_step's input: [B, W, K] (dense: a tensor)."""
    logprobs = cands.logprobs.view(B, W, -1)
    if cands.token_ids is None:
        return logprobs
    return StepCandidates(logprobs, cands.token_ids.view(B, W, -1), V)


def draft_layers_of(runner) -> DraftLayers | None:
    """An MTAD runner's draft layers and settings, for the draft-only blocks (None for other
    runners)."""
    drafter = getattr(runner, "drafter", None)
    if not isinstance(drafter, MTADProposer):
        return None
    return DraftLayers(sorted(drafter._draft_attn_layer_names), drafter.mtad)


def available_memory_less_scratch(original):
    """A worker's ``determine_available_memory``, less the draft-only blocks of its MTAD
    drafter (patch_cpu_worker, patch_gpu_worker)."""
    return wrap_available_memory(original, draft_layers_of)
