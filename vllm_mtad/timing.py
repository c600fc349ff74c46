"""Per-phase wall-clock counters for benchmarks: where a speculative-decoding step spends its time.

Off by default (serving pays one attribute check per phase); on when ``VLLM_MTAD_PHASE_TIMERS=1``
is set in the engine's environment, as the benchmarks do. The counters are per process (read
them on a worker with ``LLM.collective_rpc(vllm_mtad.worker_rpc.phase_times)``) and
*exclusive*: a phase nested inside another (the draft model's forward inside drafting) is
charged to itself only, so the phases add up to the time spent inside any of them.

Phases (the same names for MTAD and vLLM's own speculative decoding):

- ``target_forward``: the target model's forward and its ``compute_logits`` (lm_head);
- ``draft_forward``: the draft model's forwards and ``compute_logits``, every pass;
- ``draft_vocab``: work on the draft logits after ``compute_logits``: MTAD's processing
  (temperature/top-k/top-p) and beam selection; vLLM's argmax or probabilistic draft sampling;
- ``beam_kv``: MTAD only: planning the beams' block tables, copy-on-write block copies and the
  beam rows' attention metadata;
- ``draft_other``: the rest of drafting (vLLM's input preparation for the draft passes);
- ``sampler``: the rejection sampler (MTAD's acceptance rule or vLLM's), bonus token included;
- ``step``: the runner's whole ``execute_model`` + ``sample_tokens`` (the denominator; its
  exclusive part is scheduling glue, input preparation and bookkeeping).

On CUDA the timers synchronise the device at every phase boundary, which costs time; they are
for benchmarks, not for serving. On CPU nothing runs asynchronously and the figures are exact.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

from vllm_mtad import envs

PHASES = ("target_forward", "draft_forward", "draft_vocab", "beam_kv", "draft_other", "sampler",
          "step")


class PhaseTimers:
    def __init__(self, enabled: bool | None = None):
        self._enabled = enabled
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._stack: list[list] = []  # [name, start, seconds spent in nested phases]
        self._sync = None

    @property
    def enabled(self) -> bool:
        if self._enabled is None:
            self._enabled = envs.phase_timers()
        return self._enabled

    def _now(self) -> float:
        if self._sync is None:
            import torch

            self._sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
        self._sync()
        return time.perf_counter()

    def push(self, name: str) -> None:
        if self.enabled:
            self._stack.append([name, self._now(), 0.0])

    def pop(self) -> None:
        if not self.enabled or not self._stack:
            return
        name, start, nested = self._stack.pop()
        elapsed = self._now() - start
        self.seconds[name] += elapsed - nested
        self.calls[name] += 1
        if self._stack:
            self._stack[-1][2] += elapsed

    @contextmanager
    def phase(self, name: str):
        self.push(name)
        try:
            yield
        finally:
            self.pop()

    def snapshot(self) -> dict:
        return {"seconds": {p: self.seconds.get(p, 0.0) for p in PHASES},
                "calls": {p: self.calls.get(p, 0) for p in PHASES}}

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()
        self._stack.clear()


# Module-level state: this process's phase counters; the wrapped vLLM methods and forward
# hooks charge them, and LLM.collective_rpc(worker_rpc.phase_times) reads them per process.
TIMERS = PhaseTimers()


def phase(name: str):
    """``with phase("draft_vocab"): ...``: charge the block to a phase (no-op when disabled)."""
    return TIMERS.phase(name)
