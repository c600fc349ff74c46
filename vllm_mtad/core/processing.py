"""The request's processed distribution, for the draft's logits (and the target's in MTAD's
sampler when every sampled request uses top-k; otherwise the sampler uses vLLM's own
apply_sampling_constraints, which gives the same distribution: tests/test_glue_units.py).

MTAD compares draft and target probabilities of the same tokens, so both must be processed by
the same rule. For sampled rows (temperature > 0) this follows vLLM's sampler, in vLLM's order:
temperature, then min-p, then top-k, then top-p (top-p measured on the top-k-truncated
distribution). Greedy rows (temperature 0) get the *unprocessed* log-softmax, which is what the
greedy modes of MTAD compare (docs/algorithm.md#greedy-requests).

Conventions (vLLM's): top_k <= 0 or >= vocab size disables top-k and ties at the k-th largest
logit are all kept; top_p >= 1 disables top-p and the most likely token always survives;
min_p <= 0 disables min-p. Ties at the top-p boundary: the definition sorts ascending with a
*stable* sort, so among equal logits the lower token id counts as the smaller one (dropped first).

Two forms of the same distribution:
- :func:`processed_logprobs`: every token's log-probability, [rows, V]. The definition, used by
  the reference implementation and as the oracle for the fast form.
- :func:`draft_candidates`: only the tokens that can matter, [rows, K] with their ids, from one
  k-selection over the logits (no sort): for a sampled row with top-k, its top-k tokens (ties
  at the k-th value kept) with top-p applied on them; for a greedy row, its top K by logit (a
  beam step keeps W beams, so K >= W candidates per beam suffice). Rows that need every token
  (sampled, no top-k) make the whole call dense, K = V. :func:`size_candidates` chooses K on the
  host from the requests' settings.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

# A temperature below this counts as greedy (vLLM's _SAMPLING_EPS).
GREEDY_TEMPERATURE = 1e-5


def is_greedy(temperature):
    """[num_rows] bool: rows decoded greedily. ``temperature``: [num_rows], a tensor (on any
    device) or vLLM's host array (numpy); the answer is of the same kind."""
    return temperature < GREEDY_TEMPERATURE


def greedy_and_divisor(temperature: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[num_rows] bool greedy rows, and [num_rows] float32 temperature to divide the logits
    by (1 for greedy rows, whose logits stay unscaled)."""
    greedy = is_greedy(temperature)
    divisor = torch.where(greedy, torch.ones_like(temperature), temperature).to(torch.float32)
    return greedy, divisor


def _top_k_active(top_k: torch.Tensor, greedy: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[num_rows] bool: rows whose top-k removes tokens (vLLM: 0 < k < V, sampled rows)."""
    return ~greedy & (top_k > 0) & (top_k < vocab_size)


def _mask_top_p(ascending: torch.Tensor, top_p: torch.Tensor, active: torch.Tensor
                ) -> torch.Tensor:
    """vLLM's top-p rule on logits sorted ascending along each row ([rows, n]): the tokens whose
    cumulative probability stays within 1 - top_p get -inf; the most likely token always
    survives. ``active``: [rows] bool, the rows it applies to."""
    cum = ascending.softmax(dim=-1).cumsum(dim=-1)
    drop = cum <= (1 - top_p.to(torch.float32))[:, None]
    drop[:, -1] = False  # the most likely token always survives
    return ascending.masked_fill(active[:, None] & drop, float("-inf"))


def processed_logprobs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-probabilities of the processed distribution; removed tokens get -inf.

    Args:
        logits: [num_rows, vocab_size] float, raw logits (after any logits processors).
        temperature: [num_rows] float; rows below GREEDY_TEMPERATURE are greedy and get the
            unprocessed log-softmax.
        top_k: [num_rows] int or None.
        top_p: [num_rows] float or None.
        min_p: [num_rows] float or None.
    Returns:
        [num_rows, vocab_size] float32.
    """
    assert logits.ndim == 2, f"logits must be [num_rows, vocab_size], got {tuple(logits.shape)}"
    num_rows, vocab_size = logits.shape
    for name, t in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p),
                    ("min_p", min_p)):
        assert t is None or t.shape == (num_rows,), f"{name} must be [{num_rows}], got {tuple(t.shape)}"

    logits = logits.to(torch.float32)
    greedy, temp = greedy_and_divisor(temperature)
    scaled = logits / temp[:, None]

    if min_p is not None:
        # Keep tokens with prob >= min_p * max prob (vLLM's MinPLogitsProcessor).
        probs = scaled.softmax(dim=-1)
        threshold = probs.amax(dim=-1, keepdim=True) * min_p.to(torch.float32)[:, None]
        active = (~greedy & (min_p > 0))[:, None]
        scaled = scaled.masked_fill(active & (probs < threshold), float("-inf"))

    if top_k is not None or top_p is not None:
        # Sort ascending as vLLM's apply_top_k_top_p does, mask, then scatter back.
        sorted_logits, order = scaled.sort(dim=-1, descending=False, stable=True)
        if top_k is not None:
            k = top_k.to(torch.int64)
            k_active = _top_k_active(k, greedy, vocab_size)
            k_idx = (vocab_size - k.clamp(1, vocab_size))[:, None]
            kth = sorted_logits.gather(1, k_idx)
            sorted_logits = sorted_logits.masked_fill(k_active[:, None] & (sorted_logits < kth),
                                                      float("-inf"))
        if top_p is not None:
            sorted_logits = _mask_top_p(sorted_logits, top_p, ~greedy & (top_p < 1))
        scaled = torch.empty_like(scaled).scatter_(1, order, sorted_logits)

    return scaled.log_softmax(dim=-1)


# Extra candidates past the largest top-k, k_max + max(TIE_SLACK, k_max) in all: a row whose
# ties at the k-th value reach past them is flagged (``Candidates.overflow``) and must be
# processed densely instead. bfloat16 logits tie often (8 mantissa bits): with slack 8, random
# bf16 rows overflowed at top-k 50 about 2 % of the time, so the slack grows with k.
TIE_SLACK = 8
# Above this share of the vocabulary a k-selection stops paying; such rounds run dense.
MAX_SPARSE_FRACTION = 0.125


@dataclass(frozen=True)
class CandidateSizing:
    """Decided on the host from the requests' settings, once per batch: no device sync."""

    # K candidates per row, or None: dense (every token).
    num_candidates: int | None
    # Largest active top-k of a sampled row (0: none); sizes the dense path's k-selection.
    max_top_k: int
    # Some sampled row uses top-p (the dense path then needs the definition's sort).
    any_top_p: bool
    # Some row is greedy (its log-probs need the whole vocabulary's normaliser).
    any_greedy: bool = True


def size_candidates(vocab_size: int, beam_width: int, greedy: list[bool], top_k: list[int],
                    top_p: list[float]) -> CandidateSizing:
    """Host-side: how :func:`draft_candidates` processes a batch.

    Args:
        vocab_size: V.
        beam_width: W (greedy rows need W candidates per beam).
        greedy: per row, decoded greedily.
        top_k: per row, vLLM's convention (<= 0 or >= V: disabled).
        top_p: per row (>= 1: disabled).
    """
    sampled = [(k, p) for g, k, p in zip(greedy, top_k, top_p) if not g]
    active_k = [k for k, _ in sampled if 0 < k < vocab_size]
    any_top_p = any(p < 1 for _, p in sampled)
    max_top_k = max(active_k, default=0)
    dense = len(active_k) < len(sampled)  # a sampled row without top-k: every token counts
    num = max(beam_width, max_top_k + max(TIE_SLACK, max_top_k) if active_k else 0)
    any_greedy = len(sampled) < len(greedy)
    if dense or num >= vocab_size * MAX_SPARSE_FRACTION:
        return CandidateSizing(None, max_top_k, any_top_p, any_greedy)
    return CandidateSizing(num, max_top_k, any_top_p, any_greedy)


@dataclass
class Candidates:
    """The tokens of each row that can be drafted or sampled, with their processed log-probs."""

    # [rows, K] float32: log-probability of each candidate under the processed distribution
    # (-inf: removed by top-k/top-p; the row's finite entries sum to probability 1).
    logprobs: torch.Tensor
    # [rows, K] int64 token ids, or None when dense (K = V and candidate j is token j).
    token_ids: torch.Tensor | None
    # [rows] bool: ties at the k-th value may extend past the K candidates; the row's
    # candidates are incomplete and the caller must redo the call densely.
    overflow: torch.Tensor


def draft_candidates(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    sizing: CandidateSizing,
) -> Candidates:
    """The processed distribution of every row as candidates (see the module docstring).

    Equal to :func:`processed_logprobs` on the candidates it returns (all other tokens have
    probability 0 there, or, for greedy rows, cannot be among a beam step's W best), up to
    float rounding of the normaliser.

    Args:
        logits: [rows, V] float, raw logits.
        temperature, top_k, top_p: [rows] each (top_k/top_p may be None), vLLM's conventions.
        sizing: from :func:`size_candidates` for these rows.
    Returns:
        :class:`Candidates`.
    """
    assert logits.ndim == 2, f"logits must be [rows, V], got {tuple(logits.shape)}"
    R, V = logits.shape
    if sizing.num_candidates is None or sizing.num_candidates >= V:
        return Candidates(dense_processed_logprobs(logits, temperature, top_k, top_p, sizing),
                          None, torch.zeros(R, dtype=torch.bool, device=logits.device))
    K = sizing.num_candidates
    greedy, temp = greedy_and_divisor(temperature)
    # [R, K] descending; ties in an order fixed below.
    values, ids = logits.topk(K, dim=-1)
    values = values.to(torch.float32)
    # Order ties by descending token id, i.e. the reverse of the definition's stable ascending
    # sort (only matters for top-p at a tie; a K-element sort, not a V-element one).
    ids, perm = ids.sort(dim=-1, descending=True, stable=True)
    values = values.gather(1, perm)
    values, perm = values.sort(dim=-1, descending=True, stable=True)
    ids = ids.gather(1, perm)
    scaled = values / temp[:, None]

    # Greedy rows: plain log-softmax over the whole vocabulary (one read for the normaliser,
    # only when the batch has greedy rows).
    greedy_lp = None
    if sizing.any_greedy:
        greedy_lp = values - logits.to(torch.float32).logsumexp(dim=-1)[:, None]

    if top_k is None:  # only greedy rows can be sparse without top-k (see size_candidates)
        k = torch.full((R,), K, dtype=torch.int64, device=logits.device)
    else:
        k = top_k.to(torch.int64).clamp(1, K)
    kth = scaled.gather(1, (k - 1)[:, None])  # [R, 1] the k-th largest scaled logit
    masked = scaled.masked_fill(scaled < kth, float("-inf"))
    overflow = ~greedy & (scaled[:, -1:] >= kth)[:, 0]
    if top_p is not None:
        # vLLM's rule on the top-k-truncated distribution, in ascending order (the K
        # candidates reversed; tokens outside them have probability 0 and add nothing).
        # (Greedy rows are replaced by greedy_lp below.)
        masked = _mask_top_p(masked.flip(1), top_p, top_p < 1).flip(1)
    lp = masked.log_softmax(dim=-1)
    if greedy_lp is not None:
        lp = torch.where(greedy[:, None], greedy_lp, lp)
    return Candidates(lp, ids, overflow)


def mask_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                     sizing: CandidateSizing, greedy: torch.Tensor | None = None
                     ) -> torch.Tensor | None:
    """vLLM's ``apply_top_k_top_p(logits, top_k, top_p)`` by one k-selection per row: the
    logits with every token outside its row's top-k/top-p set at -inf and the kept ones
    unchanged, so that a sampler drawing from the result draws what it draws after vLLM's sort
    (same kept set; tokens with equal logits at the top-p boundary are ordered as
    :func:`processed_logprobs` orders them, where vLLM's unstable sort is arbitrary). None
    where a selection cannot decide, and the caller must take vLLM's sort: ``sizing`` dense (a
    row without top-k) or a row's ties at its k-th value reaching past the candidates (read on
    the host: a sync, free on the CPU this is for).

    Args:
        logits: [rows, V] float, scaled by temperature already (as vLLM's sampler hands them).
        top_k, top_p: [rows] each, vLLM's conventions.
        sizing: from :func:`size_candidates` for these rows (beam width 1).
        greedy: [rows] bool or None; rows left as they are (vLLM takes their argmax).
    Returns:
        [rows, V] float, a new tensor, or None.
    """
    if sizing.num_candidates is None:
        return None
    R = logits.shape[0]
    if greedy is None:
        greedy = torch.zeros(R, dtype=torch.bool, device=logits.device)
    # Select at temperature 1 (the logits are scaled); 0 marks greedy rows for draft_candidates.
    temp = (~greedy).to(torch.float32)
    cands = draft_candidates(logits, temp, top_k, top_p, replace(sizing, any_greedy=False))
    if bool(cands.overflow.any()):
        return None
    kept = torch.where(torch.isinf(cands.logprobs), float("-inf"),
                       logits.gather(1, cands.token_ids))
    masked = torch.full_like(logits, float("-inf")).scatter_(1, cands.token_ids, kept)
    return torch.where(greedy[:, None], logits, masked)


def dense_processed_logprobs(logits: torch.Tensor, temperature: torch.Tensor,
                             top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                             sizing: CandidateSizing) -> torch.Tensor:
    """:func:`processed_logprobs` without its full sort when no row uses top-p: top-k masks
    below the k-th value found by a k-selection. With top-p, the definition itself (a sort).

    Returns:
        [rows, V] float32.
    """
    if sizing.any_top_p:
        return processed_logprobs(logits, temperature, top_k, top_p)
    R, V = logits.shape
    greedy, temp = greedy_and_divisor(temperature)
    scaled = logits.to(torch.float32) / temp[:, None]
    if top_k is not None and sizing.max_top_k > 0:
        k = top_k.to(torch.int64)
        k_active = _top_k_active(k, greedy, V)
        k_sel = min(sizing.max_top_k, V)
        top = scaled.topk(k_sel, dim=-1).values  # [R, k_sel]
        kth = top.gather(1, (k.clamp(1, k_sel) - 1)[:, None])
        scaled = scaled.masked_fill(k_active[:, None] & (scaled < kth), float("-inf"))
    return scaled.log_softmax(dim=-1)
