"""Environment variables read by vllm-mtad (all VLLM_MTAD_*), read lazily at each access."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """VLLM_MTAD_CACHE_DIR: where built models are kept (default ~/.cache/vllm-mtad)."""
    return Path(os.environ.get("VLLM_MTAD_CACHE_DIR",
                               Path.home() / ".cache" / "vllm-mtad")).expanduser()
