"""The one way the demo, the benchmarks, the fetcher's check and the tests build a vLLM engine
and read its speculative-decoding counters.

Every engine is vLLM's own ``LLM`` with the settings this project always sets on CPU (eager mode,
an explicit KV cache size — without one vLLM's CPU worker takes a share of the machine's RAM —,
block size 32 (vLLM's CPU attention kernels take multiples of 32), a fixed seed); callers pass
what differs.
"""

from __future__ import annotations

import ctypes
import gc
from typing import Any

# vLLM's spec-decode counters (vllm/v1/metrics), by the short names this project reports.
_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "per_pos",
}


def mtad_spec(draft, gamma: int = 4, width: int = 4, tau: float = 0.5,
              greedy_acceptance: str | None = None, **extra) -> dict:
    """An MTAD ``speculative_config`` (the keys a user writes). W and γ as given, every step
    (``speculation_policy: "fixed"``, which tests compare with the reference) unless ``extra``
    sets the policy."""
    spec = {"method": "mtad", "model": str(draft), "num_speculative_tokens": gamma,
            "beam_width": width, "acceptance_threshold": tau, "speculation_policy": "fixed"}
    if greedy_acceptance is not None:
        spec["greedy_acceptance"] = greedy_acceptance
    return spec | extra


def draft_model_spec(draft, gamma: int = 4, **extra) -> dict:
    """vLLM's own speculative decoding with the same draft (probabilistic draft tokens, standard
    rejection sampling): the baseline MTAD is compared with."""
    return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": gamma,
            "draft_sample_method": "probabilistic"} | extra


# The CPU features that decide the speed of vLLM's CPU kernels (bf16 matmuls, attention).
CPU_FLAGS_OF_INTEREST = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
                         "avx512_vnni", "avx512_fp16", "amx_bf16", "amx_int8", "amx_tile")


def cpu_model_and_flags() -> dict:
    """{"cpu_model", "cpu_flags"} from /proc/cpuinfo (Linux); empty elsewhere."""
    try:
        with open("/proc/cpuinfo") as fh:
            info = fh.read()
    except OSError:
        return {}
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                  if line.startswith("model name")), "unknown")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines()
                  if line.startswith("flags")), [])
    return {"cpu_model": model, "cpu_flags": [f for f in CPU_FLAGS_OF_INTEREST if f in flags]}


def default_dtype(cpu_flags: list[str] | None = None) -> str:
    """The real pair's dtype on this CPU: bfloat16 where the CPU multiplies it natively (AVX-512
    BF16 or AMX), float32 elsewhere. On an AMD EPYC with AVX2 only, the real target alone ran
    5.5 tok/s at batch 16 in bfloat16 and 22.3 in float32 (4.4 and 3.0 at batch 1)."""
    if cpu_flags is None:
        cpu_flags = cpu_model_and_flags().get("cpu_flags", [])
    return "bfloat16" if {"avx512_bf16", "amx_bf16"} & set(cpu_flags) else "float32"


def engine_kwargs(target, speculative_config: dict | None = None, *, kv_cache_bytes: int,
                  dtype: str = "float32", max_model_len: int = 1024, max_num_seqs: int = 8,
                  block_size: int | None = 32, enforce_eager: bool = True, seed: int = 0,
                  **kwargs) -> dict:
    """The ``vllm.LLM`` arguments for ``target`` (a local model directory) with
    ``speculative_config`` (None: the target alone); ``block_size=None`` leaves vLLM's default.
    ``kwargs`` go to ``LLM`` as they are (``disable_log_stats=False`` for :func:`spec_counters`,
    ``tensor_parallel_size``, ``enable_prefix_caching``, ...). Also what Ray actors get
    (vllm_mtad.ray_batch)."""
    return dict(model=str(target), speculative_config=speculative_config, dtype=dtype,
                max_model_len=max_model_len, max_num_seqs=max_num_seqs, block_size=block_size,
                enforce_eager=enforce_eager, seed=seed, kv_cache_memory_bytes=kv_cache_bytes,
                **kwargs)


def build_llm(target, speculative_config: dict | None = None, **kwargs):
    """``vllm.LLM(**engine_kwargs(target, speculative_config, **kwargs))``."""
    from vllm import LLM

    return LLM(**engine_kwargs(target, speculative_config, **kwargs))


def close(llm) -> None:
    """Shut ``llm``'s engine down now (vLLM's engine core keeps the objects it allocated at
    start-up frozen, ``gc.freeze()``, until its shutdown). No MTAD object refers back to the
    runner (drafter and sampler share a request state instead), so MTAD adds no reference
    cycle; vLLM's own engine objects do form cycles (a plain vLLM runner outlives its last
    reference too), which Python's automatic collection frees, so no ``gc.collect()`` here.
    The caller's name still refers to the (shut down) ``LLM``: drop it too."""
    llm.llm_engine.engine_core.shutdown()


def release_memory() -> None:
    """Hand what closed engines held back to the system before building the next ones: collect
    their reference cycles (their weights stay allocated until then), then return the C heap's
    free pages (glibc's ``malloc_trim``; it keeps them otherwise, per arena). Measured on the real
    pair: a closed MTAD engine left 2.9 GB resident after ``gc.collect()``, 1.1 GB after the trim.
    Not enough for many sets of engines in one process: with it, a grid that built three engines
    a repeat still grew ~1 GB a set (9f5d103), so ``benchmarks.speed --instances repeat`` builds
    a repeat's engines in a process of their own instead. No-op trim where the C library has none (not glibc)."""
    gc.collect()
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except AttributeError:
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)


def spec_counters(llm) -> dict[str, Any]:
    """vLLM's spec-decode counters since the engine started: ``drafts``, ``draft_tokens``,
    ``accepted`` and ``per_pos`` (accepted tokens by draft position). The engine must have been
    built with ``disable_log_stats=False`` (vLLM keeps no metrics otherwise)."""
    out: dict[str, Any] = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": []}
    for metric in llm.get_metrics():
        key = _COUNTERS.get(metric.name)
        if key == "per_pos":
            out[key] = list(metric.values)
        elif key is not None:
            out[key] = metric.value
    return out


def counters_delta(after: dict, before: dict) -> dict:
    """What happened between two :func:`spec_counters` readings."""
    per_pos = [a - (before["per_pos"][i] if i < len(before["per_pos"]) else 0)
               for i, a in enumerate(after["per_pos"])]
    return {k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted")} | {
        "per_pos": per_pos}


def mean_acceptance_length(counters: dict) -> float | None:
    """Tokens per target pass as vLLM reports it: 1 + accepted / drafts (None without drafts)."""
    return 1 + counters["accepted"] / counters["drafts"] if counters["drafts"] else None


def metric_sum(llm, name: str) -> float:
    """The sum of one of vLLM's scalar metrics (``vllm:num_preemptions``,
    ``vllm:num_requests_running``, ...) over its labels."""
    return sum(m.value for m in llm.get_metrics() if m.name == name)
