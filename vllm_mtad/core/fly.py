"""FLy's acceptance rule, as a comparison baseline for MTAD (not a setting of the plugin).

Reference: "Training-Free Loosely Speculative Decoding" (FLy), arXiv 2511.22972, and its form in
vLLM 0.33 (``"rejection_sample_method": "fly"``; docs/features/speculative_decoding/fly.md).
Written here from those descriptions. Terms, for one request with draft x_1..x_n (n ≤ γ):

- native[i]: whether standard speculative decoding accepts x_i on its own: for a greedy draft
  with target-only acceptance, x_i equals the target's argmax at i; for a probabilistic draft,
  p̃(x_i) / q̃(x_i) ≥ u_i with u_i ~ U(0, 1) (the standard p/q test).
- entropy[i]: the target's entropy over its ``entropy_top_k`` (3) largest processed
  probabilities at i, −Σ p log p over those tokens only (not renormalised).
- deferred[i]: a native rejection FLy overrides: native[i] is false, x_i is a real draft token
  the target does not rule out (p̃(x_i) > 0; with a probabilistic draft also q̃(x_i) > 0),
  entropy[i] ≥ ``entropy_threshold`` (0.3: the target is uncertain there, not confidently
  disagreeing), the window fits in the draft (i + W < n, W = ``window`` positions after i)
  and the next W draft tokens are all accepted natively.
- accepted length k = the number of leading positions with native[i] or deferred[i].
- extra token (as in standard speculative decoding): after k < n, the target's argmax at k+1
  (greedy) or a sample of the residual max(p̃ − q̃, 0) (probabilistic); after k = n, the bonus.

Defaults: window = min(6, γ − 1) (FLy needs γ ≥ 2), entropy_top_k = 3, threshold 0.3 nats.
FLy is lossy like MTAD: its output does not follow the target's distribution.
"""

from __future__ import annotations

import torch

DEFAULT_ENTROPY_THRESHOLD = 0.3
DEFAULT_ENTROPY_TOP_K = 3


def default_window(num_speculative_tokens: int) -> int:
    """FLy's default window: min(6, γ − 1); FLy needs γ ≥ 2."""
    if num_speculative_tokens < 2:
        raise ValueError(f"FLy needs num_speculative_tokens >= 2, got {num_speculative_tokens}")
    return min(6, num_speculative_tokens - 1)


def top_k_entropy(target_logprobs: torch.Tensor, top_k: int = DEFAULT_ENTROPY_TOP_K
                  ) -> torch.Tensor:
    """FLy's entropy gate: −Σ p log p over the ``top_k`` most likely tokens of each row.

    Args:
        target_logprobs: [..., V] float, the target's processed log-probabilities (-inf: ruled
            out).
    Returns:
        [...] float32.
    """
    assert top_k > 0, f"top_k must be positive, got {top_k}"
    lp = target_logprobs.to(torch.float32).topk(min(top_k, target_logprobs.shape[-1]),
                                                dim=-1).values
    p = lp.exp()
    return -torch.where(p > 0, p * lp, torch.zeros_like(p)).sum(dim=-1)


def fly_accepted_lengths(native: torch.Tensor, deferrable: torch.Tensor,
                         entropy: torch.Tensor, num_drafts: torch.Tensor, window: int,
                         entropy_threshold: float = DEFAULT_ENTROPY_THRESHOLD) -> torch.Tensor:
    """How many leading draft tokens FLy accepts per row.

    Legend: B rows, γ draft positions, W = ``window``.

    Args:
        native: [B, γ] bool, standard speculative decoding's own decision at each position.
        deferrable: [B, γ] bool, positions FLy may override: a real draft token the target
            does not rule out (see the module docstring).
        entropy: [B, γ] float, :func:`top_k_entropy` of the target at each position.
        num_drafts: [B] int, each row's draft length n (positions past it are ignored).
        window: W ≥ 0, the native acceptances a deferral needs after it.
        entropy_threshold: the entropy from which a rejection may be deferred.
    Returns:
        [B] int64, k in 0..n.
    """
    assert native.shape == deferrable.shape == entropy.shape and native.ndim == 2, (
        f"native, deferrable and entropy must be [B, γ], got {tuple(native.shape)}, "
        f"{tuple(deferrable.shape)}, {tuple(entropy.shape)}")
    assert window >= 0, f"window must be >= 0, got {window}"
    B, G = native.shape
    pos = torch.arange(G, device=native.device)
    n = num_drafts.to(torch.int64)[:, None]
    inside = pos[None, :] < n  # [B, γ]
    native = native & inside
    # Native acceptance of the W positions after each one: [B, γ] (padding counts as
    # rejected, so a window that leaves the draft never holds; i + W < n is required anyway).
    padded = torch.cat([native, native.new_zeros(B, window)], dim=1)
    ahead = torch.ones_like(native)
    for offset in range(1, window + 1):
        ahead &= padded[:, offset:offset + G]
    deferred = (~native & deferrable & inside & (pos[None, :] + window < n)
                & (entropy >= entropy_threshold) & ahead)
    accepted = (native | deferred).to(torch.int64)
    return accepted.cumprod(dim=1).sum(dim=1)  # leading accepted positions


def fly_accept_greedy(draft_token_ids: torch.Tensor, target, entropy: torch.Tensor,
                      num_drafts: torch.Tensor, bonus_token_ids: torch.Tensor, window: int,
                      entropy_threshold: float = DEFAULT_ENTROPY_THRESHOLD):
    """FLy with a greedy draft and target-only acceptance (its T=0 form), in vLLM's output
    format: a draft token is accepted natively where it is the target's argmax; a native
    rejection is deferred as :func:`fly_accepted_lengths` says; after k accepted tokens comes
    the target's argmax at k (k < n) or the bonus token (k = n).

    Args:
        draft_token_ids: [B, γ] int, -1 = invalid (past the row's own draft).
        target: a :class:`vllm_mtad.core.acceptance.TargetView` (greedy rows: plain
            log-softmax answers).
        entropy: [B, γ] float, :func:`top_k_entropy` of the target at each draft position.
        num_drafts: [B] int, n; bonus_token_ids: [B] int, the token after a whole draft.
        window: the native acceptances a deferral needs after it.
    Returns:
        AcceptanceResult (prefix_accepted: min(k, g) per prefix length g, which is what a
        draft of g tokens gets accepted under this rule only where no deferral is involved).
    """
    from vllm_mtad.core.acceptance import AcceptanceResult, assemble_output, extra_tokens_from
    from vllm_mtad.core.noise import NoiseKeys

    B, gamma = draft_token_ids.shape
    valid = draft_token_ids >= 0
    target_lp, target_argmax = target.at_drafts(draft_token_ids)
    native = valid & (draft_token_ids.to(torch.int64) == target_argmax)
    deferrable = valid & (target_lp > float("-inf"))
    k = fly_accepted_lengths(native, deferrable, entropy, num_drafts, window, entropy_threshold)
    # The target's argmax at k, as MTAD's greedy rows draw it (no row is sampled: no noise).
    none = torch.zeros(B, dtype=torch.int64, device=k.device)
    extra = extra_tokens_from(target.candidates_at(k.clamp(max=gamma - 1)),
                              NoiseKeys(none == 0, none, none, any_sampled=False))
    extra = torch.where(k >= num_drafts.to(torch.int64), bonus_token_ids.to(extra.dtype), extra)
    lengths = torch.arange(1, gamma + 1, device=k.device)
    return AcceptanceResult(output_token_ids=assemble_output(draft_token_ids, k, extra),
                            num_accepted=k, prefix_accepted=torch.minimum(k[:, None], lengths))
