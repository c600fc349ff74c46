"""How many drafted tokens the target accepts: per request class, beam width W and draft
length g, counted from every verified draft.

No vLLM, no torch. Why each rule: docs/policy-decisions.md (anchors named below).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Request classes: "sampled" (temperature > 0), "joint" and "exact" (greedy, by acceptance
# mode).
CLASSES = ("sampled", "joint", "exact")


@dataclass
class AcceptanceStats:
    """Per beam width W and draft length g: decayed counts of drafts of g tokens, and of those
    with at least i accepted (i = 1..g). E[accepted | W, g] = Σ_{i ≤ g} P(accepted ≥ i | W, g).

    - Per length, because MTAD accepts the *largest* passing prefix: a longer draft's first g
      tokens can pass where a draft of g would not. Every verified draft also counts as a draft
      of each shorter length, with what the rule accepts of those tokens alone
      (#acceptance-per-length).
    - Counts of every width age with each new draft of their length, so the figure of a width
      the policy stopped drafting returns to the prior (#widths-age-together); a length no
      draft reached in a window of steps ages by one draft a step instead, so a length last
      drafted long ago rests on the drafts since, through its prior (#stale-lengths-age);
      by ``stale_decay`` a step where its counts read below that prior: a pessimistic figure
      is tried again soon, an optimistic one waits for drafts to refute it
      (#stale-pessimism-fades).
    - Estimates are shrunk (``prior_weight`` pseudo-drafts) towards the same (length,
      position) pooled over widths, itself shrunk towards the next shorter length's estimate
      and, at the new last position, that estimate's last continuation (P(≥ i) / P(≥ i − 1),
      geometric); the first position's prior is ``prior_rate``: a width never tried reads as
      the others, a length never drafted as the shorter ones continued, a fresh engine as a
      moderately good draft."""

    beam_width: int
    max_tokens: int
    decay: float = 0.995
    # A length no draft reached, whose own counts read below its prior, ages this much a step
    # (#stale-pessimism-fades).
    stale_decay: float = 0.98
    prior_rate: float = 0.7
    prior_weight: float = 4.0
    # [W][g-1]: decayed counts of drafts of length g; [W][g-1][i-1]: of those, accepted >= i.
    drafted: list = field(default_factory=list)
    passed: list = field(default_factory=list)
    drafts: int = 0
    # [W]: drafts of the longest length (max_tokens) by W beams, ever (not decayed): whether
    # the policy's longest arm has been measured at all (#cold-start-measures-the-long-arm).
    long_drafts: list = field(default_factory=list)
    # Distinct requests that drafted the longest length, counted by the controller up to the
    # cold start's need: long drafts of one or two requests are one or two openings, not a
    # rate (#cold-start-spans-requests).
    long_requests: int = 0
    _rates: list | None = None  # [W][g-1][i-1] estimates, recomputed after a record
    _priors: list | None = None  # [g-1]: the prior each length's pooled estimate shrinks to

    def __post_init__(self) -> None:
        G = self.max_tokens
        self.drafted = [[0.0] * G for _ in range(self.beam_width)]
        self.passed = [[[0.0] * g for g in range(1, G + 1)] for _ in range(self.beam_width)]
        self.long_drafts = self.long_drafts or [0] * self.beam_width

    def record(self, width: int, num_drafted: int, num_accepted: int, count: int = 1) -> None:
        """``count`` drafts of ``num_drafted`` tokens by ``width`` beams, each with
        ``num_accepted`` accepted (their shorter prefixes: min(num_accepted, g))."""
        self.record_batch(width, [(num_drafted, num_accepted, count)])

    def record_batch(self, width: int, cells, prefix_cells=None) -> None:
        """Drafts by ``width`` beams verified in one window, as (drafted, accepted, count)
        cells, and ``prefix_cells``: their shorter prefixes as (length, accepted by the rule on
        those tokens alone, count) (None: min(accepted, length)). Recorded at once: each
        length's older counts decay once by the window's total (#one-window-at-once)."""
        self.record_window({width: (cells, prefix_cells)})

    def record_window(self, by_width: dict, steps: int = 1) -> None:
        """One window's drafts of every width, ``{width: (cells, prefix_cells)}`` as in
        :meth:`record_batch`, made over ``steps`` engine steps; each length's older counts, of
        every width, decay once by the window's new drafts of that length, or by ``steps``
        where the window has none of that length."""
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
                self.long_drafts[w] += sum(n for d, _, n in cells if d == G)
        if not entries:
            return
        new = [0] * G
        for e in entries.values():
            for g, _, n in e:
                new[g - 1] += n
        # (only where some length has no new draft: the check prices every length)
        below = self._below_prior() if not all(new) else [False] * G
        for g in range(1, G + 1):
            n = new[g - 1]
            stale = self.stale_decay if below[g - 1] else self.decay
            self._age(g, self.decay ** n if n else stale ** max(steps, 1))
        for w, e in entries.items():
            for g, a, n in e:
                self.drafted[w][g - 1] += n
                row = self.passed[w][g - 1]
                for i in range(a):
                    row[i] += n
        self._rates = None

    def _age(self, g: int, keep: float) -> None:
        """Every width's counts of length ``g`` times ``keep``."""
        for v in range(self.beam_width):
            self.drafted[v][g - 1] *= keep
            row = self.passed[v][g - 1]
            for i in range(g):
                row[i] *= keep

    def _below_prior(self) -> list:
        """[g-1]: whether length g's own counts, pooled over widths, read fewer accepted
        tokens than its prior (the shorter length continued)."""
        self._estimates()
        out = []
        for g in range(1, self.max_tokens + 1):
            n = sum(self.drafted[w][g - 1] for w in range(self.beam_width))
            own = sum(sum(self.passed[w][g - 1]) for w in range(self.beam_width))
            out.append(n > 0 and own / n < sum(self._priors[g - 1]) - 1e-12)
        return out

    def _estimates(self) -> list:
        """[W][g-1][i-1]: P(accepted >= i | a draft of g tokens by W beams), shrunk as the
        class docstring says; cached until the next record."""
        if self._rates is not None:
            return self._rates
        G, k, widths = self.max_tokens, self.prior_weight, range(self.beam_width)
        rates = [[None] * G for _ in widths]
        priors = []
        shorter = []  # the pooled estimates of length g - 1
        for g in range(1, G + 1):
            if not shorter:
                base = [self.prior_rate]
            else:  # the shorter length continued at its last position's rate (P(≥ 0) = 1)
                prev = shorter[-2] if len(shorter) > 1 else 1.0
                base = shorter + [shorter[-1] * min(1.0, shorter[-1] / max(prev, 1e-9))]
            priors.append(base)
            n = sum(self.drafted[w][g - 1] for w in widths)
            pooled = [(sum(self.passed[w][g - 1][i] for w in widths) + k * base[i]) / (n + k)
                      for i in range(g)]
            for w in widths:
                rates[w][g - 1] = [(self.passed[w][g - 1][i] + k * pooled[i])
                                   / (self.drafted[w][g - 1] + k) for i in range(g)]
            shorter = pooled
        self._rates, self._priors = rates, priors
        return rates

    def expected_accepted(self, width: int, num_tokens: int, confidence: float = 0.0) -> float:
        """E[accepted tokens] of a draft of ``num_tokens`` by ``width`` beams; with
        ``confidence`` c != 0, c standard errors below it (c < 0: above it; each position's
        rate counts this length's drafts and the prior's weight, the positions' errors add as
        if independent), within [0, num_tokens]."""
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
