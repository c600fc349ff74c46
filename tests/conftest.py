from __future__ import annotations

import os

import pytest

# vLLM in-process (no engine-core/worker subprocesses) and one thread: ~3 s per engine instead
# of ~17 s (docs/vllm-quirks.md#start-up-speed-on-a-small-cpu-machine). Tests that need the
# real multi-process layout (the server, TP) start their own processes.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_pair_dirs(tmp_path_factory):
    """(target_dir, draft_dir) of a tiny random Llama pair built for this test session."""
    from devtools.tiny_models import build_tiny_pair

    return build_tiny_pair(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def tiny_pair(tiny_pair_dirs):
    """The tiny pair loaded as (target, draft) transformers models."""
    from devtools.tiny_models import load_pair

    return load_pair(*tiny_pair_dirs)
