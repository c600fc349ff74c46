"""Timing the step's parts for the cost lines, without a host sync.

On CPU, ``time.perf_counter``; on CUDA, events recorded on the stream and read once they have
completed (a step later). Parts: *verify* (from the runner's input preparation to the drafter:
the target's forward and the sampler) by tokens scheduled, *first pass* (the draft's catch-up
and first pass) by tokens read, *beam step* (one draft step of B·W rows) by rows, and the
*rest* (bookkeeping, scheduling) by requests.
"""

from __future__ import annotations

import contextlib
import time

import torch

from vllm_mtad.policy.cost import CostModel, LinearCost


class StepClock:
    """Time marks that cost no host sync: floats on CPU, CUDA events on a GPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start, end) -> float | None:
        """Seconds between two marks, or None while a CUDA event has not completed."""
        if not self.cuda:
            return end - start
        if not (start.query() and end.query()):
            return None
        return start.elapsed_time(end) / 1e3


class StepTimings:
    """Samples of the parts' seconds, fitted into ``costs`` once they can be read
    (:meth:`resolve`); inert when ``enabled`` is False (the fixed policy)."""

    def __init__(self, costs: CostModel, device: torch.device, enabled: bool):
        self.costs = costs
        self.clock = StepClock(device)
        self.enabled = enabled
        # (cost line, size, start mark, end mark, parts, a step verifying no drafts)
        self._pending: list = []
        self._ratios: list = []  # (Ratio, predicted seconds, start mark, end mark)

    def mark(self):
        return self.clock.mark() if self.enabled else None

    def add(self, model: LinearCost, size, start, end=None, count: int = 1,
            no_draft: bool = False) -> None:
        """One sample of ``model`` at ``size`` (a number, or a tuple for a line of several
        sizes; ``count`` equal parts between the marks). ``no_draft``: a verification of decode
        tokens only, also a sample of CostModel.no_draft at its size, against the verify
        line's price before it is added."""
        if start is None:  # not timing
            return
        end = end if end is not None else self.clock.mark()
        self._pending.append((model, size, start, end, count, no_draft))

    def add_ratio(self, ratio, predicted: float, start, end) -> None:
        """One sample of ``ratio`` (a cost.Ratio): the seconds between the marks over
        ``predicted``."""
        if start is not None and end is not None:
            self._ratios.append((ratio, predicted, start, end))

    @contextlib.contextmanager
    def stopwatch(self):
        """A :class:`Stopwatch` started now; its laps become samples when the block ends."""
        watch = Stopwatch(self)
        yield watch
        for lap in watch.laps:
            self.add(*lap)

    def resolve(self) -> None:
        """Fit the samples whose marks can be read."""
        keep, costs = [], self.costs
        for item in self._pending:
            model, size, start, end, count, no_draft = item
            seconds = self.clock.seconds(start, end)
            if seconds is None:
                keep.append(item)
                continue
            seconds /= count
            if model is costs.rest and model.samples >= 8 and (
                    seconds > 5 * model.predict(size) + 1e-3):  # the engine idled in between
                continue  # (#rest-samples-engine-idled)
            if no_draft and model.samples >= 8:
                costs.no_draft_ratio(size[0]).add(seconds, model.predict(size))
            model.add(size, model.clip(size, seconds))
        self._pending = keep
        waiting = []
        for item in self._ratios:
            ratio, predicted, start, end = item
            seconds = self.clock.seconds(start, end)
            if seconds is None:
                waiting.append(item)
            else:
                ratio.add(seconds, predicted)
        self._ratios = waiting


class Stopwatch:
    """Consecutive parts of one drafting step: each :meth:`lap` closes a part that began
    where the previous one ended."""

    def __init__(self, timings: StepTimings):
        self._timings = timings
        self._last = timings.mark()
        self.laps: list = []
        self._discarded = False

    def lap(self, model: LinearCost, size, count: int = 1) -> None:
        end = self._timings.mark()
        if end is not None and not self._discarded:
            self.laps.append((model, size, self._last, end, count))
        self._last = end

    def discard(self) -> None:
        """This step's laps are not representative (e.g. a round drafted twice): none."""
        self.laps.clear()
        self._discarded = True
