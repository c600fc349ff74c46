"""Draft-only KV room for the beams' private tails.

The scheduler hands out blocks of one pool that every layer shares (one block table; vLLM
0.32's ``allocate_kv_cache`` views one backing allocation with one block count). MTAD's beams
1..W-1 need private tail blocks for γ-1 positions, but only in the *draft* layers. So the draft
layers get ``S`` blocks more than the pool, ids ``num_blocks .. num_blocks + S - 1``, which the
scheduler never sees and the target's layers do not have:

- ``S = R · (W-1) · tail_blocks(γ, block_size)`` (vllm_mtad.beam_kv.scratch_blocks): each of
  the first ``R`` batch rows of a draft step owns a fixed range, so no allocation happens per
  step; the rows past ``R`` draft one beam that step (narrower or shorter rounds fit more rows,
  :func:`scratch_rows`);
- ``R`` is ``max_num_seqs`` where the tails of that many rows take at most ``beam_kv_fraction``
  (f) of the KV cache memory, and otherwise as many rows as f of it holds. The worker reports
  ``min(bytes of max_num_seqs rows, f · available)`` less memory for the KV cache *before* vLLM
  sizes its pool (so the pool plus the scratch fit the budget or the profiled free memory); the
  allocation then takes ``R`` from the pool vLLM settled on, ``f / (1 - f)`` of its bytes, which
  every tensor-parallel rank shares (each rank's own free memory may differ) and which never
  exceeds what was set aside. One startup log line states the result;
- the backing allocation grows by those bytes: the draft layers, which vLLM places last in a
  layer-outermost layout, are re-based so that each spans ``num_blocks + S`` pages, and their
  views get ``num_blocks + S`` blocks. The target layers' views are unchanged.

Requires one attention KV cache group in a layer-outermost layout with the draft layers last in
their backing tensor (vLLM's CPU layout, and its ``LBHNC``/``LBNHC`` layouts), kernel blocks equal
to KV blocks, and no KV connector (connectors assume the pool's block count in every layer);
anything else fails at startup with a message that says what to change.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace

import torch
from vllm.v1.kv_cache_interface import KVCacheConfig

from vllm_mtad.beam_kv import scratch_blocks, tail_blocks
from vllm_mtad.config import MTADConfig
from vllm_mtad.log import get_logger

logger = get_logger(__name__)


@dataclass(frozen=True)
class DraftLayers:
    """What the scratch is sized for: the draft's attention layers and the MTAD settings
    (the drafter hands them over: vllm_mtad.proposer.draft_layers_of)."""

    names: list[str]
    cfg: MTADConfig


@dataclass
class DraftScratch:
    draft_layers: list[str]
    blocks: int  # S
    rows: int  # batch rows with room (R <= max_num_seqs)
    bytes: int  # S · Σ draft page bytes
    beam_width: int
    tail_blocks: int
    max_rows: int  # max_num_seqs
    fraction: float  # beam_kv_fraction
    base: int | None = None  # first scratch block id = the pool's num_blocks, once allocated


def scratch_for(runner, draft: DraftLayers | None, specs=None,
                pool_blocks: int | None = None) -> DraftScratch | None:
    """The scratch an MTAD runner's ``draft`` needs (None without one, or when W = 1 or
    γ = 1): ``max_num_seqs`` rows, or, given the pool's block count, the rows that
    ``beam_kv_fraction`` allows beside it. ``specs``: the runner's ``get_kv_cache_spec()``,
    when the caller has it already."""
    if draft is None:
        return None
    cfg = draft.cfg
    rows = runner.scheduler_config.max_num_seqs
    layers = sorted(draft.names)
    specs = runner.get_kv_cache_spec() if specs is None else specs
    block_size = specs[layers[0]].block_size  # the draft's, as the proposer lays tails out
    per_row = scratch_blocks(1, cfg.num_speculative_tokens, cfg.beam_width, block_size)
    if per_row == 0:
        return None
    page_bytes = sum(specs[name].page_size_bytes for name in layers)
    f = cfg.beam_kv_fraction
    if pool_blocks is not None:
        pool_bytes = pool_blocks * sum(spec.page_size_bytes for spec in specs.values())
        fit = int(f / (1 - f) * pool_bytes) // (per_row * page_bytes)
        if fit < 1:
            logger.warning(
                "MTAD: beam_kv_fraction %s of this KV cache holds no request's beam tails; "
                "every request drafts one beam. Raise 'beam_kv_fraction' or the KV cache.", f)
            return None
        rows = min(rows, fit)
    return DraftScratch(layers, rows * per_row, rows, rows * per_row * page_bytes,
                       cfg.beam_width, tail_blocks(cfg.num_speculative_tokens, block_size),
                       runner.scheduler_config.max_num_seqs, f)


def reserve(runner, available: int, draft: DraftLayers | None) -> int:
    """The memory left for vLLM's KV pool once the scratch ``draft`` needs is set aside (the
    worker's ``determine_available_memory``): the tails of ``max_num_seqs`` rows, at most
    ``beam_kv_fraction`` of ``available``."""
    specs = runner.get_kv_cache_spec()
    scratch = scratch_for(runner, draft, specs)
    if scratch is None:
        return available
    if runner.vllm_config.kv_transfer_config is not None:
        raise ValueError(
            "MTAD's draft-only KV blocks for the beams (beam_width > 1) are not supported with "
            "a KV connector (kv_transfer_config): connectors assume every layer has the pool's "
            "block count. Use beam_width 1, or no KV connector.")
    layout = runner.cache_config.get_resolved_kv_cache_layout()
    if not layout.is_layer_compact:
        raise ValueError(
            f"MTAD keeps the beams' private KV tails in draft-only blocks and needs a "
            f"layer-outermost KV cache layout; this engine resolved {layout.name}. Set "
            "VLLM_KV_CACHE_LAYOUT to LBHNC or LBNHC (or use beam_width 1).")
    f = draft.cfg.beam_kv_fraction
    held = min(scratch.bytes, int(f * available))
    row_bytes = scratch.bytes // scratch.rows
    if held < row_bytes:
        raise ValueError(
            f"MTAD's draft-only KV room for the beams: beam_kv_fraction {f} of the "
            f"{available / 2**20:.2f} MiB available for the KV cache ({held / 2**20:.2f} MiB) "
            f"holds the beam tails of no request ({row_bytes / 2**20:.2f} MiB each: "
            f"(beam_width {scratch.beam_width} - 1) x {scratch.tail_blocks} blocks in "
            f"{len(scratch.draft_layers)} draft layers). Raise 'beam_kv_fraction', give the KV "
            "cache more memory, or lower 'beam_width'.")
    left = available - held
    block_bytes = sum(spec.page_size_bytes for spec in specs.values())
    max_len = runner.model_config.max_model_len
    need = -(-max_len // runner.cache_config.block_size) * block_bytes  # one longest request
    if left < need:
        raise ValueError(
            f"MTAD's draft-only KV room for the beams ({held / 2**20:.2f} MiB: up to "
            f"max_num_seqs {scratch.rows} x (beam_width {scratch.beam_width} - 1) x "
            f"{scratch.tail_blocks} blocks in {len(scratch.draft_layers)} draft layers, at most "
            f"beam_kv_fraction {f} of it) leaves "
            f"{max(left, 0) / 2**20:.2f} MiB of the {available / 2**20:.2f} MiB available for "
            f"the KV cache, less than one request of max_model_len {max_len} needs "
            f"({need / 2**20:.2f} MiB). Lower 'beam_width', 'beam_kv_fraction', max_num_seqs "
            "or max_model_len, or give the KV cache more memory.")
    return left


def wrap_available_memory(original, draft_of):
    """A worker's ``determine_available_memory``, less the scratch (patch_cpu_worker,
    patch_gpu_worker); ``draft_of(runner)``: the runner's DraftLayers, None without MTAD."""
    @functools.wraps(original)
    def determine_available_memory(self) -> int:
        return reserve(self.model_runner, original(self), draft_of(self.model_runner))

    return determine_available_memory


def scratch_rows(scratch: DraftScratch | None, width: int, gamma: int, block_size: int) -> int:
    """Rows whose W-1 beam tails fit in the scratch, laid out for this round's W and γ (0:
    none): the scratch is reserved for the configured ones, and a narrower or shorter round
    fits more rows (the rows past the count draft one beam)."""
    if scratch is None or scratch.base is None:
        return 0
    per_row = (width - 1) * tail_blocks(gamma, block_size)
    return scratch.blocks // per_row if per_row > 0 else scratch.rows


def with_scratch(kv_cache_config, scratch: DraftScratch):
    """The runner's ``kv_cache_config`` laid out for the scratch (:func:`extend_config`, in
    place) and handed on with the scratch: a :class:`KVCacheConfigWithScratch`, which the wrapped
    ``allocate_kv_cache`` receives as its argument and recognises
    (patches/worker/patch_gpu_model_runner.py). How the scratch reaches the allocator: by the
    argument vLLM passes it, not by a side channel."""
    extend_config(kv_cache_config, scratch)
    return KVCacheConfigWithScratch.of(kv_cache_config, scratch)


@dataclass
class KVCacheConfigWithScratch(KVCacheConfig):
    """vLLM's KVCacheConfig with one field more: the draft-only blocks' scratch, for the
    allocation it is handed to."""

    scratch: DraftScratch | None = None

    @classmethod
    def of(cls, config, scratch: DraftScratch) -> "KVCacheConfigWithScratch":
        return cls(**{f.name: getattr(config, f.name) for f in fields(config) if f.init},
                   scratch=scratch)


def scratch_of(kv_cache_config) -> DraftScratch | None:
    """The scratch that came with an allocation's config, None for vLLM's own configs."""
    return kv_cache_config.scratch if isinstance(kv_cache_config,
                                                  KVCacheConfigWithScratch) else None


def extend_config(kv_cache_config, scratch: DraftScratch) -> None:
    """Rewrite ``kv_cache_config.kv_cache_tensors`` in place: the draft layers' pages move to
    the end of the backing allocation, each layer spanning ``num_blocks + S`` pages. Sets
    ``scratch.base`` (the first scratch block id) and ``scratch.bytes`` (what the layout added)."""
    N = kv_cache_config.num_blocks
    draft = set(scratch.draft_layers)
    tensors = kv_cache_config.kv_cache_tensors
    size = tensors[0].size
    holders = [t for t in tensors if draft & set(t.layers)]
    ok = len(holders) == 1 and not kv_cache_config.needs_kv_cache_zeroing
    if ok:
        t = holders[0]
        n_target = len([x for x in t.layers if x not in draft])
        start = t.offset + n_target * t.layer_stride  # where the draft layers' pages begin
        ok = (set(t.layers[n_target:]) == draft and t.layer_stride == N * t.block_stride
              and t.offset + len(t.layers) * t.layer_stride == size
              # No other tensor (another cache group overlays the same bytes from offset 0)
              # may reach into the draft layers' pages, which grow into their neighbours'.
              and all(x.offset + len(x.layers) * x.layer_stride <= start
                      for x in tensors if x is not t))
    if not ok:
        raise ValueError(
            "MTAD's draft-only beam blocks need one attention KV cache group (no sliding-window "
            "or Mamba groups overlaying it) with the draft layers last in one layer-outermost "
            "KV cache tensor at the end of the allocation; this engine laid the cache out "
            f"otherwise ({[(t.layers, t.layer_stride, t.block_stride) for t in tensors]}). "
            "Set VLLM_KV_CACHE_LAYOUT=LBHNC, or use beam_width 1.")
    extra = len(draft) * scratch.blocks * t.block_stride
    new_size = size + extra
    target_part = replace(t, size=new_size, layers=t.layers[:n_target]) if n_target else None
    draft_part = replace(t, size=new_size, layers=t.layers[n_target:],
                         offset=t.offset + n_target * t.layer_stride,
                         layer_stride=(N + scratch.blocks) * t.block_stride)
    out = []
    for x in tensors:
        if x is t:
            out += [p for p in (target_part, draft_part) if p is not None]
        else:
            out.append(replace(x, size=new_size))
    kv_cache_config.kv_cache_tensors = out
    scratch.base = N
    scratch.bytes = extra


def allocate(original, kv_cache_config, device, layout, kernel_block_sizes, scratch: DraftScratch):
    """vLLM's ``allocate_kv_cache`` with the draft layers viewed over ``num_blocks + S`` blocks
    (``kv_cache_config`` already laid out by :func:`with_scratch`)."""
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs, create_kv_cache_views

    draft = set(scratch.draft_layers)
    tensor = next(t for t in kv_cache_config.kv_cache_tensors if draft & set(t.layers))
    gid, group = next((i, g) for i, g in enumerate(kv_cache_config.kv_cache_groups)
                      if tensor.layers[0] in g.layer_names)
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        spec = spec.kv_cache_specs[tensor.layers[0]]
    kernel_block_size = (kernel_block_sizes[gid] if kernel_block_sizes is not None
                         and gid < len(kernel_block_sizes) else None)
    if kernel_block_size not in (None, spec.block_size):
        # The beams' block tables and copies address manager blocks; a backend that splits
        # them into smaller kernel blocks would read other blocks.
        raise ValueError(
            f"MTAD's beam KV layout needs the attention kernel's block size to equal the KV "
            f"block size; this backend splits blocks of {spec.block_size} into "
            f"{kernel_block_size}. Set block_size to {kernel_block_size}, or use beam_width 1.")
    kv_caches = original(kv_cache_config, device, layout, kernel_block_sizes)
    storage = kv_caches[tensor.layers[0]].untyped_storage()
    buf = torch.empty(0, dtype=torch.int8, device=device).set_(storage)
    views = create_kv_cache_views(buf, spec, kv_cache_config.num_blocks + scratch.blocks, layout,
                                  tensor, kernel_block_size=kernel_block_size)
    kv_caches.update(zip(tensor.layers, views))
    logger.info(
        "MTAD: %d draft-only KV blocks (%.2f MiB) hold the private tails of beams 1..%d of up "
        "to %d requests of a batch (%d block(s) per beam, %d draft layers, block ids %d..%d; "
        "max_num_seqs %d, beam_kv_fraction %s); the target's layers reserve only vLLM's own "
        "lookahead per request", scratch.blocks, scratch.bytes / 2**20, scratch.beam_width - 1,
        scratch.rows, scratch.tail_blocks, len(draft), scratch.base,
        scratch.base + scratch.blocks - 1,
        scratch.max_rows, scratch.fraction)
    return kv_caches
