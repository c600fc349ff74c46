"""The request's processed distribution, applied identically to draft and target logits.

MTAD compares draft and target probabilities of the same tokens, so both must be processed by
the same rule. For sampled rows (temperature > 0) this follows vLLM's sampler, in vLLM's order:
temperature, then min-p, then top-k, then top-p (top-p measured on the top-k-truncated
distribution). Greedy rows (temperature 0) get the *unprocessed* log-softmax, which is what the
greedy modes of MTAD compare (DESIGN.md §1.2).

Conventions (vLLM's): top_k <= 0 or >= vocab size disables top-k and ties at the k-th largest
logit are all kept; top_p >= 1 disables top-p and the most likely token always survives;
min_p <= 0 disables min-p.
"""

from __future__ import annotations

import torch

# A temperature below this counts as greedy (vLLM's _SAMPLING_EPS).
GREEDY_TEMPERATURE = 1e-5


def is_greedy(temperature: torch.Tensor) -> torch.Tensor:
    """[num_rows] bool: rows decoded greedily."""
    return temperature < GREEDY_TEMPERATURE


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
    greedy = is_greedy(temperature)
    temp = torch.where(greedy, torch.ones_like(temperature), temperature).to(torch.float32)
    scaled = logits / temp[:, None]

    if min_p is not None:
        # Keep tokens with prob >= min_p * max prob (vLLM's MinPLogitsProcessor).
        probs = scaled.softmax(dim=-1)
        threshold = probs.amax(dim=-1, keepdim=True) * min_p.to(torch.float32)[:, None]
        active = (~greedy & (min_p > 0))[:, None]
        scaled = scaled.masked_fill(active & (probs < threshold), float("-inf"))

    if top_k is not None or top_p is not None:
        # Sort ascending as vLLM's apply_top_k_top_p does, mask, then scatter back.
        sorted_logits, order = scaled.sort(dim=-1, descending=False)
        if top_k is not None:
            k = top_k.to(torch.int64)
            k_active = ~greedy & (k > 0) & (k < vocab_size)
            k_idx = (vocab_size - k.clamp(1, vocab_size))[:, None]
            kth = sorted_logits.gather(1, k_idx)
            sorted_logits = sorted_logits.masked_fill(k_active[:, None] & (sorted_logits < kth),
                                                      float("-inf"))
        if top_p is not None:
            p_active = ~greedy & (top_p < 1)
            cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
            drop = cum <= (1 - top_p.to(torch.float32))[:, None]
            drop[:, -1] = False  # the most likely token always survives
            sorted_logits = sorted_logits.masked_fill(p_active[:, None] & drop, float("-inf"))
        scaled = torch.empty_like(scaled).scatter_(1, order, sorted_logits)

    return scaled.log_softmax(dim=-1)
