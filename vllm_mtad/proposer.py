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
sampler.

Vocabulary-wide work per beam step is one k-selection over each beam row's logits
(:func:`vllm_mtad.core.processing.draft_candidates`); noise and selection then touch only the
K candidates of each beam. Nothing in the beam loop reads device values on the host.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch
from vllm.config import CUDAGraphMode
from vllm.forward_context import set_forward_context
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.spec_decode.draft_model import DraftModelProposer

from vllm_mtad.beam_kv import BeamKVLayout, chain_step_kv, tail_blocks
from vllm_mtad.config import from_additional_config
from vllm_mtad.core import beam_step, best_beam, is_greedy, keep_rows
from vllm_mtad.core.processing import CandidatePlan, draft_candidates
from vllm_mtad.log import get_logger
from vllm_mtad.request_state import MTADRequestState, row_sampling_params
from vllm_mtad.speculation import SpeculationController
from vllm_mtad.timing import phase

logger = get_logger(__name__)


class MTADProposer(DraftModelProposer):
    def __init__(self, vllm_config, device, state: MTADRequestState, runner=None):
        # (vLLM's base class takes the runner and does not keep it; neither does this one.)
        super().__init__(vllm_config=vllm_config, device=device, runner=runner)
        self.mtad = from_additional_config(vllm_config.additional_config)
        # The requests' facts (settings, drafts, the step's rows), shared with the sampler.
        self.state = state
        self.scratch = None  # draft_scratch.ScratchPlan, set when the KV cache is allocated
        # The policy's engine-wide state, shared with the rejection sampler.
        self.speculation = SpeculationController(self.mtad, device, state)
        self._capture = False
        self._first_pass = None  # (token_indices_to_sample, common_attn_metadata)
        self._first_hidden = None  # [B, hidden] at the first draft position
        self._last_logprobs = None  # [B, γ, 1] float32, for vLLM's draft_probs channel
        # Counters for benchmarks and tests. Host counters are plain ints; the device ones are
        # summed on the device and read only by drafter_stats() (no sync in the beam loop).
        self.stats = {"rounds": 0, "rows": 0, "beam_steps": 0, "dense_rounds": 0,
                      "dense_redos": 0, "chain_rounds": 0, "first_pass_s": 0.0,
                      "beam_steps_s": 0.0}
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
        num_tokens, token_indices, cad = super().set_inputs_first_pass(**kwargs)
        self._first_pass = (token_indices, cad)
        return num_tokens, token_indices, cad

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
        spec, state = self.speculation, self.state
        ib = state.input_batch
        B = kwargs["common_attn_metadata"].batch_size()
        req_ids = state.req_ids(B)
        # Host-side, per round: the requests' settings (from vLLM's own host arrays).
        rows = state.rows(req_ids)
        exact_host, seed_list, greedy_host = rows.exact, rows.seeds, rows.greedy
        starts = ib.num_computed_tokens_cpu[:B]
        state.kv.set_tokens(req_ids, ib.token_ids_cpu, ib.num_tokens_no_spec, self.block_size)
        plan = spec.plan(rows.classes, int(kwargs["target_token_ids"].shape[0]), req_ids,
                         starts, state.requests, fixed=rows.fixed)
        gamma = min(plan.num_tokens, num_speculative_tokens)
        W = plan.beam_width
        gaps = state.kv.step(req_ids, starts, drafting=gamma > 0)
        if gamma == 0:  # this step drafts nothing: no draft forward (the KV catches up later)
            spec.drafting_done(B)
            return torch.empty(B, 0, dtype=torch.int64, device=self.device)

        started = time.perf_counter()
        if gaps:  # the catch-up pass records its own timing sample
            self._catch_up(gaps, req_ids, kwargs["common_attn_metadata"])
        mark = spec.mark()
        self._capture = True
        try:  # vLLM's first pass only: one draft position.
            super().propose(num_speculative_tokens=1, **kwargs)
        finally:
            self._capture = False
            self.num_speculative_tokens = num_speculative_tokens
        token_indices, cad = self._first_pass
        sampling_metadata = kwargs["sampling_metadata"]
        B = cad.batch_size()
        dev = self._first_hidden.device

        seeds = torch.tensor(seed_list, dtype=torch.int64).to(dev)
        temp, top_k, top_p = row_sampling_params(sampling_metadata, B, dev)
        greedy = is_greedy(temp)
        # [B] beams per row: one for greedy "exact" rows (the draft's argmax chain; a sampled
        # request's greedy setting does not apply to it) and for the rows past those whose
        # beam tails fit in the draft-only blocks (draft_scratch).
        chain = [e and g for e, g in zip(exact_host, greedy_host)]
        room = B if gamma < 2 else self.rows_with_room(W, gamma)
        row_widths = [1 if c or b >= room else W for b, c in enumerate(chain)]
        widths = torch.tensor(row_widths, dtype=torch.int64).to(dev)

        p = self.positions[token_indices].to(torch.int64)  # [B] position of the bonus token
        logits = self.model.compute_logits(self._first_hidden)  # [B, V]
        V = logits.shape[-1]
        _, plan_k = state.batch_plan(B, V, W)
        any_sampled = not all(greedy_host)
        # Draft steps per row: the scheduler verifies at most max_model_len - L - 1 drafts of a
        # request with L tokens (its extra token must fit), so a row near the end of its
        # context drafts a shorter beam search (vLLM would skip the drafter for the whole batch
        # there; patches/worker/patch_gpu_model_runner.py lets MTAD draft).
        steps = (self.max_model_len - (p + 1) - 1).clamp(0, gamma)
        ctx = _Round(B, W, gamma, V, dev, temp, top_k, top_p, greedy, seeds, p + 1, any_sampled,
                     cad, steps, widths, room)
        beams_started = time.perf_counter()
        self.stats["first_pass_s"] += beams_started - started
        first_tokens = int(cad.num_actual_tokens)
        beam_mark = spec.mark()

        chain_round = all(chain)
        if chain_round:
            # Every row drafts the argmax chain (exact acceptance reads no draft probability):
            # no beams, no log-probabilities, no beam layout; vLLM's own draft loop's work.
            tokens, draft_logprobs = self._argmax_chain(replace(ctx, W=1), logits)
            self.stats["chain_rounds"] += 1
        else:
            tokens, draft_logprobs, overflow = self._draft_round(ctx, logits, plan_k)
            if plan_k.num_candidates is None:
                self.stats["dense_rounds"] += 1
            elif bool(overflow.any()):
                # Ties at some row's k-th value reach past the candidates (rare: the slack
                # grows with k; a host read once per round, after the beam loop): redo the
                # round with every token. The beams' KV is rewritten by the redo before
                # anything reads it.
                self.stats["dense_redos"] += 1
                tokens, draft_logprobs, _ = self._draft_round(
                    ctx, logits, replace(plan_k, num_candidates=None))
                beam_mark = mark = None  # two rounds: not a representative timing
        # The first pass read the step's decode tokens and its prefill chunks.
        first_size = (max(first_tokens - spec.prefill_tokens, 0), spec.prefill_tokens)
        if gamma > 1:
            spec.time_part(spec.costs.first_pass, first_size, mark, beam_mark)
            spec.time_part(spec.costs.beam_step, B * (1 if chain_round else W), beam_mark,
                           count=gamma - 1)
        else:
            spec.time_part(spec.costs.first_pass, first_size, mark)
        for req_id, w in zip(req_ids, row_widths):
            state.widths[req_id] = w

        self._last_logprobs = draft_logprobs[:, :, None].contiguous()
        state.drafts.put(req_ids, tokens, draft_logprobs)
        self.stats["beam_steps_s"] += time.perf_counter() - beams_started
        self.stats["beam_steps"] += gamma - 1
        self.stats["rounds"] += 1
        self.stats["rows"] += B
        spec.drafting_done(B)
        return tokens

    def _catch_up(self, gaps: dict, req_ids: list, cad: CommonAttentionMetadata) -> None:
        """Feed the draft the tokens it missed in steps without drafting: for each request in
        ``gaps`` ({req_id: (valid, start)}), positions [valid, start) of its own tokens, as
        causal multi-token queries in one draft forward (more when they exceed the token
        budget). Writes the draft layers' KV only; no logits."""
        ib = self.state.input_batch
        bs = self.block_size
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
            self._catch_up_pass(rows, segs, ib, cad, bs)
            self.speculation.catch_up_tokens += used

    def _catch_up_pass(self, rows, segs, ib, cad, bs) -> None:
        import numpy as np

        mark = self.speculation.mark()
        lens = [b - a for a, b in segs]
        n = sum(lens)
        dev = self.device
        ids = np.concatenate([ib.token_ids_cpu[r, a:b] for r, (a, b) in zip(rows, segs)])
        pos = np.concatenate([np.arange(a, b) for a, b in segs])
        qsl_cpu = torch.tensor([0] + list(np.cumsum(lens)), dtype=torch.int32)
        seq_cpu = torch.tensor([b for _, b in segs], dtype=torch.int32)
        positions = torch.from_numpy(pos.astype(np.int64)).to(dev)
        row_of = torch.repeat_interleave(torch.arange(len(rows)), torch.tensor(lens)).to(dev)
        block_table = cad.block_table_tensor[torch.tensor(rows, device=dev)]  # [R, blocks]
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
        self.speculation.time_part(self.speculation.costs.first_pass, (0, n), mark)

    def rows_with_room(self, width: int, gamma: int) -> int:
        """Batch rows whose beam tails fit in the draft-only blocks this round (0: none)."""
        scratch = self.scratch
        if scratch is None or scratch.base is None:
            return 0
        return scratch_rows(scratch, width, gamma, self.block_size)

    def _draft_round(self, ctx: "_Round", first_logits: torch.Tensor, plan: CandidatePlan):
        """Beam drafting from the first pass's logits: γ steps, steps 2..γ as B·W rows of one
        draft forward each (one beam a row: the request's own chain, chain_step_kv, which
        plans what a one-beam BeamKVLayout does without its bookkeeping). Returns the chosen
        beam's tokens [B, γ] int64, their draft log-probs [B, γ] float32 and [B] bool, rows
        whose candidates overflowed."""
        B, W, V = ctx.B, ctx.W, ctx.V
        layout = chain = None
        row_width = None
        if ctx.gamma > 1:
            with phase("beam_kv"):
                if W == 1:  # one beam a row: the request's own chain, as _argmax_chain's
                    chain = (ctx.cad.block_table_tensor[:B], self._num_blocks(ctx))
                else:
                    layout = BeamKVLayout(ctx.cad.block_table_tensor[:B].clone(),
                                          self._num_blocks(ctx), ctx.first_pos - 1, ctx.gamma,
                                          W, self.block_size, self.max_model_len,
                                          self.scratch.base if ctx.room else 0, ctx.room)
                    row_width = layout.row_beam_width
                    self._device_stats["narrowed_rows"] += (row_width < W).sum()
        # Rows the plan gives fewer beams (exact greedy: one) keep only those.
        row_width = ctx.widths if row_width is None else torch.minimum(row_width, ctx.widths)

        # Step 1: W distinct tokens from the first-pass distribution.
        with phase("draft_vocab"):
            cands = draft_candidates(first_logits, ctx.temp, ctx.top_k, ctx.top_p, plan)
            overflow = cands.overflow & (ctx.steps > 0)  # rows with no step left: unverified
            state = beam_step(cands.logprobs[:, None], None, W, ctx.greedy, ctx.seeds,
                              ctx.first_pos, 1, row_width, _beams(cands.token_ids, B, 1), V,
                              ctx.any_sampled)

        # Steps 2..γ: B·W rows of one draft forward per step.
        rep = lambda t: None if t is None else t.repeat_interleave(W)  # noqa: E731
        for t in range(2, ctx.gamma + 1):
            with phase("beam_kv"):
                if chain is not None:  # what a one-beam layout plans (tests/test_beam_kv.py)
                    kv = chain_step_kv(*chain, ctx.first_pos - 1, t, self.block_size,
                                       self.max_model_len)
                else:
                    kv = layout.step(state.parents, t)
                    self._copy_blocks(kv.copy_src, kv.copy_dst)
                    self._device_stats["copied_blocks"] += kv.num_copies
            logits = self._beam_forward(state.last_tokens().reshape(-1), kv, ctx, t)  # [B*W, V]
            with phase("draft_vocab"):
                cands = draft_candidates(logits, rep(ctx.temp), rep(ctx.top_k), rep(ctx.top_p),
                                         plan)
                done = t > ctx.steps  # [B] rows whose context ends before this step
                overflow = overflow | (cands.overflow.view(B, W).any(dim=1) & ~done)
                state = keep_rows(beam_step(cands.logprobs.view(B, W, -1), state, W,
                                            ctx.greedy, ctx.seeds, ctx.first_pos, t, row_width,
                                            _beams(cands.token_ids, B, W), V, ctx.any_sampled),
                                  state, done)

        tokens, draft_logprobs = best_beam(state)
        return tokens, draft_logprobs, overflow

    def _num_blocks(self, ctx: "_Round") -> torch.Tensor:
        """[B] blocks each row's request owns (vLLM's host block table), on the device."""
        bt = self.state.input_batch.block_table[self.kv_cache_gid]
        return torch.from_numpy(bt.num_blocks_per_row[:ctx.B].copy()).to(ctx.device)

    def _argmax_chain(self, ctx: "_Round", first_logits: torch.Tensor):
        """The draft model's argmax chain of every row (``ctx.W`` = 1), as vLLM's own draft
        loop drafts it: [B, γ] int64 tokens and [B, γ] zero log-probs (exact acceptance does
        not read them). A row whose context ends before step t repeats its last token there
        (never verified), as a beam round's placeholder does."""
        with phase("draft_vocab"):
            token = first_logits.argmax(dim=-1)  # [B]
        tokens = [token]
        if ctx.gamma > 1:
            with phase("beam_kv"):
                num_blocks = self._num_blocks(ctx)
                table = ctx.cad.block_table_tensor[:ctx.B]
        for t in range(2, ctx.gamma + 1):
            with phase("beam_kv"):
                kv = chain_step_kv(table, num_blocks, ctx.first_pos - 1, t, self.block_size,
                                   self.max_model_len)
            logits = self._beam_forward(token, kv, ctx, t)  # [B, V]
            with phase("draft_vocab"):
                token = torch.where(t > ctx.steps, token, logits.argmax(dim=-1))
            tokens.append(token)
        tokens = torch.stack(tokens, dim=1)
        return tokens, torch.zeros(tokens.shape, dtype=torch.float32, device=ctx.device)

    def _copy_blocks(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy whole blocks src -> dst in every draft layer (gather first: permutation-safe)."""
        if src.numel() == 0:
            return
        forward_context = self.vllm_config.compilation_config.static_forward_context
        for name in self._draft_attn_layer_names:
            cache = forward_context[name].kv_cache
            cache.index_copy_(0, dst, cache.index_select(0, src))

    def _beam_forward(self, input_ids: torch.Tensor, kv, ctx: "_Round", t: int) -> torch.Tensor:
        num_rows = input_ids.shape[0]
        with phase("beam_kv"):
            qsl_cpu, qsl = ctx.query_start_loc(num_rows)
            # Host-side bounds as vLLM's own draft loop keeps them (+1 per step), no sync.
            # (vLLM's first-pass metadata extends seq_lens and max_seq_len by the draft's new
            # slots, N = 1, but not seq_lens_cpu_upper_bound: hence + N here.)
            upper = ctx.cad.seq_lens_cpu_upper_bound
            if upper is not None:
                n_new = getattr(self, "net_num_new_slots_per_request", 1)
                seq_lens_cpu = (upper[: ctx.B] + n_new + (t - 1)).clamp(
                    max=self.max_model_len).repeat_interleave(ctx.W)
                max_seq_len = min(ctx.cad.max_seq_len + t - 1, self.max_model_len)
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


def scratch_rows(scratch, width: int, gamma: int, block_size: int) -> int:
    """Rows whose W-1 beam tails fit in the scratch, laid out for this round's W and γ: the
    scratch is reserved for the configured ones, and a narrower or shorter round fits more
    rows (the rows past the count draft one beam)."""
    per_row = (width - 1) * tail_blocks(gamma, block_size)
    return scratch.blocks // per_row if per_row > 0 else scratch.rows


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
    greedy: torch.Tensor  # [B] bool
    seeds: torch.Tensor  # [B] int64
    first_pos: torch.Tensor  # [B] int64, position of the first draft token
    any_sampled: bool
    cad: CommonAttentionMetadata  # the first pass's
    steps: torch.Tensor  # [B] int64, draft steps of each row (fewer than γ near max_model_len)
    widths: torch.Tensor  # [B] int64, beams of each row (<= W; 1 for exact greedy rows)
    room: int  # rows whose beam tails fit in the draft-only blocks this round
    _qsl: tuple | None = None

    def query_start_loc(self, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[B·W + 1] int32 on the host and on the device (one row per beam), once per round."""
        if self._qsl is None:
            cpu = torch.arange(num_rows + 1, dtype=torch.int32)
            self._qsl = (cpu, cpu.to(self.device, non_blocking=True))
        return self._qsl


def _beams(token_ids: torch.Tensor | None, B: int, W: int) -> torch.Tensor | None:
    return None if token_ids is None else token_ids.view(B, W, -1)


def _bonus_counters(sampler) -> dict:
    """How the rejection sampler's bonus draws applied top-k/top-p: by k-selection or by
    vLLM's own call (vllm_mtad.sampler.SelectingTopKTopP; absent where vLLM's is used)."""
    topk_topp = getattr(getattr(sampler, "bonus_sampler", None), "topk_topp_sampler", None)
    if not hasattr(topk_topp, "selected"):
        return {}
    return {"sampler_bonus_selected": topk_topp.selected,
            "sampler_bonus_fallbacks": topk_topp.fallbacks}


def drafter_stats(worker) -> dict:
    """For ``LLM.collective_rpc(drafter_stats)``: the MTAD drafter's counters on a worker."""
    drafter = getattr(worker.model_runner, "drafter", None)
    if not isinstance(drafter, MTADProposer):
        return {}
    sampler = getattr(worker.model_runner, "rejection_sampler", None)
    scratch = drafter.scratch
    return (dict(drafter.stats) | {k: int(v) for k, v in drafter._device_stats.items()}
            | {"draft_scratch_bytes": scratch.bytes if scratch else 0,
               "draft_scratch_blocks": scratch.blocks if scratch else 0,
               "draft_scratch_rows": scratch.rows if scratch else 0}
            | {"sampler_" + k: v for k, v in getattr(sampler, "stats", {}).items()}
            | {"sampler_draft_store_misses": int(getattr(sampler, "store_misses", 0))}
            | _bonus_counters(sampler)
            | drafter.speculation.snapshot())
