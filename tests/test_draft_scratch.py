"""The draft-only KV blocks of the beams' tails: layout, memory, rows with room."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def _kv_config(num_blocks, layers, page, offset=0, extra_tensor=None):
    from types import SimpleNamespace

    from vllm.v1.kv_cache_interface import KVCacheTensor

    size = offset + len(layers) * num_blocks * page
    tensors = [KVCacheTensor(size=size, layers=list(layers), layer_stride=num_blocks * page,
                             block_stride=page, offset=offset)]
    if extra_tensor is not None:
        tensors.append(extra_tensor)
    return SimpleNamespace(num_blocks=num_blocks, kv_cache_tensors=tensors,
                           needs_kv_cache_zeroing=False)


def test_draft_scratch_extends_only_the_draft_layers():
    """The draft layers, last in a layer-outermost tensor, move to span num_blocks + S pages at
    the end of a backing allocation grown by exactly their S pages; the target layers' places
    do not change; a layout with the draft layers elsewhere is refused with a clear message."""
    from vllm_mtad.draft_scratch import DraftScratch, extend_config

    page, N, S = 1024, 10, 6
    layers = ["t0", "t1", "t2", "d0", "d1"]
    cfg = _kv_config(N, layers, page)
    plan = DraftScratch(["d0", "d1"], S, rows=1, bytes=0, beam_width=4, tail_blocks=2,
                       max_rows=1, fraction=0.1)
    extend_config(cfg, plan)
    target, draft = cfg.kv_cache_tensors
    assert target.layers == ["t0", "t1", "t2"] and draft.layers == ["d0", "d1"]
    assert target.offset == 0 and target.layer_stride == N * page
    assert draft.offset == 3 * N * page and draft.layer_stride == (N + S) * page
    assert target.size == draft.size == 5 * N * page + 2 * S * page
    assert draft.offset + 2 * draft.layer_stride == draft.size  # ends at the allocation's end
    assert plan.base == N and plan.bytes == 2 * S * page

    bad = _kv_config(N, ["d0", "d1", "t0"], page)  # draft layers not last
    with pytest.raises(ValueError, match="VLLM_KV_CACHE_LAYOUT"):
        extend_config(bad, DraftScratch(["d0", "d1"], S, 1, 0, 4, 2, 1, 0.1))
    packed = _kv_config(N, layers, page)  # block-outermost: pages of all layers per block
    t = packed.kv_cache_tensors[0]
    packed.kv_cache_tensors[0] = type(t)(size=t.size, layers=t.layers, layer_stride=page,
                                         block_stride=5 * page)
    with pytest.raises(ValueError, match="VLLM_KV_CACHE_LAYOUT"):
        extend_config(packed, DraftScratch(["d0", "d1"], S, 1, 0, 4, 2, 1, 0.1))
    # A second cache group (e.g. sliding-window layers) overlays the same bytes from offset 0:
    # the draft layers' growth would land on its pages.
    from vllm.v1.kv_cache_interface import KVCacheTensor

    other = KVCacheTensor(size=5 * N * page, layers=["s0", "s1", "s2", "s3"],
                          layer_stride=N * page, block_stride=page)
    overlaid = _kv_config(N, layers, page, extra_tensor=other)
    with pytest.raises(ValueError, match="one attention KV cache group"):
        extend_config(overlaid, DraftScratch(["d0", "d1"], S, 1, 0, 4, 2, 1, 0.1))
    mamba = _kv_config(N, layers, page)
    mamba.needs_kv_cache_zeroing = True
    with pytest.raises(ValueError, match="one attention KV cache group"):
        extend_config(mamba, DraftScratch(["d0", "d1"], S, 1, 0, 4, 2, 1, 0.1))


def _scratch_runner(*, max_num_seqs=8, fraction=0.1, width=4,
                    gamma=4, block_size=32, max_model_len=256):
    """A model runner as draft_scratch sees it: 4 target and 3 draft attention layers (pages
    of 7 and 3 units), an MTAD drafter, vLLM's layer-outermost layout."""
    from types import SimpleNamespace

    from vllm_mtad.config import MTADConfig
    from vllm_mtad.proposer import MTADProposer, draft_layers_of

    drafter = MTADProposer.__new__(MTADProposer)  # only the attributes draft_layers_of reads
    drafter.mtad = MTADConfig(gamma, width, beam_kv_fraction=fraction)
    drafter._draft_attn_layer_names = ["d0", "d2", "d1"]
    specs = {name: SimpleNamespace(block_size=block_size, page_size_bytes=700)
             for name in ("t0", "t1", "t2", "t3")}
    specs |= {name: SimpleNamespace(block_size=block_size, page_size_bytes=300)
              for name in drafter._draft_attn_layer_names}
    layout = SimpleNamespace(is_layer_compact=True, name="LBHNC")
    runner = SimpleNamespace(
        drafter=drafter, get_kv_cache_spec=lambda: specs,
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        vllm_config=SimpleNamespace(kv_transfer_config=None),
        cache_config=SimpleNamespace(block_size=block_size,
                                     get_resolved_kv_cache_layout=lambda: layout),
        model_config=SimpleNamespace(max_model_len=max_model_len))
    # What the drafter hands draft_scratch: its layers (sorted) and settings.
    runner.draft = draft_layers_of(runner)
    assert runner.draft.names == ["d0", "d1", "d2"] and runner.draft.cfg is drafter.mtad
    return runner


def test_draft_scratch_takes_at_most_beam_kv_fraction_of_the_kv_cache():
    """The beams' draft-only blocks: all max_num_seqs rows where their tails take at most
    beam_kv_fraction of the KV memory; otherwise that fraction, and the rows it holds, counted
    from the pool vLLM settles on (the same on every tensor-parallel rank) and never more than
    each rank set aside. Too small a fraction for one row fails naming the key."""
    from vllm_mtad.draft_scratch import reserve, scratch_for

    block = 4 * 700 + 3 * 300  # pool bytes per block
    row = 3 * 2 * 900  # (W-1) beams x 2 tail blocks x the draft layers' page bytes
    # Plenty of memory: all 8 rows, the pool gets the rest.
    runner = _scratch_runner()
    available = 10_000 * block
    left = reserve(runner, available, runner.draft)
    assert left == available - 8 * row
    plan = scratch_for(runner, runner.draft, pool_blocks=left // block)
    assert (plan.rows, plan.blocks, plan.bytes) == (8, 8 * 6, 8 * row)
    # A small budget: a tenth of it, and the rows that tenth holds.
    available = 60 * block
    left = reserve(runner, available, runner.draft)
    assert left == available - int(0.1 * available)
    plan = scratch_for(runner, runner.draft, pool_blocks=left // block)
    assert 1 <= plan.rows < 8 and plan.bytes <= available - left
    assert (plan.rows + 1) * row > 0.1 / 0.9 * (left // block) * block  # no row left out
    # Two tensor-parallel ranks with different free memory: vLLM's pool is the smaller one's,
    # both ranks draft the same rows, and each fits in what it set aside.
    budgets = [60 * block, 75 * block]
    lefts = [reserve(runner, a, runner.draft) for a in budgets]
    pool = min(x // block for x in lefts)
    plans = [scratch_for(runner, runner.draft, pool_blocks=pool) for _ in budgets]
    assert plans[0].rows == plans[1].rows
    assert all(p.bytes <= a - x for p, a, x in zip(plans, budgets, lefts))
    # A fraction that holds no request's tails.
    with pytest.raises(ValueError, match=r"beam_kv_fraction 0.01 .* holds the beam tails of no"):
        small = _scratch_runner(fraction=0.01)
        reserve(small, 60 * block, small.draft)
    # One beam or one draft token: no scratch; a runner without MTAD's drafter: none either.
    for other in (_scratch_runner(width=1), _scratch_runner(gamma=1)):
        assert scratch_for(other, other.draft) is None
    assert scratch_for(runner, None) is None


def test_scratch_rows_for_the_rounds_width_and_length():
    """The scratch is reserved for (beam_width, γ) x max_num_seqs rows; a round with fewer
    beams or a shorter draft lays its tails out for itself and fits more rows."""
    from types import SimpleNamespace

    from vllm_mtad.beam_kv import scratch_blocks
    from vllm_mtad.draft_scratch import scratch_rows

    blocks = scratch_blocks(8, 4, 4, 32)
    scratch = SimpleNamespace(blocks=blocks, rows=8, base=1000)  # allocated: base is set
    assert scratch_rows(scratch, 4, 4, 32) == 8
    assert scratch_rows(scratch, 2, 4, 32) == 24  # one tail per row instead of three
    assert scratch_rows(scratch, 1, 4, 32) == 8  # W = 1 needs no scratch
