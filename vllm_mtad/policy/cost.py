"""What a step costs: linear cost lines fitted online from the engine's own step timings.

No vLLM, no torch: host-side numbers, so that pricing every arm costs microseconds. Why each
rule: docs/policy-decisions.md (anchors named below).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, NamedTuple

if TYPE_CHECKING:
    from vllm_mtad.policy.batch import Batch


@dataclass
class LinearCost:
    """seconds ≈ intercept + Σ_j slope_j · size_j, by weighted least squares with exponential
    forgetting (each new sample multiplies the old weights by ``decay``).

    ``dims``: sizes per sample, 1 (draft rows) or 2 for forwards whose input mixes decode
    tokens and prefill tokens, which need not cost the same a token
    (#linear-cost-decode-prefill). A scalar size is (size, 0, ...). A slope whose size barely
    varies is shrunk towards 0 (``ridge``, relative to the squared mean size): unmeasured reads
    as free. Intercept and slopes stay >= 0."""

    decay: float = 0.98
    ridge: float = 1e-3
    dims: int = 1
    _w: float = 0.0
    _y: float = 0.0
    _x: list = field(default_factory=list)
    _xx: list = field(default_factory=list)
    _xy: list = field(default_factory=list)
    samples: int = 0
    # Largest size seen per dimension: within it a prediction interpolates (see clip()).
    _seen: list = field(default_factory=list)
    # coefficients() until the next add(): a decision prices every arm with the same lines
    # (#cached-coefficients).
    _coef: tuple | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        d = self.dims
        self._x = self._x or [0.0] * d
        self._xy = self._xy or [0.0] * d
        self._xx = self._xx or [[0.0] * d for _ in range(d)]
        self._seen = self._seen or [0.0] * d

    def _vec(self, size) -> list:
        x = [float(v) for v in size] if isinstance(size, (tuple, list)) else [float(size)]
        if len(x) > self.dims:
            raise ValueError(f"{len(x)} sizes for a {self.dims}-size cost line")
        return x + [0.0] * (self.dims - len(x))

    def add(self, size, seconds: float) -> None:
        x, d = self._vec(size), self.decay
        self._w = d * self._w + 1.0
        self._y = d * self._y + seconds
        for i in range(self.dims):
            self._x[i] = d * self._x[i] + x[i]
            self._xy[i] = d * self._xy[i] + x[i] * seconds
            for j in range(self.dims):
                self._xx[i][j] = d * self._xx[i][j] + x[i] * x[j]
            self._seen[i] = max(self._seen[i], x[i])
        self.samples += 1
        self._coef = None

    def coefficients(self) -> tuple:
        """(intercept, slope_1, ..., slope_dims); zeros before any sample."""
        if self._coef is None:
            self._coef = self._fit()
        return self._coef

    def _fit(self) -> tuple:
        n = self.dims
        if self._w == 0.0:
            return (0.0,) * (n + 1)
        w = self._w
        mx = [v / w for v in self._x]
        my = self._y / w
        cov = [[self._xx[i][j] / w - mx[i] * mx[j] for j in range(n)] for i in range(n)]
        cxy = [self._xy[i] / w - mx[i] * my for i in range(n)]
        ridge = [self.ridge * max(m * m, 1.0) for m in mx]
        slopes = _nonnegative_solve(cov, cxy, ridge)
        intercept = my - sum(s * m for s, m in zip(slopes, mx))
        if intercept < 0.0:  # through the origin instead: never below zero at size 0
            raw = [[v / w for v in row] for row in self._xx]
            slopes = _nonnegative_solve(raw, [v / w for v in self._xy], ridge)
            intercept = 0.0
        return (intercept, *slopes)

    def predict(self, size) -> float:
        a, *slopes = self.coefficients()
        return a + sum(s * x for s, x in zip(slopes, self._vec(size)))

    def clip(self, size, seconds: float, factor: float = 2.0) -> float:
        """``seconds``, at most ``factor`` x the prediction once the line is known at ``size``
        (8 samples, no size beyond those seen): one stalled step moves the line a little, a
        lasting change still moves it (#cost-clip-stalled-steps)."""
        if self.samples < 8 or any(x > s for x, s in zip(self._vec(size), self._seen)):
            return seconds
        return min(seconds, factor * self.predict(size) + 1e-3)


def _nonnegative_solve(a: list, b: list, ridge: list) -> list:
    """x >= 0 minimising the ridge-regularised least squares with normal equations
    (a + diag(ridge)) x = b: solved again without the coordinates that came out negative
    (held at 0) until none does (enough for the one or two sizes here)."""
    free = list(range(len(b)))
    x = [0.0] * len(b)
    while free:
        sub = [[a[i][j] + (ridge[i] if i == j else 0.0) for j in free] for i in free]
        sol = _solve(sub, [b[i] for i in free])
        if all(v >= 0.0 for v in sol):
            for i, v in zip(free, sol):
                x[i] = v
            return x
        free = [i for i, v in zip(free, sol) if v >= 0.0] if any(v >= 0 for v in sol) else []
    return x


def _solve(a: list, b: list) -> list:
    """Gaussian elimination with partial pivoting (tiny, well-conditioned systems)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        pivot = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[pivot] = m[pivot], m[c]
        if abs(m[c][c]) < 1e-300:
            return [0.0] * n
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                m[r] = [u - f * v for u, v in zip(m[r], m[c])]
    return [m[i][n] / m[i][i] for i in range(n)]


@dataclass
class Ratio:
    """measured / predicted seconds of one kind of step, as an exponential moving average
    (``weight`` on each new sample, each clipped to [1/``clip``, ``clip``]); 1 before any
    sample."""

    weight: float = 0.3
    clip: float = 2.0
    value: float = 1.0
    samples: int = 0

    def add(self, measured: float, predicted: float) -> None:
        if predicted <= 0.0:
            return
        r = min(max(measured / predicted, 1.0 / self.clip), self.clip)
        self.value = r if self.samples == 0 else (1 - self.weight) * self.value + self.weight * r
        self.samples += 1


@dataclass
class CostModel:
    """The step parts the arms differ in (seconds): the target's verification and the draft's
    first pass by (decode tokens, prefill tokens), a beam step by draft rows (B·W), the rest
    (bookkeeping, scheduling) by rows. What one prefill token of the first pass costs is what
    the draft owes a token.

    ``no_draft``: per batch size B, measured / predicted seconds of steps that verify no
    drafts: such a step verifies B tokens, below every size drafting steps fit the verify line
    at, so its price is an extrapolation corrected per B (#no-draft-ratio-per-batch).
    ``arms``: per (B, W, γ), measured / predicted seconds of drafting steps of that arm, from
    one decision to the next: the lines are linear in γ, a step's time need not be, so an arm
    drafted is priced by what it took (#step-price-measured-per-arm)."""

    verify: LinearCost = field(default_factory=lambda: LinearCost(dims=2))
    first_pass: LinearCost = field(default_factory=lambda: LinearCost(dims=2))
    beam_step: LinearCost = field(default_factory=LinearCost)  # by draft rows (B·W)
    rest: LinearCost = field(default_factory=LinearCost)  # bookkeeping, scheduling: by rows
    no_draft: dict = field(default_factory=dict)  # B -> Ratio
    arms: dict = field(default_factory=dict)  # (B, W, γ) -> Ratio

    def arm_ratio(self, rows: int, width: int, num_tokens: int) -> Ratio:
        return self.arms.setdefault((int(rows), int(width), int(num_tokens)), Ratio())

    def no_draft_ratio(self, rows: int) -> Ratio:
        return self.no_draft.setdefault(int(rows), Ratio())

    def ready(self, min_samples: int, max_tokens: int) -> bool:
        parts = [self.verify, self.first_pass] + ([self.beam_step] if max_tokens > 1 else [])
        return min(p.samples for p in parts) >= min_samples

    def owed_time(self, batch: Batch) -> float:
        """Seconds the draft owes before it drafts, beyond the prompts' rate: the catch-up
        over what steps without drafting skipped (#skipped-prompts-are-a-debt)."""
        return self._read(batch, batch.catch_up_tokens - batch.catch_up_arrival_tokens)

    def reading_time(self, batch: Batch) -> float:
        """Seconds a drafting step spends reading before it drafts: the catch-up pass, prompt
        tokens included, and this step's prefill chunks (what an exploration step pays)."""
        return self._read(batch, batch.catch_up_tokens + batch.other_tokens)

    def _read(self, batch: Batch, tokens: float) -> float:
        """The draft reading ``tokens`` prefill-priced tokens, plus the catch-up pass's
        intercept where there is a catch-up (a forward of its own)."""
        intercept, _, per_token = self.first_pass.coefficients()
        return (intercept if batch.catch_up_tokens > 0 else 0.0) + per_token * tokens

    def prompt_time(self, batch: Batch, tokens: float) -> float:
        """Seconds of the draft's reading of prompts that ``tokens`` output tokens of a
        drafting step carry (Batch.prompt_per_token prefill tokens each;
        #prompts-are-a-rate)."""
        return self.first_pass.coefficients()[2] * batch.prompt_per_token * tokens

    def step_time(self, batch: Batch, width: int, num_tokens: int,
                  owed_share: float = 1.0) -> float:
        """Predicted seconds of the work in which the step (W, γ) = (width, num_tokens)
        differs from the others: the target's verification of the decode tokens (prefill
        chunks, verified alike by every arm, are left out) and, if it drafts, the draft's
        first pass and beam steps (corrected by the arm's ratio at this batch size, once it
        has been drafted) plus ``owed_share`` of :meth:`owed_time`; without a draft, the verify
        line's price corrected by ``no_draft`` at this batch size."""
        B = batch.size
        if num_tokens == 0:
            ratio = self.no_draft_ratio(B).value
            return step_price(StepPrices(lambda n: self.verify.predict(n) * ratio,
                                         self.first_pass.predict, self.beam_step.predict,
                                         self.rest.predict), B, width, 0)
        ratio = self.arms.get((B, width, num_tokens))
        t = self.line_time(batch, width, num_tokens) * (ratio.value if ratio else 1.0)
        return t + owed_share * self.owed_time(batch)

    def line_time(self, batch: Batch, width: int, num_tokens: int) -> float:
        """The drafting step (W, γ) priced by the lines alone (no per-arm ratio, nothing
        owed)."""
        first = batch.first_pass_tokens
        first = None if first is None else max(first - batch.other_tokens, batch.size)
        return step_price(StepPrices(self.verify.predict, self.first_pass.predict,
                                     self.beam_step.predict, self.rest.predict),
                          batch.size, width, num_tokens, first)


class StepPrices(NamedTuple):  # a tuple: built for every arm priced, so cheap to build
    """What each part of a step costs, by its size (seconds, or any one unit): the policy's
    fitted lines (CostModel) or parts timed elsewhere (benchmarks/lib/projection.py)."""

    verify: Callable[[float], float]  # the target's pass over n decode tokens
    first_pass: Callable[[float], float]  # the draft's first pass over n tokens
    beam_step: Callable[[float], float]  # one later draft step over n rows (B·W)
    rest: Callable[[float], float]  # the step's other work, by its requests B


def step_price(prices: StepPrices, batch_size: int, width: int, num_tokens: int,
               first_pass_tokens: float | None = None) -> float:
    """The step (W, γ) = (width, num_tokens) of B = ``batch_size`` requests, priced part by
    part: the rest of the step (by B) and the target's pass, over B tokens without a draft;
    with one, over B·(γ + 1) tokens, plus the draft's first pass (over
    ``first_pass_tokens``, by default B·(γ + 1): it reads what the last step accepted) and
    γ − 1 beam steps over B·W rows. The one definition the policy (CostModel.step_time) and
    the GPU projection price a step by."""
    B = batch_size
    t = prices.rest(B)
    if num_tokens == 0:
        return t + prices.verify(B)
    t += prices.verify(B * (1 + num_tokens))
    t += prices.first_pass(B * (1 + num_tokens) if first_pass_tokens is None
                           else first_pass_tokens)
    t += (num_tokens - 1) * prices.beam_step(B * width)
    return t
