"""MTAD's own settings, validated on construction (no vLLM import)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

GREEDY_ACCEPTANCE_MODES = ("joint", "exact")


@dataclass(frozen=True)
class MTADConfig:
    """The settings MTAD adds to a draft-model speculative config.

    num_speculative_tokens: γ, draft tokens per step (>= 1).
    beam_width: W, beams per request in the draft (>= 1; 1 = ordinary ancestral sample/greedy).
    acceptance_threshold: τ in (0, 1]; the longest draft prefix with p̃/q̃ >= τ is accepted.
        Smaller accepts more (faster, further from the target); 1 accepts only prefixes the
        target likes at least as much as the draft does.
    greedy_acceptance: "joint" (MTAD's joint greedy approximation) or "exact" (lossless:
        identical to the target's own greedy decoding) for temperature-0 requests.
    """

    num_speculative_tokens: int
    beam_width: int = 4
    acceptance_threshold: float = 0.5
    greedy_acceptance: str = "joint"

    def __post_init__(self) -> None:
        _check_int("num_speculative_tokens", self.num_speculative_tokens, minimum=1)
        _check_int("beam_width", self.beam_width, minimum=1)
        check_threshold("acceptance_threshold", self.acceptance_threshold)
        check_greedy_acceptance("greedy_acceptance", self.greedy_acceptance)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_int(key: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"MTAD setting {key!r} must be an integer >= {minimum}, got {value!r}.")


def check_threshold(key: str, value: Any) -> float:
    """Return τ as a float if it lies in (0, 1], else raise naming ``key``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not 0.0 < float(value) <= 1.0:
        raise ValueError(f"MTAD setting {key!r} must be a number in (0, 1], got {value!r}. "
                         "Smaller values accept longer draft prefixes; 1 is the strictest.")
    return float(value)


def check_greedy_acceptance(key: str, value: Any) -> str:
    """Return the mode if it is one of GREEDY_ACCEPTANCE_MODES, else raise naming ``key``."""
    if value not in GREEDY_ACCEPTANCE_MODES:
        raise ValueError(f"MTAD setting {key!r} must be one of {list(GREEDY_ACCEPTANCE_MODES)}, "
                         f"got {value!r}.")
    return value
