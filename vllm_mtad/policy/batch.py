"""What the policy decides for and what it decides: the step's batch, the bounds, the plan.

No vLLM, no torch. Why each rule: docs/policy-decisions.md (anchors named below).
"""

from __future__ import annotations

from dataclasses import dataclass


def row_beams(cls: str, width: int) -> int:
    """Beams a row of class ``cls`` drafts when the step drafts ``width``: an "exact" row
    (greedy, exact acceptance) drafts the draft's argmax chain, one beam, since exact
    acceptance reads no draft probability and the argmax chain is the one that matches the
    target's argmax most often; every other row drafts ``width``."""
    return 1 if cls == "exact" else width


def batch_beams(classes, width: int) -> int:
    """Beams the step drafts for rows of ``classes`` (1 when every row is exact, or none)."""
    return max((row_beams(c, width) for c in classes), default=1)


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
class Plan:
    """The step's choice: W beams, γ tokens (0: no draft forward this step)."""

    beam_width: int
    num_tokens: int
    explore: bool = False
    goodput: float | None = None  # predicted tokens per second; None before the models have data
    # Predicted seconds of the step (the chosen arm's, its reading included) and, for an
    # exploration step, what it costs against the best arm (exploration_cost); 0 otherwise.
    seconds: float = 0.0
    cost: float = 0.0


@dataclass(frozen=True)
class RowDemand:
    """Per batch row (in the step's order), what pricing the step reads of its requests
    (:meth:`vllm_mtad.request_state.MTADRequestState.demand` computes it)."""

    classes: list  # CLASSES name per row
    tokens_left: list  # output tokens the request may still generate
    prompt_tokens: list  # prompt tokens the draft reads of it (a prefix-cache hit's are cached)
    max_tokens: list  # output tokens it may generate in all (inf: no budget known)
    catch_up_tokens: int = 0  # what the draft would catch up on if this step drafted
    arrival_tokens: int = 0  # of those, prompt tokens of requests whose prompt is being read


@dataclass(frozen=True)
class Batch:
    """The batch a step drafts for.

    ``rows``: rows per class. ``other_tokens``: scheduled tokens that are prefill chunks,
    verified alike by every arm. ``first_pass_tokens``: what the draft's first pass reads if
    the step drafts (None, synthetic batches: a decode step verifying the arm's own γ,
    B·(1 + γ)). ``catch_up_tokens``: tokens skipped in steps without drafting, read before the
    step drafts; of them, ``catch_up_arrival_tokens`` are prompts of requests whose prompt this
    step reads (priced by the rate, #prompts-are-a-rate); the rest are a debt spread over
    ``remaining_tokens``, the rows' mean output tokens still to generate
    (#skipped-prompts-are-a-debt). ``prompt_per_token``: the rows' mean of (prompt tokens the
    draft reads) / (output tokens the request may generate). ``short``: ((class, tokens left),
    count) of rows with at most the longest draft left: a row with L left gains at most L − 1
    from a draft."""

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

    @property
    def classes(self) -> tuple:
        """The classes the batch has rows of."""
        return tuple(c for c, n in self.rows.items() if n > 0)

    @classmethod
    def from_step(cls, demand: RowDemand, scheduled_tokens: int, verified_drafts: int,
                  horizon: int) -> Batch:
        """The batch of a step whose target input held ``scheduled_tokens`` tokens, of which
        ``verified_drafts`` were the previous round's drafts (the rest beyond one token a row
        are prefill chunks); rows with at most ``horizon`` (the longest draft) tokens left are
        ``short``."""
        classes = demand.classes
        rows = {}
        for c in classes:
            rows[c] = rows.get(c, 0) + 1
        short, remaining = {}, 1.0
        if demand.tokens_left:
            remaining = sum(demand.tokens_left) / len(demand.tokens_left)
            for c, left in zip(classes, demand.tokens_left):
                if left <= horizon:
                    short[(c, int(left))] = short.get((c, int(left)), 0) + 1
        per_token = 0.0
        if demand.prompt_tokens and demand.max_tokens:
            per_token = sum(p / max(m, 1) for p, m in zip(
                demand.prompt_tokens, demand.max_tokens)) / len(demand.prompt_tokens)
        return cls(rows, other_tokens=prefill_tokens(len(classes), scheduled_tokens,
                                                     verified_drafts),
                   first_pass_tokens=scheduled_tokens, catch_up_tokens=demand.catch_up_tokens,
                   remaining_tokens=remaining, short=tuple(sorted(short.items())),
                   catch_up_arrival_tokens=min(demand.arrival_tokens, demand.catch_up_tokens),
                   prompt_per_token=per_token)


def prefill_tokens(rows: int, scheduled_tokens: int, verified_drafts: int) -> int:
    """Tokens of a step's target input that are prefill chunks: beyond one token a row and
    the drafts it verifies."""
    return max(0, scheduled_tokens - rows - verified_drafts)
