"""Environment variables read by vllm-mtad (all VLLM_MTAD_*), read lazily at each access."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """VLLM_MTAD_CACHE_DIR: where built models are kept (default ~/.cache/vllm-mtad)."""
    return Path(os.environ.get("VLLM_MTAD_CACHE_DIR",
                               Path.home() / ".cache" / "vllm-mtad")).expanduser()


def phase_timers() -> bool:
    """VLLM_MTAD_PHASE_TIMERS=1: record per-phase wall-clock counters (vllm_mtad.timing); off by
    default, on in the benchmarks."""
    return os.environ.get("VLLM_MTAD_PHASE_TIMERS", "0").lower() in ("1", "true", "yes")


def compile_noise() -> bool:
    """VLLM_MTAD_COMPILE_NOISE=0: never torch.compile the dense noise kernel (default: compile
    it on first use in a process; it is used only for sampled requests without top-k)."""
    return os.environ.get("VLLM_MTAD_COMPILE_NOISE", "1").lower() not in ("0", "false", "no")


def noise_compile_min_elements() -> int:
    """VLLM_MTAD_NOISE_COMPILE_MIN_ELEMENTS: the size from which dense noise runs compiled
    (default 2**15; tests lower it to run the compiled kernel on tiny vocabularies)."""
    raw = os.environ.get("VLLM_MTAD_NOISE_COMPILE_MIN_ELEMENTS", str(1 << 15))
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(f"VLLM_MTAD_NOISE_COMPILE_MIN_ELEMENTS={raw!r} is not a whole number; "
                         "set it to an element count such as 32768, or unset it") from exc


def cpu_topk_select() -> bool:
    """VLLM_MTAD_CPU_TOPK_SELECT=1: on CPU, every engine in the process (the target alone and
    vLLM's own speculative decoding too, not only MTAD) draws top-k/top-p by one k-selection per
    row instead of vLLM's sort of the vocabulary: the same tokens, faster (a CPU speed fix, not
    MTAD; patches/worker/patch_topk_topp_sampler.py). Off by default; read at every sampling
    call, so an in-process engine follows a change at once. The benchmarks turn it on so that
    every engine they compare samples alike."""
    return os.environ.get("VLLM_MTAD_CPU_TOPK_SELECT", "0").lower() in ("1", "true", "yes")
