"""The beam KV layout, simulated on a toy paged cache (no vLLM): through its block table every
live beam must read exactly the shared prefix followed by its own token history, after the
planned copies and writes of every step, for random re-parentings."""

from __future__ import annotations

import random

import pytest
import torch

from vllm_mtad.beam_kv import BeamKVLayout, lookahead_tokens, tail_blocks

pytestmark = pytest.mark.core

PREFIX = 1_000_000  # cache value of prefix position i: PREFIX + i; beam tokens are < PREFIX


def simulate(p, gamma, W, bs, spare_blocks, seed, max_model_len=10_000):
    rng = random.Random(seed)
    num_blocks_total = 64
    cache = torch.full((num_blocks_total, bs), -1, dtype=torch.int64)  # one "layer"
    # The request owns blocks in a shuffled order (paged: not contiguous).
    ids = list(range(1, num_blocks_total))
    rng.shuffle(ids)
    owned = (p + 1 + gamma) // bs + 1 + spare_blocks
    table = torch.tensor([ids[:owned] + [0] * (24 - owned)])
    for pos in range(p + 1):  # the prefix, including the bonus token at p
        cache[table[0, pos // bs], pos % bs] = PREFIX + pos
    layout = BeamKVLayout(table, torch.tensor([owned]), torch.tensor([p]), gamma, W, bs,
                          max_model_len)
    width = int(layout.row_beam_width[0])
    histories = [[]]  # token history of each previous-step beam (root: empty)
    parents = torch.zeros(1, W, dtype=torch.int64)
    for t in range(2, gamma + 1):
        kv = layout.step(parents, t)
        # Copies first (gather, then scatter), then each live beam writes its token.
        cache[kv.copy_dst] = cache[kv.copy_src].clone()
        new_hist = [histories[int(parents[0, w])] + [rng.randrange(1000)] for w in range(W)]
        for w in range(W):
            slot = int(kv.slot_mapping[w])
            if w < width:
                assert slot >= 0
                cache.view(-1)[slot] = new_hist[w][-1]
            else:
                assert slot == -1  # beams beyond the row's width never write
        # Every live beam reads prefix + its history through its own block table row.
        wpos = p + t - 1
        for w in range(width):
            bt = kv.block_table[w].long()
            seen = [int(cache[bt[q // bs], q % bs]) for q in range(wpos + 1)]
            assert seen == [PREFIX + q for q in range(p + 1)] + new_hist[w], (t, w)
            assert int(kv.seq_lens[w]) == wpos + 1 and int(kv.positions[w]) == wpos
        # The request's own prefix blocks are never touched.
        for q in range(p + 1):
            assert int(cache[table[0, q // bs], q % bs]) in (PREFIX + q,) or q // bs == (p + 1) // bs
        histories = new_hist
        live = max(width, 1)
        parents = torch.tensor([[rng.randrange(live) for _ in range(W)]])
    return width, layout


@pytest.mark.parametrize("p", [0, 5, 30, 31, 32, 62, 95])
@pytest.mark.parametrize("gamma,W,bs", [(4, 4, 32), (6, 3, 4), (9, 2, 4), (2, 4, 8)])
def test_each_beam_reads_its_own_history(p, gamma, W, bs):
    spare = (W - 1) * tail_blocks(gamma, bs)
    for seed in range(5):
        width, _ = simulate(p, gamma, W, bs, spare, seed)
        assert width == W


def test_fallback_to_fewer_beams_without_room():
    width, layout = simulate(p=30, gamma=4, W=4, bs=8, spare_blocks=0, seed=0)
    assert width == 1
    width, _ = simulate(p=30, gamma=4, W=4, bs=8, spare_blocks=2 * tail_blocks(4, 8), seed=0)
    assert width == 3


def test_only_partial_tail_blocks_are_copied():
    """Copies never exceed one block per beam per step, whatever the context length."""
    for p in (40, 4000):
        table = torch.arange(1, 201)[None]
        layout = BeamKVLayout(table, torch.tensor([200]), torch.tensor([p % 3000]), 4, 4, 16,
                              100_000)
        parents = torch.zeros(1, 4, dtype=torch.int64)
        kv = layout.step(parents, 2)
        assert int(kv.num_copies) <= 3
        real = kv.copy_src != 0  # the other entries copy the null block onto itself
        assert int(real.sum()) == int(kv.num_copies) and bool((kv.copy_dst[~real] == 0).all())


def test_lookahead_covers_w_tails():
    assert lookahead_tokens(4, 1, 128) == 5
    assert lookahead_tokens(4, 4, 128) == 5 + 3 * 2 * 128
    assert tail_blocks(2, 16) == 1 and tail_blocks(3, 16) == 2 and tail_blocks(40, 16) == 4
