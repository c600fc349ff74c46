"""Timing device work: calls clocked between synchronisations, and CUDA graph capture (plain
PyTorch, no vLLM: benchmarks.kernels core and forwards run on a GPU without it)."""

from __future__ import annotations

import time


def clock(call, device, calls: int) -> float:
    """Seconds per call, ``calls`` back to back, synchronised before and after."""
    import torch

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    sync()
    return (time.perf_counter() - t0) / calls


def capture(fn, warmups: int = 3):
    """(graph, its output) for ``fn`` after ``warmups`` calls on a side stream (compilation,
    the allocator), as torch.cuda.graphs asks."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out
