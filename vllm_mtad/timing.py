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

Spans (MTAD's drafter only), *inclusive* and beside the phases (the phases inside a span are
charged as above): ``first_pass``, the draft's catch-up and first pass (vLLM's, one position);
``beam_steps``, the rest of a draft round (the first beam selection, steps 2..γ of B·W rows,
handing the drafts on). The policy times the same parts for its cost lines
(vllm_mtad.policy.clock), without a sync and only for the adaptive policy; these are the
benchmarks' (benchmarks.phases draft), with a sync on CUDA and for every policy.

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
SPANS = ("first_pass", "beam_steps")


class PhaseTimers:
    def __init__(self, enabled: bool | None = None):
        self._enabled = enabled
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.spans: dict[str, float] = defaultdict(float)  # inclusive seconds
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

    @contextmanager
    def span(self, name: str):
        """Add the block's seconds to ``spans[name]``, phases inside it included (and charged
        to their phases as usual)."""
        if not self.enabled:
            yield
            return
        start = self._now()
        try:
            yield
        finally:
            self.spans[name] += self._now() - start

    def snapshot(self) -> dict:
        return {"seconds": {p: self.seconds.get(p, 0.0) for p in PHASES},
                "calls": {p: self.calls.get(p, 0) for p in PHASES},
                "spans": {s: self.spans.get(s, 0.0) for s in SPANS}}

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()
        self.spans.clear()
        self._stack.clear()


# Module-level state: this process's phase counters; the wrapped vLLM methods and forward
# hooks charge them, and LLM.collective_rpc(worker_rpc.phase_times) reads them per process.
TIMERS = PhaseTimers()


def phase(name: str):
    """``with phase("draft_vocab"): ...``: charge the block to a phase (no-op when disabled)."""
    return TIMERS.phase(name)


def span(name: str):
    """``with span("beam_steps"): ...``: add the block's seconds to a span (no-op when
    disabled)."""
    return TIMERS.span(name)
