"""Counter-based random noise for MTAD, keyed by (request seed, position, step, index).

Why counter-based: a request's draft must be reproducible from its seed alone (independent of
which other requests share the batch) and identical on every tensor-parallel rank without any
communication. A stateful ``torch.Generator`` gives neither across batch compositions. Here each
random number is a pure function of its key, hashed with integer arithmetic that is exact and
identical on every device.

All arithmetic is on int64 tensors holding unsigned 32-bit values, written so that no
intermediate exceeds 2**63 (signed overflow differs between backends); the result does not
depend on the device or on the batch layout.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from vllm_mtad import envs

_MASK32 = 0xFFFFFFFF

# Stream tags keep noise used for different purposes independent.
STREAM_DRAFT = 1
STREAM_EXTRA_TOKEN = 2
STREAM_FLY = 3  # FLy's uniforms (a comparison baseline: vllm_mtad.core.fly)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32) without int64 overflow (c split in 16-bit halves)."""
    c_lo, c_hi = c & 0xFFFF, c >> 16
    return (x * c_lo + (((x * c_hi) & 0xFFFF) << 16)) & _MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit integer hash ("lowbias32", C. Wellons), elementwise on int64."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


@dataclass(frozen=True)
class NoiseKeys:
    """What travels with every batch of rows that may draw noise: which rows are sampled and
    the key of each row's noise."""

    greedy: torch.Tensor  # [B] bool: rows decoded without noise (argmax / beam search)
    seeds: torch.Tensor  # [B] int64: the request's seed
    positions: torch.Tensor  # [B] int64: the sequence position the noise is for
    # Whether some row is sampled, known on the host; None: read from ``greedy`` (a sync).
    any_sampled: bool | None = None

    def sampled_any_host_sync(self) -> bool:
        """Whether some row is sampled (a device read when ``any_sampled`` is None)."""
        if self.any_sampled is None:
            return bool((~self.greedy).any())
        return self.any_sampled

    def shifted(self, offset) -> "NoiseKeys":
        """The same rows keyed ``offset`` positions on ([B] tensor or int)."""
        return replace(self, positions=self.positions + offset)


def row_keys(seeds: torch.Tensor, positions: torch.Tensor, step: int | torch.Tensor,
             stream: int) -> torch.Tensor:
    """One well-mixed 32-bit key per row from (seed, position, step, stream).

    Args:
        seeds: [num_rows] int64, any value (all 64 bits are used).
        positions: [num_rows] int64, the sequence position the noise is for.
        step: an integer or a [num_rows] tensor, the draft step (1..γ) or another counter.
        stream: int, one of the ``STREAM_*`` tags.
    Returns:
        [num_rows] int64 holding values in [0, 2**32).
    """
    seeds = seeds.to(torch.int64)
    h = torch.full_like(seeds, 0x9E3779B9 ^ stream)
    # An int step stays a Python scalar: a tensor made from it would be a host-to-device copy,
    # which a CUDA graph cannot capture (benchmarks.kernels core).
    step_part = (step.to(device=seeds.device, dtype=torch.int64) & _MASK32
                 if isinstance(step, torch.Tensor) else int(step) & _MASK32)
    for part in (seeds & _MASK32, (seeds >> 32) & _MASK32,
                 positions.to(torch.int64) & _MASK32, step_part):
        h = mix32(((h ^ part) + 0x6A09E667) & _MASK32)
    return h


def uniform(keys: torch.Tensor, num_cols: int) -> torch.Tensor:
    """Uniform noise in (0, 1), float64, one value per (row key, column).

    Args:
        keys: [num_rows] int64 from :func:`row_keys`.
        num_cols: columns per row; column j's value depends only on (key, j).
    Returns:
        [num_rows, num_cols] float64, strictly inside (0, 1).
    """
    cols = torch.arange(num_cols, dtype=torch.int64, device=keys.device)
    return uniform_at(keys, cols[None, :])


def uniform_at(keys: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """:func:`uniform` at chosen columns only: ``uniform_at(keys, cols)[r, j] ==
    uniform(keys, n)[r, cols[r, j]]``, at a cost proportional to ``cols``' size, not to n.

    Args:
        keys: [num_rows] int64 from :func:`row_keys`.
        cols: [num_rows or 1, num_picked] int64, column indices (any non-negative values).
    Returns:
        [num_rows, num_picked] float64, strictly inside (0, 1).
    """
    # Two rounds: the column hash is added to the row key (not xor-ed), so two rows' inputs
    # coincide only by chance, then mixed again.
    h = mix32((keys[:, None] + mix32(cols & _MASK32)) & _MASK32)
    h = mix32(h ^ keys[:, None])
    return (h.to(torch.float64) + 0.5) / 4294967296.0


def _gumbel_dense_eager(keys: torch.Tensor, num_cols: int) -> torch.Tensor:
    return (-torch.log(-torch.log(uniform(keys, num_cols)))).to(torch.float32)


# Module-level state: each compiled kernel, compiled once per process on first use (a
# torch.compile per engine would cost seconds each; inductor caches them on disk); None until
# first use, False once compiling failed or is disabled (VLLM_MTAD_COMPILE_NOISE=0).
# - the dense kernel (:func:`_gumbel_dense_eager`): its ~45 integer and float operations per
#   element fused into one loop, bit-identical; 18x faster than eager for [16, 4·151,936] on
#   one CPU core (benchmarks.kernels vocab).
# - the kernel at chosen columns (:func:`_gumbel_at_eager`): on CUDA, eagerly, each of those
#   operations is a kernel launch (189 µs for the 80 values of a beam step of 4 rows on an
#   H200, 60 % of the step replayed from a CUDA graph; benchmarks/reports/core-gpu-h200).
_compiled = None
_compiled_at = None


def _compiled_or_eager(which: str, eager, *args) -> torch.Tensor:
    """``eager(*args)`` through its torch.compile'd kernel (the module attribute ``which``),
    compiled on first use; eagerly where compiling is disabled or fails (same values)."""
    kernel = globals()[which]
    if kernel is None:
        kernel = torch.compile(eager, dynamic=True) if envs.compile_noise() else False
        globals()[which] = kernel
    if kernel:
        try:
            return kernel(*args)
        except Exception as exc:  # no C++ compiler, unsupported device, ...
            import logging

            logging.getLogger("vllm.mtad.core.noise").warning(
                "vllm-mtad: compiling a noise kernel failed (%s: %s); using the eager version "
                "(same values, slower)", type(exc).__name__, exc)
            globals()[which] = False
    return eager(*args)


def gumbel(keys: torch.Tensor, num_cols: int) -> torch.Tensor:
    """Standard Gumbel noise, float32, [num_rows, num_cols]; see :func:`uniform`.

    Large requests (every column of a 152k vocabulary, times W beams) run a compiled kernel with
    the same values; small ones run eagerly.
    """
    # Below the threshold (2**15 elements by default) a draw is cheap enough eagerly that a
    # one-time compilation does not pay; the tiny vocabularies of the tests stay eager.
    if keys.numel() * num_cols >= envs.noise_compile_min_elements():
        return _compiled_or_eager("_compiled", _gumbel_dense_eager, keys, num_cols)
    return _gumbel_dense_eager(keys, num_cols)


def _gumbel_at_eager(keys: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    return (-torch.log(-torch.log(uniform_at(keys, cols)))).to(torch.float32)


def gumbel_at(keys: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise at chosen columns, float32: ``gumbel_at(keys, cols)[r, j] ==
    gumbel(keys, n)[r, cols[r, j]]``; see :func:`uniform_at`.

    On CUDA it always runs compiled (one kernel instead of some fifty launches); elsewhere from
    the dense kernel's threshold on (2**15 values by default: a step's B·W·K candidates stay
    below it unless top-k is large, e.g. 16 requests × 4 beams need K > 512).
    """
    if keys.device.type == "cuda" or cols.numel() >= envs.noise_compile_min_elements():
        return _compiled_or_eager("_compiled_at", _gumbel_at_eager, keys, cols)
    return _gumbel_at_eager(keys, cols)
