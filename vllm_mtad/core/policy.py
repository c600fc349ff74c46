"""Choosing MTAD's beam width W and draft length γ per step: expected goodput, measured online.

Goodput (SmartSpec, arXiv 2406.14066) is the expected number of tokens a step produces over
the expected time the step takes. For a batch of B requests drafting γ tokens with W beams:

    tokens(W, γ) = Σ_rows 1 + E[accepted | row's class, row's W, min(γ, row's tokens left − 1)]
    time(W, γ)   = verify(n_verify) + [γ > 0]·(first_pass(n_first) + (γ − 1)·beam_step(B·W)
                   + prompts · tokens(W, γ) + owed / steps left)
    n_verify     = B·(1 + γ)  (prefill chunks are verified alike by every arm: left out)
    n_first      = the step's decode tokens
    prompts      = the draft's reading of the prompts, per output token: a drafting engine
                   reads every prompt into the draft, and each output token drafted carries
                   its share (the rows' mean of prompt tokens / max_tokens, at the first
                   pass's price of a prefill token)
    owed         = the draft's reading of what it skipped in steps without drafting (a
                   catch-up pass: decode tokens, and the prompts of requests that arrived in
                   those steps), spread over the steps the requests have left, which that
                   reading buys drafting for

Why the prompts are a rate, not a debt paid when a prompt arrives: in a batch of B requests
each of S steps, a new request arrives every S/B steps, and drafting for the batch needs
every one of them read. Charged at each arrival against the whole batch's gain over the
arrival's own S steps, every step's gain was counted once for each of the B arrivals it
overlaps, and reading prompts was underpriced B-fold. (Measured on the real pair at T=0
"joint", batch 4, 12 requests of 48 tokens, policy-probe-cpu at 97a6346 (docs/results-history.md): the decode
steps with W=1, γ=4 drafts produced what the target's did per second, so the draft's reading
of the prompts, 2.7 s of the run, was the whole difference: the target alone 24.1 and 26.0
tok/s, drafting 21.0 and 20.6; the policy had priced those decode steps 17 % ahead.)

Why the prompts of requests that arrived in steps without drafting are a debt all the same:
the rate, summed over the steps the batch's rows have left, is the reading of the prompts
that arrive in those steps (their replacements); it does not cover the rows' own prompts,
which a drafting run read as they arrived and a run without drafting never read. Switching
to drafting pays them at once, in full. (Priced by the rate, a batch of 16 that had not
drafted for a while was priced 2 % faster drafting W=4, γ=1, and the step that switched read
1,613 tokens, 3.8 s of catch-up, 5 % of the run: real pair, T=1, batch 16 queued, trace in
policy-probe-cpu at 97a6346 (docs/results-history.md).) The prompt tokens of a request whose prompt is being
read in this very step (an arrival) are the rate's, in a catch-up (its prefix-cache hit
after steps without drafting) as in the prefill chunk.

``verify``, ``first_pass`` and ``beam_step`` are linear cost models (:class:`LinearCost`,
seconds as a function of tokens or rows; the target's and the first pass's with separate
slopes for decode and prefill tokens) fitted online from this engine's own step timings;
E[accepted] comes from acceptance counts kept per request class, W and draft length
(:class:`AcceptanceStats`): E[accepted | W, γ] = Σ_{i ≤ γ} P(accepted ≥ i | W, γ), estimated
from every verified draft of length ≥ γ (a longer draft's first γ tokens, with what MTAD's rule
accepts of them alone). γ = 0 means the step drafts nothing: no draft forward at
all (the request's draft KV catches up when it next drafts), and each request gets one token
sampled from the target.

Nothing here knows the machine: where beam rows are free (batch 1, a GPU at moderate batch)
the fitted beam-step slope is ~0 and W = beam_width wins on acceptance; where they cost (a
CPU at batch 16) the slope is measured and W = 1 or γ = 0 wins. Until the models have data the
policy drafts the configured (beam_width, num_speculative_tokens); afterwards one step in
``explore_period`` tries another arm (:func:`choose`), in turn one of a fixed cycle, which keeps
the cost lines measured at sizes the chosen arms never reach (the shortest draft, no draft),
and the arm that may be the best by an upper confidence bound on its acceptance, so that the
estimates of arms not chosen stay current.

Classes: "sampled" (temperature > 0), "joint" and "exact" (greedy, by acceptance mode). Exact
rows always draft with one beam (the draft's argmax chain: under exact acceptance the chain
that matches the target most often), whatever W the batch uses.

No vLLM import, no torch: host-side numbers only, so that a decision costs microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CLASSES = ("sampled", "joint", "exact")


@dataclass
class LinearCost:
    """seconds ≈ intercept + Σ_j slope_j · size_j, by weighted least squares with exponential
    forgetting (each new sample multiplies the old weights by ``decay``).

    ``dims`` sizes per sample: 1 (draft rows), or 2 for the forwards whose input mixes decode
    tokens (a few per request, each reading a long context) and prefill tokens (a prompt's
    chunk; also the draft's catch-up), which need not cost the same a token. On this
    project's 2-core CPU they do (~4 ms a token for the real pair's target, measured); on a
    GPU a small batch's decode tokens ride one memory-bound pass while a prompt's are
    compute-bound, and one line over both would price the decode arms by the prefill steps'
    slope. A scalar size is (size, 0, ...).

    With too little spread in a size the slope is not identified; it is then shrunk towards 0
    (``ridge``, relative to the squared mean size), so that an unmeasured slope reads as "size
    is free" until the sizes vary. Intercept and slopes are kept >= 0 (time does not fall with
    size)."""

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
    # (98 reads at batch 48; 1.1-1.2 ms a decision solving each time, 0.13-0.20 ms cached:
    # benchmarks/reports/policy-decision-cpu).
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
        """``seconds``, at most ``factor`` x the prediction once the line is known at
        ``size`` (8 samples, and no size beyond those seen): one stalled step (another
        process, a collection) then moves the line a little instead of doubling it (measured:
        two 5 s steps among 0.65 s ones raised the next predictions by a third), while a
        lasting change still moves it, sample by sample."""
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
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        if abs(m[c][c]) < 1e-300:
            return [0.0] * n
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                m[r] = [u - f * v for u, v in zip(m[r], m[c])]
    return [m[i][n] / m[i][i] for i in range(n)]


@dataclass
class AcceptanceStats:
    """Per beam width W and draft length g: how often a draft of g tokens had at least i of
    them accepted (i = 1..g), with exponential forgetting per recorded draft of that length
    (a longer draft's prefix counts as one), whatever its width: the counts of a width the
    policy stopped drafting age with the others' drafts, and its estimate returns to the prior
    (the widths' pooled figure) instead of keeping an old one for the engine's life. (Aging by
    the width's own drafts kept the figure of four beams measured on the first requests'
    openings, 2.78 of 4 tokens where whole requests give 3.58, through every later batch size:
    real pair, history-b4-then-b1 in docs/results-history.md.) Not by drafts of other
    lengths: a length's counts age only while drafts measure it anew, since its prior (the
    shorter length's estimate, times ``prior_rate`` at its last position) reads lower than a
    good draft does. (Aged by every draft, 200 four-token drafts at 0.85 a position, 2.70
    tokens expected, then 1,000 one-token drafts at 0.75: four tokens read 2.40, and the
    real-pair run of batch 4 then batch 1 drafted three tokens at batch 1 where fresh it
    drafts four: history-b4-then-b1/e8eccae.)

    Per length, because MTAD accepts the *largest* passing prefix: a longer draft can have its
    first g tokens accepted where a draft of g tokens would not (the joint ratio passes again
    after a failure), so "accepted >= i" pooled over drafts of any length overprices the short
    drafts, and the policy, choosing the arm priced best, chose them for it. Every verified
    draft also counts as a draft of each shorter length, with what the rule accepts of those
    tokens alone (the sampler's prefix_accepted; without it, min(accepted, g), which is exact
    under "exact" acceptance and an upper bound otherwise). For one beam that is a draft of
    that length (a sampled chain's first g tokens are drawn as a g-token chain); with beams it
    approximates one (the beam kept is chosen on all the draft's tokens).

    Estimates use a prior: the same (length, position) pooled over all widths, itself shrunk
    (``prior_weight`` pseudo-drafts each) towards the next shorter length's estimate at that
    position (at most what a longer draft gets accepted there), and at the new last position
    towards the shorter length's last one times ``prior_rate`` (on a fresh engine
    ``prior_rate ** i``): a width never tried reads as the others do, a length never drafted
    as the shorter ones, and a fresh engine as a moderately good draft."""

    beam_width: int
    max_tokens: int
    decay: float = 0.995
    prior_rate: float = 0.7
    prior_weight: float = 4.0
    # [W][g-1]: decayed counts of drafts of length g; [W][g-1][i-1]: of those, accepted >= i.
    drafted: list = field(default_factory=list)
    passed: list = field(default_factory=list)
    drafts: int = 0
    _rates: list | None = None  # [W][g-1][i-1] estimates, recomputed after a record

    def __post_init__(self) -> None:
        G = self.max_tokens
        self.drafted = [[0.0] * G for _ in range(self.beam_width)]
        self.passed = [[[0.0] * g for g in range(1, G + 1)] for _ in range(self.beam_width)]

    def record(self, width: int, num_drafted: int, num_accepted: int, count: int = 1) -> None:
        """``count`` drafts of ``num_drafted`` tokens by ``width`` beams, each with
        ``num_accepted`` accepted (their shorter prefixes: min(num_accepted, g))."""
        self.record_batch(width, [(num_drafted, num_accepted, count)])

    def record_batch(self, width: int, cells, prefix_cells=None) -> None:
        """Drafts by ``width`` beams verified in one window, as (drafted, accepted, count)
        cells, and ``prefix_cells``: the same drafts' shorter prefixes, as (length, accepted
        by the rule on those tokens alone, count), one per draft and length below its own
        (None: derived from ``cells`` as min(accepted, length)). Each length's older counts
        decay once by its new drafts' total, and every new draft weighs the same. (Recording
        the cells one after another would decay the first ones by the later ones' counts: a
        histogram read in order of acceptance, after many steps, then reads as far more
        optimistic than its mean; measured on the real pair, 3.74 accepted tokens expected
        where 173 drafts had 3.49.)"""
        self.record_window({width: (cells, prefix_cells)})

    def record_window(self, by_width: dict) -> None:
        """One window's drafts of every width, ``{width: (cells, prefix_cells)}`` as in
        :meth:`record_batch`: each length's older counts, of every width, decay once by the
        window's new drafts of that length (a longer draft's prefix counts as one), whatever
        their width (recorded width by width, a window's first width would age by the later
        ones' drafts)."""
        G = self.max_tokens
        entries = {}
        for width, (cells, prefix_cells) in by_width.items():
            cells = [(min(d, G), min(a, d, G), n) for d, a, n in cells if d > 0 and n > 0]
            if prefix_cells is None:
                prefix_cells = [(g, min(a, g), n) for d, a, n in cells for g in range(1, d)]
            e = cells + [(min(g, G), min(a, g, G), n) for g, a, n in prefix_cells
                         if 0 < g and n > 0]
            if e:
                w = min(max(width, 1), self.beam_width) - 1
                entries.setdefault(w, []).extend(e)
                self.drafts += sum(n for _, _, n in cells)
        if not entries:
            return
        new = [0] * G
        for e in entries.values():
            for g, _, n in e:
                new[g - 1] += n
        for g in range(1, G + 1):
            if new[g - 1]:
                keep = self.decay ** new[g - 1]
                for v in range(self.beam_width):  # every width ages (class docstring)
                    self.drafted[v][g - 1] *= keep
                    row = self.passed[v][g - 1]
                    for i in range(g):
                        row[i] *= keep
        for w, e in entries.items():
            for g, a, n in e:
                self.drafted[w][g - 1] += n
                row = self.passed[w][g - 1]
                for i in range(a):
                    row[i] += n
        self._rates = None

    def _estimates(self) -> list:
        """[W][g-1][i-1]: P(accepted >= i | a draft of g tokens by W beams), shrunk as the
        class docstring says; cached until the next record."""
        if self._rates is not None:
            return self._rates
        G, k, widths = self.max_tokens, self.prior_weight, range(self.beam_width)
        rates = [[None] * G for _ in widths]
        shorter = []  # the pooled estimates of length g - 1
        for g in range(1, G + 1):
            base = shorter + [(shorter[-1] if shorter else 1.0) * self.prior_rate]
            n = sum(self.drafted[w][g - 1] for w in widths)
            pooled = [(sum(self.passed[w][g - 1][i] for w in widths) + k * base[i]) / (n + k)
                      for i in range(g)]
            for w in widths:
                rates[w][g - 1] = [(self.passed[w][g - 1][i] + k * pooled[i])
                                   / (self.drafted[w][g - 1] + k) for i in range(g)]
            shorter = pooled
        self._rates = rates
        return rates

    def expected_accepted(self, width: int, num_tokens: int, confidence: float = 0.0) -> float:
        """E[accepted tokens] of a draft of ``num_tokens`` by ``width`` beams; with
        ``confidence`` c != 0, c standard errors below it (c > 0: a pessimistic estimate; c < 0:
        an optimistic one, above it; each position's rate counts the drafts of this length and
        the prior's weight, and the positions' errors add as if independent), within
        [0, num_tokens]."""
        g = min(num_tokens, self.max_tokens)
        if g <= 0:
            return 0.0
        w = min(max(width, 1), self.beam_width) - 1
        rates = self._estimates()[w][g - 1]
        n = self.drafted[w][g - 1] + self.prior_weight
        total, envelope, variance = 0.0, 1.0, 0.0
        for r in rates:
            # P(accepted >= i) cannot grow with i: a prefix-monotone envelope of the estimates.
            envelope = min(envelope, r)
            total += envelope
            variance += r * (1.0 - r) / n
        if not confidence:
            return total
        return min(float(g), max(0.0, total - confidence * variance ** 0.5))


@dataclass(frozen=True)
class Bounds:
    """What the policy may choose: W in [min_beam_width, beam_width], γ in
    [min_tokens, max_tokens] (min_tokens >= 1 forbids steps without a draft)."""

    beam_width: int
    max_tokens: int
    min_beam_width: int = 1
    min_tokens: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.min_beam_width <= self.beam_width:
            raise ValueError(f"min_beam_width must be in [1, {self.beam_width}], "
                             f"got {self.min_beam_width}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, {self.max_tokens}], "
                             f"got {self.min_tokens}")


@dataclass(frozen=True)
class Batch:
    """The batch a step drafts for: rows per class, scheduled tokens that are not decode
    tokens (prefill chunks), which every arm verifies alike, and what drafting would make the
    draft read this step.

    ``first_pass_tokens``: the tokens the draft's first pass reads if this step drafts (it
    reads the target's whole input of the step: a prefill chunk in full); None (synthetic
    batches) stands for a decode step verifying the arm's own γ: B·(1 + γ).
    ``catch_up_tokens``: tokens the draft skipped in earlier steps without drafting, which it
    must read before it drafts (DraftKVTracker), in a pass of its own; of them,
    ``catch_up_arrival_tokens`` are prompt tokens of requests whose prompt this step reads
    (arrivals: priced by the prompts' rate, see the module docstring). The rest buy
    drafting for the rest of the requests, so a drafting arm is charged their cost spread
    over the steps the requests have left (``remaining_tokens``: their mean output tokens
    still to generate).
    ``prompt_per_token``: the rows' mean of (prompt tokens the draft reads) / (output tokens
    the request may generate): a drafting arm pays that many prefill tokens of the draft per
    output token (see the module docstring). The prompt tokens of a prefill chunk, and an
    arrival's in a catch-up, are priced by it, not as a debt.
    ``short``: rows about to finish, ((class, tokens left), count) pairs: a row with L tokens
    left gains at most L − 1 from a draft (its max_tokens cuts the rest), so its expected
    tokens count drafts of at most L − 1."""

    rows: dict  # class name -> number of rows
    other_tokens: int = 0
    first_pass_tokens: float | None = None
    catch_up_tokens: float = 0.0
    remaining_tokens: float = 1.0
    short: tuple = ()
    catch_up_arrival_tokens: float = 0.0
    prompt_per_token: float = 0.0

    @property
    def size(self) -> int:
        return sum(self.rows.values())

    @classmethod
    def from_step(cls, classes: list[str], scheduled_tokens: int, verified_drafts: int,
                  catch_up_tokens: float = 0.0, remaining_tokens: float = 1.0,
                  tokens_left: list | None = None, horizon: int = 0,
                  prompt_tokens: list | None = None, max_tokens: list | None = None,
                  catch_up_arrival_tokens: float = 0.0) -> "Batch":
        """The batch of a step whose target input held ``scheduled_tokens`` tokens, of which
        ``verified_drafts`` were the previous round's drafts: the rest beyond one token per
        row are prefill chunks, which the next step's arms all verify alike. (The drafts being
        verified now are not: the next step verifies the drafts this plan makes.) The draft's
        first pass, if this step drafts, reads all ``scheduled_tokens``. ``tokens_left``
        (per row, as ``classes``): output tokens each request may still generate; their mean
        replaces ``remaining_tokens``, and rows with at most ``horizon`` (the longest draft)
        left are ``short``. ``prompt_tokens`` and ``max_tokens`` (per row): the prompt tokens
        the draft reads of each request and the output tokens it may generate in all, whose
        ratio gives ``prompt_per_token``."""
        rows = {}
        for c in classes:
            rows[c] = rows.get(c, 0) + 1
        short = {}
        if tokens_left:
            remaining_tokens = sum(tokens_left) / len(tokens_left)
            for c, left in zip(classes, tokens_left):
                if left <= horizon:
                    short[(c, int(left))] = short.get((c, int(left)), 0) + 1
        other = prefill_tokens(len(classes), scheduled_tokens, verified_drafts)
        per_token = 0.0
        if prompt_tokens and max_tokens:
            per_token = sum(p / max(m, 1) for p, m in zip(prompt_tokens, max_tokens)) / len(
                prompt_tokens)
        return cls(rows, other_tokens=other, first_pass_tokens=scheduled_tokens,
                   catch_up_tokens=catch_up_tokens, remaining_tokens=remaining_tokens,
                   short=tuple(sorted(short.items())),
                   catch_up_arrival_tokens=min(catch_up_arrival_tokens, catch_up_tokens),
                   prompt_per_token=per_token)


def prefill_tokens(rows: int, scheduled_tokens: int, verified_drafts: int) -> int:
    """Tokens of a step's target input that are prefill chunks: beyond one token a row and
    the drafts it verifies."""
    return max(0, scheduled_tokens - rows - verified_drafts)


@dataclass(frozen=True)
class Plan:
    beam_width: int
    num_tokens: int
    explore: bool = False
    goodput: float | None = None  # predicted tokens per second; None before the models have data
    # Predicted seconds of the step (the chosen arm's, its reading included) and, for an
    # exploration step, what it costs against the best arm (exploration_cost); 0 otherwise.
    seconds: float = 0.0
    cost: float = 0.0


# Exploration spends at most this share of the time (ExplorationBudget).
EXPLORE_SHARE = 0.02


@dataclass
class ExplorationBudget:
    """Seconds an exploration step may cost against the best arm (:func:`exploration_cost`):
    each step adds ``share`` of its predicted time, an exploration pays its cost, and the
    balance decays by ``1 / horizon`` a step (a long run of cheap explorations does not buy a
    burst of dear ones later). So exploration costs at most ``share`` of the time, whatever
    the arms cost on this machine, by the policy's own prices: where the best arm drafts,
    trying another arm costs little and the policy explores one step in ``explore_period`` as
    before; where drafting loses (a CPU at batch 16), an exploration step pays a drafting step
    and the draft's reading of everything the steps without drafting skipped (prompts of the
    requests that arrived meanwhile included), and such steps become rarer. A bound, not a
    measured fix: on the simulated engine (benchmarks/policy_sim.py) it changed no scenario
    by more than 0.7 %, and on the real pair it has not been measured apart."""

    share: float = EXPLORE_SHARE
    horizon: float = 512.0
    seconds: float = 0.0

    def after(self, plan: Plan) -> None:
        self.seconds = self.seconds * (1.0 - 1.0 / self.horizon) + self.share * plan.seconds
        if plan.explore:
            self.seconds = max(0.0, self.seconds - plan.cost)


@dataclass
class Ratio:
    """measured / predicted seconds of one kind of step, as an exponential moving average
    (``weight`` on each new sample, each clipped to [1/``clip``, ``clip``] so that one stalled
    step moves it a little); 1 before any sample."""

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
    """The step components the arms differ in (seconds). The target's verification and the
    draft's first pass are priced by (decode tokens, prefill tokens): what one prefill token
    costs is what the draft owes a token.

    ``no_draft``: per batch size B, what steps verifying no drafts (B decode tokens)
    measured against the verify line's price for them when they were measured. Drafting
    steps fit the line at B·(1 + γ) tokens; a step without a draft verifies B, below every
    size a drafting run measures, so its price is an extrapolation, and at batch 4 on the real
    pair the arms were within a tenth of each other. Per B, because the line's error depends
    on the size: on the real pair the line fitted at batch 1 was 0.132 s flat from one to five
    tokens, the one fitted at batch 4 0.077 s + 7.5 ms a token (0.084 s at one token), and
    one ratio for every size (six samples from a run at batch 1 and 4, 1.25 then 1.40)
    priced every step without a draft at 1.4x its line, at batch 4 too. Exploration steps
    without a draft (see :func:`choose`) measure it while the policy drafts."""

    verify: LinearCost = field(default_factory=lambda: LinearCost(dims=2))
    first_pass: LinearCost = field(default_factory=lambda: LinearCost(dims=2))
    beam_step: LinearCost = field(default_factory=LinearCost)  # by draft rows (B·W)
    rest: LinearCost = field(default_factory=LinearCost)  # bookkeeping, scheduling: by rows
    no_draft: dict = field(default_factory=dict)  # B -> Ratio

    def no_draft_ratio(self, rows: int) -> Ratio:
        return self.no_draft.setdefault(int(rows), Ratio())

    def ready(self, min_samples: int, max_tokens: int) -> bool:
        parts = [self.verify, self.first_pass] + ([self.beam_step] if max_tokens > 1 else [])
        return min(p.samples for p in parts) >= min_samples

    def owed_time(self, batch: Batch) -> float:
        """Seconds the draft owes before it drafts, beyond the prompts' rate
        (:meth:`prompt_time`): the catch-up pass over what steps without drafting skipped
        (decode tokens, and the prompts of requests that arrived in them)."""
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
        drafting step carry (Batch.prompt_per_token prefill tokens each)."""
        return self.first_pass.coefficients()[2] * batch.prompt_per_token * tokens

    def step_time(self, batch: Batch, width: int, num_tokens: int,
                  owed_share: float = 1.0) -> float:
        """Predicted seconds of the work in which the step with (W, γ) = (width, num_tokens)
        differs from the others: the target's verification of the decode tokens (prefill
        chunks, verified alike by every arm, are left out) and, if it drafts, the draft's
        first pass and beam steps plus ``owed_share`` of :meth:`owed_time`; without a draft,
        the verify line's price corrected by ``no_draft`` at this batch size."""
        B = batch.size
        t = self.rest.predict(B)
        if num_tokens == 0:
            return t + self.verify.predict(B) * self.no_draft_ratio(B).value
        t += self.verify.predict(B * (1 + num_tokens))
        first = batch.first_pass_tokens
        first = B * (1 + num_tokens) if first is None else max(first - batch.other_tokens, B)
        t += self.first_pass.predict(first)
        t += (num_tokens - 1) * self.beam_step.predict(B * width)
        return t + owed_share * self.owed_time(batch)


def expected_tokens(batch: Batch, stats: dict, width: int, num_tokens: int,
                    confidence: float = 0.0) -> float:
    """Σ over rows of 1 + E[accepted] (``confidence``: AcceptanceStats.expected_accepted's);
    exact rows draft with one beam; a short row's draft counts up to its tokens left − 1."""
    total = 0.0
    short = {}
    for (cls, left), n in batch.short:
        short[cls] = short.get(cls, 0) + n
        total += n * _row_tokens(stats, cls, width, min(num_tokens, max(left - 1, 0)),
                                 confidence)
    for cls, n in batch.rows.items():
        n -= short.get(cls, 0)
        if n > 0:
            total += n * _row_tokens(stats, cls, width, num_tokens, confidence)
    return total


def _row_tokens(stats: dict, cls: str, width: int, num_tokens: int,
                confidence: float = 0.0) -> float:
    if num_tokens <= 0:
        return 1.0
    # Exact rows draft the argmax chain; a greedy row's one-token draft is its argmax whatever
    # W (a beam's score is its log-probability): both are priced as one beam's. (Priced by
    # W4's counts of one token, which come mostly from the first tokens of four-token beams,
    # chosen on all four, W4 γ1 read better than W1 γ1 at T=0 "joint", batch 4, and the
    # policy drafted it in most steps, 4 % slower than not drafting: grid-ec32ae1.)
    one_beam = cls == "exact" or (cls == "joint" and num_tokens == 1)
    return 1.0 + stats[cls].expected_accepted(1 if one_beam else width, num_tokens, confidence)


def goodput(batch: Batch, costs: CostModel, stats: dict, width: int, num_tokens: int,
            amortise: bool = True, confidence: float = 0.0) -> float:
    """Expected tokens per second of the step (W, γ) = (width, num_tokens). What the draft owes
    (CostModel.owed_time) buys drafting for the rest of those requests: it is charged over the
    steps they have left at this arm's rate (``amortise``), or in full (what an exploration
    step pays). ``confidence``: price the tokens that many standard errors below their
    estimate (see :func:`choose`)."""
    tokens = expected_tokens(batch, stats, width, num_tokens, confidence)
    share = 1.0
    if amortise:
        share = 1.0 / max(1.0, batch.remaining_tokens / max(tokens / max(batch.size, 1), 1.0))
    seconds = costs.step_time(batch, width, num_tokens, share)
    if num_tokens > 0:
        seconds += costs.prompt_time(batch, tokens)
    return tokens / max(seconds, 1e-9)


def arms(bounds: Bounds, batch: Batch) -> list[tuple[int, int]]:
    """Every (W, γ) in bounds; one W when every row is exact (W does not matter to them)."""
    only_exact = batch.rows.get("exact", 0) == batch.size
    widths = [1] if only_exact else range(bounds.min_beam_width, bounds.beam_width + 1)
    return [(w, g) for w in widths for g in range(bounds.min_tokens, bounds.max_tokens + 1)
            if g > 0 or w == widths[0]]


def exploration_cost(batch: Batch, costs: CostModel, stats: dict, arm: tuple,
                     best_goodput: float) -> float:
    """Seconds an exploration step drafting ``arm`` loses against the best arm: its predicted
    time, with the draft's reading of what it owes in full (an exploration pays it at once),
    less the time the best arm takes to make the tokens it is expected to make; >= 0."""
    w, g = arm
    tokens = expected_tokens(batch, stats, w, g)
    seconds = costs.step_time(batch, w, g, owed_share=1.0)
    if g > 0:
        seconds += costs.prompt_time(batch, tokens)
    return max(0.0, seconds - tokens / max(best_goodput, 1e-9))


def choose(batch: Batch, costs: CostModel, stats: dict, bounds: Bounds, step: int,
           explore_period: int = 16, min_samples: int = 8, confidence: float = 1.0,
           min_no_draft: int = 3, budget: float = float("inf")) -> Plan:
    """The (W, γ) that maximises expected goodput for ``batch``, each arm's expected tokens
    taken ``confidence`` standard errors below their estimate: an arm measured on a few drafts
    (an exploration arm) is not chosen over a well-measured one for a lucky streak.

    Before ``costs`` has ``min_samples`` of each component: the configured (beam_width,
    max_tokens), so the first steps measure the fixed setting. Afterwards one step in
    ``explore_period`` explores, in turn (unless it would pick the best arm):

    - an arm of a fixed cycle (W = 1 and W = beam_width at the full length, half the length,
      the shortest draft of at least one token and, where the bounds allow it, no draft), for
      the cost lines: the shortest arm keeps the verify line measured at sizes the long drafts
      never reach; the step without a draft measures what not drafting costs
      (CostModel.no_draft) while the policy drafts, and is explored first until
      ``min_no_draft`` steps of this batch size have measured it;
    - the drafting arm with the best goodput priced ``confidence`` standard errors *above* its
      expected tokens (an upper confidence bound), where that beats the best arm's price, for
      the acceptance estimates: the arm that may be the best and is measured least (where none
      may be better, the cycle's next arm). With the cycle alone, after batch 4 had measured
      four beams on a few unlucky drafts, batch 1 explored them twice in ~160 steps and kept
      drafting one beam (real pair, history-b4-then-b1 in docs/results-history.md); the
      widths' counts now age with every width's drafts of their length (AcceptanceStats), so
      such a figure fades and its arm's bound grows until it is tried again.

    An exploration step whose :func:`exploration_cost` exceeds ``budget`` (seconds, the
    caller's :class:`ExplorationBudget`) drafts the best arm instead."""
    only_exact = batch.rows.get("exact", 0) == batch.size
    full_width = 1 if only_exact else bounds.beam_width
    if batch.size == 0 or not costs.ready(min_samples, bounds.max_tokens):
        return Plan(full_width, bounds.max_tokens)
    best, best_goodput = None, -1.0
    for w, g in arms(bounds, batch):
        value = goodput(batch, costs, stats, w, g, confidence=confidence)
        if value > best_goodput + 1e-12:
            best, best_goodput = (w, g), value
    w, g = best
    if explore_period > 0 and step % explore_period == 0:
        half = max(bounds.min_tokens, 1, (bounds.max_tokens + 1) // 2)
        narrow = max(bounds.min_beam_width, 1)
        shortest = (w, max(bounds.min_tokens, 1))
        candidates = [(narrow, bounds.max_tokens), (full_width, bounds.max_tokens), (w, half),
                      shortest]
        if only_exact:
            candidates = [(1, c[1]) for c in candidates]
        candidates = [c for c in dict.fromkeys(candidates) if c != (w, g)]
        # No draft: the draft skips one step (its KV catches up on the next drafting step).
        skip = [(1 if only_exact else narrow, 0)] if bounds.min_tokens == 0 and g > 0 else []
        owed = costs.reading_time(batch)
        candidates = [c for c in candidates  # every candidate drafts (γ >= 1)
                      if _explorable(batch, costs, stats, c, owed)] + skip
        turn = step // explore_period
        if skip and costs.no_draft_ratio(batch.size).samples < min_no_draft:
            # Not measured at this batch size yet: before the other arms (one sample moves
            # the price by up to 2x; the drafting arms are fitted on every drafting step).
            candidates = skip
        elif turn % 2 == 0:  # the optimistic turn (docstring)
            pick = _optimistic_arm(batch, costs, stats, bounds, (w, g), best_goodput,
                                   confidence, owed)
            if pick is not None:
                candidates = [pick]
        if candidates:
            ew, eg = candidates[(turn // 2) % len(candidates)]
            cost = exploration_cost(batch, costs, stats, (ew, eg), best_goodput)
            if cost <= budget:
                value = goodput(batch, costs, stats, ew, eg, amortise=False)
                return Plan(ew, eg, explore=True, goodput=value,
                            seconds=expected_tokens(batch, stats, ew, eg) / max(value, 1e-9),
                            cost=cost)
    return Plan(w, g, goodput=best_goodput,
                seconds=expected_tokens(batch, stats, w, g, confidence) / max(best_goodput, 1e-9))


def _explorable(batch: Batch, costs: CostModel, stats: dict, arm: tuple, owed: float) -> bool:
    """Whether an exploration step may draft ``arm`` (γ >= 1). It pays what the draft must
    read first in full (``owed``: CostModel.reading_time, the catch-up, prompts included, and
    this step's prefill chunks): not where that costs more than the drafting step itself
    (after a run without drafting the draft may owe every prompt of the batch; measuring one
    drafting step is not worth that). The prompts count here though the choice prices them as
    a rate: this step reads them in full. Nor an arm no row can take a drafted token from
    (rows with one token left have their drafts cut to nothing: the step would pay the draft
    and learn nothing; measured on the real pair, a closing batch-1 step took 0.31 s where
    not drafting took 0.11 s)."""
    return (owed <= costs.step_time(batch, *arm, owed_share=0.0)
            and expected_tokens(batch, stats, *arm) > batch.size + 1e-9)


def _optimistic_arm(batch: Batch, costs: CostModel, stats: dict, bounds: Bounds,
                    best: tuple, best_goodput: float, confidence: float, owed: float):
    """The drafting arm other than ``best`` with the highest goodput priced ``confidence``
    standard errors above its expected tokens, if that beats ``best_goodput`` (else None:
    no arm may be better); arms :func:`_explorable` refuses are left out."""
    bound, pick = best_goodput, None
    for c in arms(bounds, batch):
        if c == best or c[1] == 0 or not _explorable(batch, costs, stats, c, owed):
            continue
        value = goodput(batch, costs, stats, *c, confidence=-confidence)
        if value > bound + 1e-12:
            bound, pick = value, c
    return pick


def new_stats(beam_width: int, max_tokens: int) -> dict:
    return {cls: AcceptanceStats(beam_width, max_tokens) for cls in CLASSES}


def summary(stats: dict) -> dict:
    """Per class and W: drafts seen and E[accepted] at full length (for logs and benchmarks)."""
    out = {}
    for cls, s in stats.items():
        if s.drafts == 0:
            continue
        out[cls] = {f"W{w}": round(s.expected_accepted(w, s.max_tokens), 3)
                    for w in range(1, s.beam_width + 1)} | {"drafts": s.drafts}
    return out


__all__ = ["CLASSES", "LinearCost", "Ratio", "AcceptanceStats", "Bounds", "Batch", "Plan",
           "ExplorationBudget", "CostModel", "prefill_tokens", "expected_tokens", "goodput",
           "exploration_cost", "arms", "choose", "new_stats", "summary"]
