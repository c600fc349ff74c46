"""Every patch file is documented and listed, and patching is idempotent and reversible."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

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
        # Every checked vLLM version is named, with how it was checked (run, or sources only).
        checked = doc.split("Checked:")[1].split("Removal:")[0]
        missing = [v for v in CHECKED_VLLM_VERSIONS if v not in checked]
        assert not missing, f"{path.name}'s Checked: lacks {missing}: {checked}"


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
    # Undo one file's patches: vLLM's own attributes come back; applying the file again
    # wraps them again.
    from vllm_mtad.patches.engine import patch_config_vllm

    attrs = ("__post_init__", "_get_v2_model_runner_unsupported_features")
    originals = {a: patching.original(VllmConfig, a) for a in attrs}
    for attr in attrs:
        patching.undo(VllmConfig, attr)
    assert all(VllmConfig.__dict__[a] is originals[a] for a in attrs)
    assert not any(patching.is_patched(VllmConfig, a) for a in attrs)
    patch_config_vllm.apply()
    assert all(patching.is_patched(VllmConfig, a) for a in attrs)
    assert VllmConfig.__dict__["__post_init__"] is not original


def test_plugin_load_applies_the_front_end_groups_only(tmp_path):
    """What register() does in a process that never builds a worker (the API server; the
    engine core when workers run in their own processes): the platform and engine patches and
    the worker hook; the model runner, the MTAD glue, the reference and the developer tools are
    not even imported."""
    import json
    import subprocess
    import sys

    code = """
import json, sys
from vllm_mtad import patching, plugin
plugin.register()
from vllm.v1.worker.worker_base import WorkerBase
from vllm_mtad.patches import applied_groups
print(json.dumps({"groups": sorted(applied_groups()),
                  "hook": patching.is_patched(WorkerBase, "__init__"),
                  "modules": sorted(m for m in sys.modules
                                    if m.split(".")[0] in ("vllm_mtad", "devtools", "benchmarks")
                                    or m.startswith("vllm.v1.worker.gpu_model_runner"))}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=300).stdout
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["groups"] == ["plugin-load"] and seen["hook"]
    allowed = {"vllm_mtad", "vllm_mtad.config", "vllm_mtad.version", "vllm_mtad.log",
               "vllm_mtad.metrics",
               "vllm_mtad.plugin", "vllm_mtad.patching", "vllm_mtad.patches",
               "vllm_mtad.patches.platform", "vllm_mtad.patches.engine"}
    unexpected = [m for m in seen["modules"]
                  if m not in allowed and not m.startswith(("vllm_mtad.patches.platform.",
                                                            "vllm_mtad.patches.engine."))]
    assert not unexpected, unexpected


def test_opt_in_topk_topp_selection_masks_what_vllms_sort_masks(monkeypatch):
    """patches/worker/patch_topk_topp_sampler.py's wrapper against vLLM's own PyTorch
    top-k/top-p, on random float32 rows: off, it is vLLM's function; on, the same masked
    logits (kept set and kept values) by a k-selection, and vLLM's own function where a row has
    no top-k (counted as a fallback) or only top-k is asked (vLLM's own selection)."""
    import torch
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    from vllm_mtad.patches.worker import patch_topk_topp_sampler as sel

    def vllm(logits, k, p):
        return apply_top_k_top_p_pytorch(logits.clone(), k, p, allow_cpu_sync=True)

    wrapped = sel.selecting(vllm)
    gen = torch.Generator().manual_seed(0)
    R, V = 64, 4096
    logits = torch.randn(R, V, generator=gen) * 3
    k = torch.randint(1, 60, (R,), generator=gen)
    p = torch.rand(R, generator=gen) * 0.6 + 0.4
    p[::7] = 1.0  # top-p off in some rows
    monkeypatch.setenv("VLLM_MTAD_CPU_TOPK_SELECT", "0")
    before = dict(sel.COUNTS)
    assert torch.equal(wrapped(logits.clone(), k, p), vllm(logits, k, p))
    assert sel.COUNTS == before  # off: vLLM's own call, nothing counted
    monkeypatch.setenv("VLLM_MTAD_CPU_TOPK_SELECT", "1")
    got, want = wrapped(logits.clone(), k, p), vllm(logits, k, p)
    assert torch.equal(torch.isinf(got), torch.isinf(want))  # the same kept set...
    assert torch.equal(got[~torch.isinf(got)], want[~torch.isinf(want)])  # ...and values
    assert sel.COUNTS["selected"] == before["selected"] + 1
    # A row without top-k (k = V, as vLLM marks it): vLLM's sort, counted as a fallback.
    k_none = k.clone()
    k_none[3] = V
    assert torch.equal(wrapped(logits.clone(), k_none, p), vllm(logits, k_none, p))
    assert sel.COUNTS["fallbacks"] == before["fallbacks"] + 1
    # Top-k only: vLLM's own (sort-free) path, not counted.
    assert torch.equal(wrapped(logits.clone(), k, None), vllm(logits, k, None))
    assert sel.COUNTS["selected"] == before["selected"] + 1
