"""Where each draft beam's KV lives on the paged cache: block tables, copies and slots.

Plain PyTorch (no vLLM import). Legend: B = requests, W = beams, C = block-table columns,
bs = block size, γ = draft length, p = position of the last token whose draft KV exists (the
bonus token of the first pass), so beam tokens are written at positions p+1 .. p+γ-1 (draft
steps 2..γ; step t writes position p+t-1).

Design (docs/beam-kv-layout.md, with a diagram and a worked example):
- every beam's block-table row points at the request's own blocks for the shared prefix:
  forking is by reference, no prefix copy;
- the tail columns j0 = (p+1)//bs .. c_last = (p+γ-1)//bs, where beams write, are private:
  beam 0 uses the request's own blocks there (the slots vLLM's own draft chain writes, within
  vLLM's lookahead γ; its writes beyond the accepted length are rewritten by the next round's
  catch-up pass before anyone reads them), beam w >= 1 uses *draft-only scratch blocks*: block
  ids past the shared pool's that exist in the draft layers' KV tensors only
  (vllm_mtad.draft_scratch), a fixed range of ``tail_blocks`` blocks per beam per batch row, so
  the scheduler reserves nothing for the beams and the target's layers hold no beam tails;
- when a beam is forked or re-parented, only the block that holds the write position is
  copied from the parent (copy-on-write of the partially filled tail block); columns the
  parent has already filled are shared by reference (full blocks are never written again);
- a batch row without scratch room (none when the scratch is sized for max_num_seqs rows) drafts
  with one beam, decided per row on the device without a host sync; the plan's tensors have
  fixed sizes (no masked indexing), so planning a step never waits for the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PADDING_SLOT = -1
# vLLM's null block (block id 0, never given to a request: vllm/v1/core/block_pool.py), the
# harmless source and destination of the copy entries that copy nothing.
NULL_BLOCK = 0


def tail_blocks(gamma: int, block_size: int) -> int:
    """Most block columns the γ-1 positions p+1 .. p+γ-1 can span."""
    n = gamma - 1
    return 1 if n <= 1 else (n - 2) // block_size + 2


def scratch_blocks(num_rows: int, gamma: int, beam_width: int, block_size: int) -> int:
    """Draft-only blocks for the private tails of beams 1..W-1 of ``num_rows`` batch rows."""
    if gamma < 2 or beam_width < 2:
        return 0
    return num_rows * (beam_width - 1) * tail_blocks(gamma, block_size)


@dataclass
class BeamStepKV:
    """What one beam forward needs (draft step t >= 2)."""

    # [B*W, C] int32: each beam row's block table.
    block_table: torch.Tensor
    # [B*W] int64: KV write slot of each beam row (PADDING_SLOT: do not write).
    slot_mapping: torch.Tensor
    # [B*W] int64: position of the token each beam row feeds.
    positions: torch.Tensor
    # [B*W] int32: sequence length each beam row attends over (its position + 1).
    seq_lens: torch.Tensor
    # [B*W] int64 each: copy block src[i] -> dst[i] in the draft layers before the forward.
    # Fixed size (no host sync to count them): entries with nothing to copy read NULL_BLOCK
    # into NULL_BLOCK, which leaves it as it was.
    copy_src: torch.Tensor
    copy_dst: torch.Tensor
    # [] int64: how many entries are real copies.
    num_copies: torch.Tensor


@dataclass(frozen=True)
class RequestBlocks:
    """The batch's requests on the paged cache, as a draft round starts."""

    # [B, C] int: block ids of each request (columns past num_blocks are unused).
    block_table: torch.Tensor
    # [B] int: blocks each request owns (valid columns).
    num_blocks: torch.Tensor
    # [B] int64: p, the position of the bonus token (the last one whose draft KV exists).
    bonus_positions: torch.Tensor


class BeamKVLayout:
    """Plans the beams' KV for one draft round of a batch.

    Args:
        requests: the requests' block tables, block counts and bonus positions p.
        gamma: draft length; beam_width: W; block_size: bs; max_model_len: positions at or
            beyond it are never written.
        scratch_base: first draft-only block id; scratch_rows: batch rows with scratch room
            (row b's beam w >= 1 owns blocks scratch_base + ((b·(W-1) + w-1)·tail_blocks + i)).
    """

    def __init__(self, requests: RequestBlocks, gamma: int, beam_width: int, block_size: int,
                 max_model_len: int, scratch_base: int, scratch_rows: int):
        B, C = requests.block_table.shape
        W, bs = beam_width, block_size
        self.B, self.C, self.W, self.bs, self.gamma = B, C, W, bs, gamma
        self.max_model_len = max_model_len
        dev = requests.block_table.device
        self.block_table = requests.block_table.to(torch.int64)
        self.bonus_pos = requests.bonus_positions.to(torch.int64)
        num_blocks = requests.num_blocks.to(torch.int64).to(dev)
        self.num_blocks = num_blocks
        # [B] first tail column (a row already at max_model_len, drafted for with the rest of
        # its batch but never verified, keeps the table's last column: it writes nothing).
        self.j0 = ((self.bonus_pos + 1) // bs).clamp(max=C - 1)
        c_last = (self.bonus_pos + max(gamma - 1, 1)) // bs  # [B] last tail column
        self.nb = c_last - self.j0 + 1  # [B] tail columns per beam
        self.nb_max = tail_blocks(gamma, bs)
        rows = torch.arange(B, device=dev)
        self.row_beam_width = torch.where(rows < scratch_rows, W, 1)  # [B]

        # own[b, w, i]: the block beam w writes in tail column j0 + i.  [B, W, nb_max]
        i = torch.arange(self.nb_max, device=dev)
        w = torch.arange(W, device=dev)
        col = (self.j0[:, None, None] + i[None, None, :]).clamp(max=C - 1).expand(B, W, -1)
        request_blocks = self.block_table.gather(1, col.reshape(B, -1)).reshape(B, W, -1)
        scratch = (scratch_base + ((rows[:, None, None] * (W - 1) + w[None, :, None] - 1)
                                   * self.nb_max + i[None, None, :]))
        # Rows without scratch room keep the request's blocks for every beam: their beams
        # w >= 1 neither write nor copy (they are not live), and read only valid blocks.
        private = (w[None, :, None] > 0) & (rows < scratch_rows)[:, None, None]
        self.own = torch.where(private, scratch, request_blocks)
        # The previous step's tables for the tail columns: one root beam = beam 0's blocks.
        self.tab = self.own[:, :1].clone()  # [B, W_prev, nb_max]

    def step(self, parents: torch.Tensor, t: int) -> BeamStepKV:
        """KV plan for draft step t (2..γ) given each new beam's parent index.

        Args:
            parents: [B, W] int64, index of each beam's parent among the previous step's beams
                (all 0 after step 1).
        """
        B, W, bs = self.B, self.W, self.bs
        assert parents.shape == (B, W) and 2 <= t <= self.gamma
        wpos = self.bonus_pos + t - 1  # [B] position written at this step
        i_cur = (wpos // bs - self.j0).clamp(0, self.nb_max - 1)  # [B] tail column index
        idx = i_cur[:, None, None].expand(B, W, 1)

        inherited = self.tab.gather(1, parents[:, :, None].expand(B, W, self.nb_max))
        src = inherited.gather(2, idx)[:, :, 0]  # [B, W] parent's block at the write column
        dst = self.own.gather(2, idx)[:, :, 0]  # [B, W] this beam's own block there
        tab = inherited.scatter(2, idx, dst[:, :, None])
        self.tab = tab

        live = torch.arange(W, device=parents.device)[None, :] < self.row_beam_width[:, None]
        in_range = (wpos < self.max_model_len) & (wpos // bs < self.num_blocks)  # [B]
        writable = live & in_range[:, None]
        # Copy-on-write of the partially filled block only: the write column already holds
        # positions of the parent's history (wpos is not the first slot of the block).
        need_copy = writable & (src != dst) & ((wpos % bs) != 0)[:, None]

        rows = self.block_table.repeat_interleave(W, dim=0)  # [B*W, C]
        cols = (self.j0[:, None] + torch.arange(self.nb_max, device=rows.device)[None, :])
        # In the last block of the context the tail's later columns lie past the table: they
        # are sent to the first tail column with its value (a scatter with duplicate indices
        # and different values would pick either).
        inside = cols < self.C
        valid = inside.repeat_interleave(W, dim=0)
        cols = torch.where(inside, cols, self.j0[:, None]).repeat_interleave(W, dim=0)
        in_tail = (torch.arange(self.nb_max, device=rows.device)[None, :]
                   < self.nb[:, None]).repeat_interleave(W, dim=0)
        values = torch.where(in_tail, tab.reshape(B * W, -1), rows.gather(1, cols))
        values = torch.where(valid, values, values[:, :1])
        rows = rows.scatter(1, cols, values)

        slots = torch.where(writable, dst * bs + (wpos % bs)[:, None],
                            torch.full_like(dst, PADDING_SLOT)).reshape(-1)
        # A row past the end of its context (its draft stopped earlier; its output is unused)
        # attends within the block table: positions at most max_model_len - 1.
        positions = wpos.clamp(max=self.max_model_len - 1).repeat_interleave(W)
        return BeamStepKV(block_table=rows.to(torch.int32), slot_mapping=slots,
                          positions=positions, seq_lens=(positions + 1).to(torch.int32),
                          copy_src=torch.where(need_copy, src, NULL_BLOCK).reshape(-1),
                          copy_dst=torch.where(need_copy, dst, NULL_BLOCK).reshape(-1),
                          num_copies=need_copy.sum())


def chain_step_kv(requests: RequestBlocks, t: int, block_size: int,
                  max_model_len: int) -> BeamStepKV:
    """KV plan for draft step t (>= 2) of one beam per row, the request's own chain: what
    ``BeamKVLayout(..., beam_width=1).step`` plans, without its tail bookkeeping. The beam
    writes position p+t-1 in the request's own blocks (vLLM's own draft chain writes there),
    so the table is the request's and nothing is copied.

    Args:
        requests: the requests' block tables, block counts and bonus positions p.
    """
    block_table, num_blocks = requests.block_table, requests.num_blocks
    B, C = block_table.shape
    bs = block_size
    wpos = requests.bonus_positions.to(torch.int64) + t - 1  # [B] position written at this step
    col = (wpos // bs).clamp(max=C - 1)
    writable = (wpos < max_model_len) & (wpos // bs < num_blocks.to(wpos.device))
    block = block_table.gather(1, col[:, None])[:, 0].to(torch.int64)
    slots = torch.where(writable, block * bs + wpos % bs, torch.full_like(wpos, PADDING_SLOT))
    positions = wpos.clamp(max=max_model_len - 1)
    none = torch.zeros(0, dtype=torch.int64, device=wpos.device)
    return BeamStepKV(block_table=block_table.to(torch.int32), slot_mapping=slots,
                      positions=positions, seq_lens=(positions + 1).to(torch.int32),
                      copy_src=none, copy_dst=none, num_copies=none.sum())
