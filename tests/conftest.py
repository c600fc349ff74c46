from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_pair_dirs(tmp_path_factory):
    """(target_dir, draft_dir) of a tiny random Llama pair built for this test session."""
    from vllm_mtad.tiny_models import build_tiny_pair

    return build_tiny_pair(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def tiny_pair(tiny_pair_dirs):
    """The tiny pair loaded as (target, draft) transformers models."""
    from vllm_mtad.tiny_models import load_pair

    return load_pair(*tiny_pair_dirs)
