"""Every patch file is documented and listed, and patching is idempotent and reversible."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

pytestmark = pytest.mark.patches

PATCH_DIR = Path(__file__).parent.parent / "patches"
FIELDS = ("Target:", "Why:", "How:", "Upstream:", "Checked:", "Removal:")


def patch_files():
    return sorted(p for p in PATCH_DIR.rglob("patch_*.py"))


def test_every_patch_file_is_listed_and_documented():
    from vllm_mtad.patches import PATCH_MODULES
    from vllm_mtad.version import CHECKED_VLLM_VERSIONS

    listed = {f"{p.parent.name}.{p.stem}" for p in patch_files()}
    assert listed == set(PATCH_MODULES)
    for path in patch_files():
        doc = importlib.import_module(f"vllm_mtad.patches.{path.parent.name}.{path.stem}").__doc__
        assert doc, path
        for field in FIELDS:
            assert field in doc, f"{path.name} lacks {field}"
        checked = doc.split("Checked:")[1].splitlines()[0]
        assert any(v in checked for v in CHECKED_VLLM_VERSIONS), f"{path.name}: {checked}"


def test_register_is_idempotent_and_patches_can_be_undone():
    from vllm.config import VllmConfig
    from vllm.engine.arg_utils import EngineArgs

    from vllm_mtad import patching, plugin

    plugin.register()
    plugin.register()  # no "already patched" error
    assert patching.is_patched(EngineArgs, "create_speculative_config")
    with pytest.raises(RuntimeError, match="already patched"):
        patching.patch(EngineArgs, "create_speculative_config", lambda o: o, "test")
    wrapped = VllmConfig.__dict__["__post_init__"]
    original = patching.original(VllmConfig, "__post_init__")
    assert wrapped is not original and callable(original)
