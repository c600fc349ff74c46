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

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:
    from vllm_mtad.core.processing import Candidates

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


def residual(target: "Candidates", draft: "Candidates") -> "Candidates":
    """Standard speculative sampling's residual norm(max(p̃ − q̃, 0)) as candidates over the
    target's own (the residual is 0 wherever p̃ is); p̃ itself where p̃ ≤ q̃ everywhere.

    Args:
        target: [B, K] log p̃ (token ids, or None: dense, K = V).
        draft: [B, Kd] log q̃ at the same position (token ids, or None: dense).
    Returns:
        Candidates [B, K] with the target's token ids, log of the (unnormalised) residual.
    """
    from vllm_mtad.core.processing import Candidates

    p = target.logprobs.to(torch.float32).exp()
    q_probs = draft.logprobs.to(torch.float32).exp()
    if draft.token_ids is None:  # dense q̃: read it at the target's candidates
        q = q_probs if target.token_ids is None else q_probs.gather(1, target.token_ids)
    elif target.token_ids is None:  # sparse q̃ onto the dense target
        q = torch.zeros_like(p).scatter_add(1, draft.token_ids, q_probs)
    else:  # both sparse: q̃ of each target candidate (0 where the draft has none)
        hit = target.token_ids[:, :, None] == draft.token_ids[:, None, :]  # [B, K, Kd]
        q = torch.where(hit, q_probs[:, None, :], 0.0).sum(dim=2)
    r = (p - q).clamp(min=0)
    r = torch.where(r.sum(dim=1, keepdim=True) > 0, r, p)
    return Candidates(r.log(), target.token_ids, target.overflow)


@dataclass(frozen=True)
class FlyDraft:
    """What FLy reads of the draft: its tokens, and for sampled rows their log q̃ and q̃
    itself at any position (for the residual)."""

    token_ids: torch.Tensor  # [B, γ] int, -1 = invalid (past the row's own draft)
    logprobs: torch.Tensor | None = None  # [B, γ] float log q̃(x_i) (None: all rows greedy)
    # at(index [B] int64, 0-based, needed [B] bool) -> Candidates [B, Kd]: q̃ at that draft
    # position for each needed row; other rows (a request in its prefill step, with no draft,
    # or a greedy row) are never read and may hold anything.
    at: Callable[[torch.Tensor, torch.Tensor], "Candidates"] | None = None


@dataclass(frozen=True)
class FlyGate:
    """FLy's deferral settings: the native acceptances a deferral needs after it, and the
    entropy (nats, top-3) from which a rejection may be deferred."""

    window: int
    entropy_threshold: float = DEFAULT_ENTROPY_THRESHOLD


def fly_accept(draft: FlyDraft, target, entropy: torch.Tensor, bonus, gate: FlyGate, keys):
    """FLy's rule in vLLM's output format (see the module docstring), for a batch of greedy
    rows (greedy draft, target-only acceptance: native where the draft token is the target's
    argmax) and sampled rows (probabilistic draft: native where u_i ≤ p̃(x_i) / q̃(x_i)); a
    native rejection is deferred as :func:`fly_accepted_lengths` says; after k accepted tokens
    comes the target's argmax at k (greedy), a sample of the residual max(p̃ − q̃, 0) at k
    (sampled, k < n), or the bonus token (k = n).

    Args:
        draft: :class:`FlyDraft` (sampled rows need its log-probs and ``at``).
        target: a :class:`vllm_mtad.core.acceptance.TargetView` (greedy rows: plain
            log-softmax answers; sampled rows: processed).
        entropy: [B, γ] float, :func:`top_k_entropy` of the target at each draft position.
        bonus: :class:`vllm_mtad.core.acceptance.Bonus`: n per row, and the token after a
            whole draft.
        gate: :class:`FlyGate`.
        keys: NoiseKeys: greedy rows, seeds and the position of each row's first draft token
            (the uniforms u_i and the residual's sample are keyed by them).
    Returns:
        AcceptanceResult (prefix_accepted: min(k, g) per prefix length g, which is what a
        draft of g tokens gets accepted under this rule only where no deferral is involved).
    """
    from vllm_mtad.core import noise
    from vllm_mtad.core.acceptance import AcceptanceResult, assemble_output, extra_tokens_from

    draft_token_ids, draft_logprobs = draft.token_ids, draft.logprobs
    num_drafts = bonus.num_drafts.to(torch.int64)
    B, gamma = draft_token_ids.shape
    valid = draft_token_ids >= 0
    target_lp, target_argmax = target.at_drafts(draft_token_ids)
    native = draft_token_ids.to(torch.int64) == target_argmax
    deferrable = target_lp > float("-inf")
    sampled_any = keys.sampled_any_host_sync()
    if sampled_any:
        assert draft_logprobs is not None and draft.at is not None, (
            "sampled rows need their draft log-probs and q̃ (FlyDraft.logprobs, .at)")
        u = noise.uniform(noise.row_keys(keys.seeds, keys.positions, 0, noise.STREAM_FLY),
                          gamma)  # [B, γ] float64 in (0, 1)
        passes = u.log() <= (target_lp - draft_logprobs).to(torch.float64)
        greedy = keys.greedy[:, None]
        native = torch.where(greedy, native, passes)
        deferrable &= greedy | (draft_logprobs > float("-inf"))
    k = fly_accepted_lengths(valid & native, valid & deferrable, entropy, num_drafts,
                             gate.window, gate.entropy_threshold)
    at = k.clamp(max=gamma - 1)
    cands = target.candidates_at(at)
    if sampled_any:  # sampled rows whose draft token at k was rejected draw from the residual
        # there (not a row whose draft at k is no draft, -1: nothing was rejected, p̃ itself)
        rejected = ~keys.greedy & (k < num_drafts) & valid.gather(1, at[:, None])[:, 0]
        res = residual(cands, draft.at(at, rejected))
        cands = replace(cands, logprobs=torch.where(rejected[:, None], res.logprobs,
                                                    cands.logprobs))
    extra = extra_tokens_from(cands, keys.shifted(k))
    extra = torch.where(k >= num_drafts, bonus.token_ids.to(extra.dtype), extra)
    lengths = torch.arange(1, gamma + 1, device=k.device)
    return AcceptanceResult(output_token_ids=assemble_output(draft_token_ids, k, extra),
                            num_accepted=k, prefix_accepted=torch.minimum(k[:, None], lengths))


def fly_accept_greedy(draft_token_ids: torch.Tensor, target, entropy: torch.Tensor,
                      num_drafts: torch.Tensor, bonus_token_ids: torch.Tensor, window: int,
                      entropy_threshold: float = DEFAULT_ENTROPY_THRESHOLD):
    """:func:`fly_accept` for a batch of greedy rows only (FLy's T=0 form)."""
    from vllm_mtad.core.acceptance import Bonus
    from vllm_mtad.core.noise import NoiseKeys

    B = draft_token_ids.shape[0]
    none = torch.zeros(B, dtype=torch.int64, device=draft_token_ids.device)
    return fly_accept(FlyDraft(draft_token_ids), target, entropy,
                      Bonus(num_drafts, bonus_token_ids), FlyGate(window, entropy_threshold),
                      NoiseKeys(none == 0, none, none, any_sampled=False))
