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
