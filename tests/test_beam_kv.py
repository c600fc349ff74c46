"""The beam KV layout, simulated on a toy paged cache (no vLLM): through its block table every
live beam must read exactly the shared prefix followed by its own token history, after the
planned copies and writes of every step, for random re-parentings."""

from __future__ import annotations

import random

import pytest
import torch

from vllm_mtad.beam_kv import (BeamKVLayout, RequestBlocks, chain_step_kv, scratch_blocks,
                               tail_blocks)

pytestmark = pytest.mark.unit

PREFIX = 1_000_000  # cache value of request b's prefix position i: PREFIX·(b+1) + i
POOL = 64  # the shared pool's blocks; draft-only scratch blocks follow at POOL ..


def simulate(ps, gamma, W, bs, seed, scratch_rows=None, max_model_len=10_000):
    """Batch rows with bonus positions ``ps`` on one toy paged cache (one "layer": the draft's,
    with POOL + scratch blocks). Returns each row's beam width."""
    rng = random.Random(seed)
    B = len(ps)
    scratch_rows = B if scratch_rows is None else scratch_rows
    S = scratch_blocks(scratch_rows, gamma, W, bs)
    cache = torch.full((POOL + S, bs), -1, dtype=torch.int64)
    # The requests own blocks in a shuffled order (paged: not contiguous); each owns what
    # vLLM's lookahead (γ slots past the bonus token) gives it, nothing more.
    ids = list(range(1, POOL))
    rng.shuffle(ids)
    owned = [(p + gamma) // bs + 1 for p in ps]
    C = max(owned) + 2
    rows, start = [], 0
    for n in owned:
        rows.append(ids[start:start + n] + [0] * (C - n))
        start += n
    table = torch.tensor(rows)
    for b, p in enumerate(ps):
        for pos in range(p + 1):  # the prefix, including the bonus token at p
            cache[table[b, pos // bs], pos % bs] = PREFIX * (b + 1) + pos
    before = cache[:POOL].clone()
    layout = BeamKVLayout(RequestBlocks(table, torch.tensor(owned), torch.tensor(ps)), gamma, W,
                          bs, max_model_len, POOL, scratch_rows)
    widths = [int(x) for x in layout.row_beam_width]
    histories = [[[]] for _ in range(B)]  # token history of each previous-step beam
    parents = torch.zeros(B, W, dtype=torch.int64)
    for t in range(2, gamma + 1):
        kv = layout.step(parents, t)
        # Copies first (gather, then scatter), then each live beam writes its token.
        cache[kv.copy_dst] = cache[kv.copy_src].clone()
        new_hist = [[histories[b][int(parents[b, w])] + [rng.randrange(1000)] for w in range(W)]
                    for b in range(B)]
        for b in range(B):
            for w in range(W):
                slot = int(kv.slot_mapping[b * W + w])
                if w < widths[b]:
                    assert slot >= 0
                    cache.view(-1)[slot] = new_hist[b][w][-1]
                else:
                    assert slot == -1  # beams beyond the row's width never write
        # Every live beam reads its request's prefix + its own history through its own
        # block table row.
        for b, p in enumerate(ps):
            wpos = p + t - 1
            for w in range(widths[b]):
                bt = kv.block_table[b * W + w].long()
                assert bool((bt < POOL + S).all())
                seen = [int(cache[bt[q // bs], q % bs]) for q in range(wpos + 1)]
                want = [PREFIX * (b + 1) + q for q in range(p + 1)] + new_hist[b][w]
                assert seen == want, (b, t, w)
                assert int(kv.seq_lens[b * W + w]) == wpos + 1
                assert int(kv.positions[b * W + w]) == wpos
            # Beams beyond the width read only real blocks (their rows still run).
            for w in range(widths[b], W):
                assert bool((kv.block_table[b * W + w].long() < POOL + S).all())
        # The requests' prefix slots are never touched: beams write past p, and beams
        # w >= 1 write in scratch blocks only.
        for b, p in enumerate(ps):
            for q in range(p + 1):
                blk = table[b, q // bs]
                assert int(cache[blk, q % bs]) == int(before[blk, q % bs])
        histories = new_hist
        parents = torch.tensor([[rng.randrange(max(widths[b], 1)) for _ in range(W)]
                                for b in range(B)])
    return widths, layout


@pytest.mark.parametrize("p", [0, 5, 30, 31, 32, 62, 95])
@pytest.mark.parametrize("gamma,W,bs", [(4, 4, 32), (6, 3, 4), (9, 2, 4), (2, 4, 8)])
def test_each_beam_reads_its_own_history(p, gamma, W, bs):
    for seed in range(5):
        widths, _ = simulate([p], gamma, W, bs, seed)
        assert widths == [W]


@pytest.mark.parametrize("gamma,W,bs", [(4, 4, 32), (6, 3, 4), (3, 8, 2)])
def test_rows_of_one_batch_share_the_scratch_without_collisions(gamma, W, bs):
    """Rows at every offset within a block (some crossing a block boundary, some not), drafted
    together: each beam still reads exactly its own request's prefix and its own history."""
    for seed in range(3):
        ps = [seed * 7 + k for k in range(bs + 3)]
        widths, layout = simulate(ps, gamma, W, bs, seed)
        assert widths == [W] * len(ps)
        scratch = layout.own[:, 1:].reshape(-1)
        assert len(set(scratch.tolist())) == scratch.numel()  # private blocks, all distinct
        assert int(scratch.min()) >= POOL


def test_rows_without_scratch_room_draft_one_beam():
    widths, _ = simulate([30, 31, 40], gamma=4, W=4, bs=8, seed=0, scratch_rows=2)
    assert widths == [4, 4, 1]
    widths, _ = simulate([30], gamma=4, W=4, bs=8, seed=0, scratch_rows=0)
    assert widths == [1]


def test_only_partial_tail_blocks_are_copied():
    """Copies never exceed one block per beam per step, whatever the context length."""
    for p in (40, 4000):
        table = torch.arange(1, 201)[None]
        layout = BeamKVLayout(RequestBlocks(table, torch.tensor([200]), torch.tensor([p % 3000])),
                              4, 4, 16, 100_000, 201, 1)
        parents = torch.zeros(1, 4, dtype=torch.int64)
        kv = layout.step(parents, 2)
        assert int(kv.num_copies) <= 3
        real = kv.copy_src != 0  # the other entries copy the null block onto itself
        assert int(real.sum()) == int(kv.num_copies) and bool((kv.copy_dst[~real] == 0).all())


def test_scratch_is_bounded_by_rows_not_blocks():
    assert scratch_blocks(32, 4, 4, 32) == 32 * 3 * 2
    assert scratch_blocks(8, 4, 1, 32) == 0 and scratch_blocks(8, 1, 4, 32) == 0
    assert tail_blocks(2, 16) == 1 and tail_blocks(3, 16) == 2 and tail_blocks(40, 16) == 4


def test_tail_in_the_last_block_of_the_context_keeps_the_scratch_blocks():
    """When the tail's first column is the block table's last one (the last block of
    max_model_len), the tail's second column lies past the table; beams 1..W-1 must still read
    and write their scratch block there, not the request's (a scatter with a duplicate column
    used to let the request's block win)."""
    C, bs, W, gamma = 8, 32, 3, 4
    table = torch.arange(10, 10 + C, dtype=torch.int32)[None, :]
    p = torch.tensor([7 * bs + 5])  # first tail column 7 = C - 1
    layout = BeamKVLayout(RequestBlocks(table, torch.tensor([C]), p), gamma, W, bs, C * bs,
                          scratch_base=100, scratch_rows=1)
    kv = layout.step(torch.zeros(1, W, dtype=torch.int64), 2)
    last = kv.block_table[:, C - 1].tolist()
    assert last[0] == 17  # beam 0: the request's own block
    assert last[1] == 100 and last[2] == 102  # beams 1, 2: their scratch (2 blocks per beam)
    assert kv.slot_mapping.tolist()[1:] == [100 * bs + (p.item() + 1) % bs,
                                            102 * bs + (p.item() + 1) % bs]


@pytest.mark.parametrize("max_model_len", [10_000, 42])
@pytest.mark.parametrize("bs", [1, 4, 16])
def test_the_argmax_chain_plans_what_a_one_beam_layout_plans(bs, max_model_len):
    """The all-"exact" round's shortcut (chain_step_kv) writes, reads and attends exactly where
    a one-beam BeamKVLayout does, near the end of the context too (max_model_len 42: some rows'
    later steps write nothing), with no copies."""
    gamma, ps = 6, [3, 15, 16, 31, 37, 40]
    owned = [min((p + gamma) // bs + 1, (max_model_len + bs - 1) // bs) for p in ps]
    C = max(owned) + 2
    ids = list(range(1, 1000))
    random.Random(bs).shuffle(ids)
    rows, start = [], 0
    for n in owned:
        rows.append(ids[start:start + n] + [0] * (C - n))
        start += n
    table, num_blocks, p = torch.tensor(rows), torch.tensor(owned), torch.tensor(ps)
    requests = RequestBlocks(table, num_blocks, p)
    layout = BeamKVLayout(requests, gamma, 1, bs, max_model_len, 1000, len(ps))
    for t in range(2, gamma + 1):
        want = layout.step(torch.zeros(len(ps), 1, dtype=torch.int64), t)
        got = chain_step_kv(requests, t, bs, max_model_len)
        assert int(want.num_copies) == int(got.num_copies) == 0
        for name in ("block_table", "slot_mapping", "positions", "seq_lens"):
            assert torch.equal(getattr(got, name), getattr(want, name)), (name, t)
    # Some writes were refused (past max_model_len), so the case above reaches that branch.
    assert max_model_len > 100 or (got.slot_mapping == -1).any()
