"""MTAD's acceptance rule: the longest draft prefix whose joint likelihood ratio passes τ.

Reference: Qin et al., "Optimized Multi-Token Joint Decoding with Auxiliary Model for LLM
Inference", ICLR 2025, arXiv 2407.09722. Terms, for one request with draft x_1..x_γ:

- draft_logprobs[i] = log q̃(x_i | c, x_<i): the draft model's processed probability of each
  draft token along the chosen beam.
- target_logprobs[i] = log p̃(· | c, x_<i) for i = 0..γ: the target's processed distribution at
  each draft position and one past the last (the bonus position).
- S_k = Σ_{i<=k} (log p̃(x_i) − log q̃(x_i)): the joint log-likelihood ratio of the first k tokens.
- accepted length k* = the *largest* k in 1..γ with S_k >= log τ (0 if none). A later k may pass
  after an earlier one failed. p̃(x_i) = 0 makes S_k = -inf from k = i on. A draft position
  marked -1 (invalid, e.g. grammar-rejected) ends the chain there.
- extra token: one token drawn from p̃ at position k*+1 (the target's own processed
  distribution, *not* the residual max(p − q, 0) of standard speculative sampling); the argmax
  for greedy rows. When k* = γ it is the usual bonus token.
- output: x_1..x_{k*}, then the extra token, padded with -1 to γ+1 (vLLM's format).

Greedy rows: in "joint" mode the rule above runs on unprocessed softmaxes (the caller passes
plain log-softmaxes); in "exact" mode a draft token is accepted while it equals the target's
argmax, which reproduces the target's own greedy decoding.

MTAD is lossy by design for sampled and greedy-"joint" rows: the output is not distributed as
the target's own samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from vllm_mtad.core import noise
from vllm_mtad.core.processing import Candidates

PLACEHOLDER_TOKEN_ID = -1


@dataclass
class AcceptanceResult:
    # [B, γ+1] int32: accepted draft tokens, then the extra token, padded with -1.
    output_token_ids: torch.Tensor
    # [B] int64: k*, the number of accepted draft tokens.
    num_accepted: torch.Tensor
    # [B, γ] int64: column g-1 holds k* of the draft's first g tokens alone (what a draft of
    # length g would have had accepted); the last column is num_accepted. For the speculation
    # policy's acceptance statistics (vllm_mtad.policy.stats.AcceptanceStats).
    prefix_accepted: torch.Tensor | None = None


class TargetView(Protocol):
    """What the rule reads of the target, without asking for a [B, γ+1, V] tensor: the
    vLLM sampler answers from its flat logits rows, tests from a dense tensor
    (:class:`DenseTarget`)."""

    def at_drafts(self, draft_token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """draft_token_ids: [B, γ] int (-1 = invalid; any answer is ignored there).
        Returns log p̃ of each draft token [B, γ] float32 (unprocessed for greedy rows) and
        the target's argmax at each draft position [B, γ] int64."""

    def candidates_at(self, index: torch.Tensor) -> Candidates:
        """index: [B] int64 in 0..γ. The target's processed distribution at that position of
        each row (k*+1, 1-based), as candidates whose left-out tokens have probability 0."""


class DenseTarget:
    """:class:`TargetView` over target_logprobs: [B, γ+1, V] float, log p̃ at every position
    (processed for sampled rows, plain log-softmax for greedy rows)."""

    def __init__(self, target_logprobs: torch.Tensor):
        assert target_logprobs.ndim == 3, f"target_logprobs must be [B, γ+1, V], got {tuple(target_logprobs.shape)}"
        self.logprobs = target_logprobs

    def at_drafts(self, draft_token_ids):
        gamma = draft_token_ids.shape[1]
        rows = self.logprobs[:, :gamma]
        tok = draft_token_ids.clamp(min=0).to(torch.int64)[:, :, None]
        return rows.gather(2, tok)[:, :, 0].to(torch.float32), rows.argmax(dim=2)

    def candidates_at(self, index):
        B, _, V = self.logprobs.shape
        rows = self.logprobs.gather(1, index[:, None, None].expand(B, 1, V))[:, 0]
        return Candidates(rows.to(torch.float32), None,
                          torch.zeros(B, dtype=torch.bool, device=rows.device))


def accepted_lengths_from(
    draft_token_ids: torch.Tensor,
    draft_logprobs: torch.Tensor,
    target_draft_logprobs: torch.Tensor,
    target_argmax: torch.Tensor,
    threshold: torch.Tensor,
    greedy_exact: torch.Tensor,
) -> torch.Tensor:
    """k* for every row: the rule itself ([B] int64; the arguments are
    :func:`prefix_accepted_lengths_from`'s)."""
    return prefix_accepted_lengths_from(draft_token_ids, draft_logprobs, target_draft_logprobs,
                                        target_argmax, threshold, greedy_exact)[:, -1]


def prefix_accepted_lengths_from(
    draft_token_ids: torch.Tensor,
    draft_logprobs: torch.Tensor,
    target_draft_logprobs: torch.Tensor,
    target_argmax: torch.Tensor,
    threshold: torch.Tensor,
    greedy_exact: torch.Tensor,
) -> torch.Tensor:
    """k* of every prefix of every row's draft: column g-1 is the rule applied to the first g
    draft tokens alone, the last column is the row's k*.

    Why every prefix: k* is the *largest* passing k, so a draft's first g tokens can be
    accepted in a longer draft (S_k passes at some k > g after S_g failed) and not in a draft
    of length g. How many tokens a draft of length g gets accepted is therefore not "min(k*,
    g)" of longer drafts, and a policy choosing the draft length must count each length's own
    (docs/policy-decisions.md#acceptance-per-length).

    Args:
        draft_token_ids: [B, γ] int, -1 = invalid position (ends the chain).
        draft_logprobs: [B, γ] float, log q̃ of each draft token.
        target_draft_logprobs: [B, γ] float, log p̃ of each draft token.
        target_argmax: [B, γ] int, the target's most likely token at each draft position.
        threshold: [B] float, τ in (0, 1].
        greedy_exact: [B] bool, rows accepted by "draft token == target argmax" instead.
    Returns:
        [B, γ] int64.
    """
    B, gamma = draft_token_ids.shape
    assert draft_logprobs.shape == target_draft_logprobs.shape == target_argmax.shape == (B, gamma)
    assert threshold.shape == greedy_exact.shape == (B,)

    valid = draft_token_ids >= 0
    chain = valid.to(torch.int64).cumprod(dim=1).bool()  # [B, γ]: position inside the chain

    # Joint rule. A non-finite draft log-prob cannot come from a real draft: treat as failing.
    ratio = target_draft_logprobs.to(torch.float32) - draft_logprobs.to(torch.float32)
    ratio = torch.where(chain & torch.isfinite(draft_logprobs), ratio,
                        torch.full_like(ratio, float("-inf")))
    cum = ratio.cumsum(dim=1)  # [B, γ]: S_1..S_γ; -inf sticks once reached
    passes = cum >= torch.log(threshold.to(torch.float32))[:, None]
    ks = torch.arange(1, gamma + 1, device=passes.device)
    joint_k = torch.cummax(passes.to(torch.int64) * ks, dim=1).values  # largest passing k <= g

    # Exact greedy rule: accept while draft == target argmax (min(k*, g) for a prefix of g).
    match = chain & (target_argmax == draft_token_ids)
    exact_k = match.to(torch.int64).cumprod(dim=1).cumsum(dim=1)

    return torch.where(greedy_exact[:, None], exact_k, joint_k)


def accepted_lengths(
    draft_token_ids: torch.Tensor,
    draft_logprobs: torch.Tensor,
    target_logprobs: torch.Tensor,
    threshold: torch.Tensor,
    greedy_exact: torch.Tensor,
) -> torch.Tensor:
    """:func:`accepted_lengths_from` on a dense target_logprobs [B, γ+1, V] (only the first γ
    positions are read). Returns [B] int64."""
    B, gamma = draft_token_ids.shape
    assert target_logprobs.ndim == 3 and target_logprobs.shape[:2] == (B, gamma + 1)
    lp, argmax = DenseTarget(target_logprobs).at_drafts(draft_token_ids)
    return accepted_lengths_from(draft_token_ids, draft_logprobs, lp, argmax, threshold,
                                 greedy_exact)


def extra_tokens_from(candidates: Candidates, keys: noise.NoiseKeys) -> torch.Tensor:
    """One token per row from the given distribution: Gumbel-max sampling keyed by (seed,
    position) for sampled rows, the argmax (first, i.e. lowest id, among ties) for greedy rows.

    Args:
        candidates: [B, K] processed log-probs (and ids unless dense, K = V); noise of token v
            is keyed by column v, so sparse and dense draw the same sample.
        keys: per row, greedy, seed, and the sequence position of the token drawn.
    Returns:
        [B] int64.
    """
    logprobs = candidates.logprobs.to(torch.float32)
    B, K = logprobs.shape
    if keys.sampled_any_host_sync():
        row = noise.row_keys(keys.seeds, keys.positions, 0, noise.STREAM_EXTRA_TOKEN)
        gumbel = (noise.gumbel(row, K) if candidates.token_ids is None
                  else noise.gumbel_at(row, candidates.token_ids))
        logprobs = torch.where(~keys.greedy[:, None], logprobs + gumbel, logprobs)  # Gumbel-max
    best = logprobs.argmax(dim=1)
    if candidates.token_ids is None:
        return best
    return candidates.token_ids.gather(1, best[:, None])[:, 0]


def extra_tokens(
    target_logprobs: torch.Tensor,
    num_accepted: torch.Tensor,
    greedy: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """The token after the accepted prefix: a sample from p̃ at position k*+1 (argmax if greedy).

    Args:
        target_logprobs: [B, γ+1, V] float.
        num_accepted: [B] int64, k*.
        greedy: [B] bool.
        seeds, positions: [B] int64, noise keys; positions is the sequence position of the
            first draft token, so the extra token sits at positions + k*.
    Returns:
        [B] int64.
    """
    cands = DenseTarget(target_logprobs).candidates_at(num_accepted)
    return extra_tokens_from(cands, noise.NoiseKeys(greedy, seeds, positions + num_accepted))


@dataclass(frozen=True)
class Bonus:
    """vLLM's bonus token per row, for rows whose whole draft is accepted."""

    num_drafts: torch.Tensor  # [B] int: each row's own draft length
    token_ids: torch.Tensor  # [B] int: the bonus token, sampled by vLLM's own sampler


def mtad_accept(
    draft_token_ids: torch.Tensor,
    draft_logprobs: torch.Tensor,
    target: torch.Tensor | TargetView,
    threshold: torch.Tensor,
    greedy_exact: torch.Tensor,
    keys: noise.NoiseKeys,
    bonus: Bonus | None = None,
) -> AcceptanceResult:
    """Apply MTAD's acceptance rule to a batch; see the module docstring for the terms. This
    is the one function both the tests' oracles and vLLM's sampler run.

    Args:
        draft_token_ids: [B, γ] int, -1 = invalid.
        draft_logprobs: [B, γ] float.
        target: [B, γ+1, V] float log p̃ (processed for sampled rows, plain log-softmax for
            greedy rows), or a :class:`TargetView` giving the same answers.
        threshold: [B] float, τ per row.
        greedy_exact: [B] bool ("exact" mode, read only for greedy rows).
        keys: per row, greedy, seed, and the sequence position of the first draft token
            (noise keys of the extra token).
        bonus: with it, a row whose whole draft is accepted (k* >= num_drafts) takes vLLM's
            bonus token, and the target is never asked about position γ+1.
    """
    if isinstance(target, torch.Tensor):
        target = DenseTarget(target)
    gamma = draft_token_ids.shape[1]
    exact = keys.greedy & greedy_exact
    target_lp, target_argmax = target.at_drafts(draft_token_ids)
    prefix_k = prefix_accepted_lengths_from(draft_token_ids, draft_logprobs, target_lp,
                                            target_argmax, threshold, exact)
    k = prefix_k[:, -1]
    at = k if bonus is None else k.clamp(max=gamma - 1)
    extra = extra_tokens_from(target.candidates_at(at), keys.shifted(at))
    if bonus is not None:
        extra = torch.where(k >= bonus.num_drafts, bonus.token_ids.to(extra.dtype), extra)
    return AcceptanceResult(output_token_ids=assemble_output(draft_token_ids, k, extra),
                            num_accepted=k, prefix_accepted=prefix_k)


def assemble_output(draft_token_ids: torch.Tensor, num_accepted: torch.Tensor,
                    extra: torch.Tensor) -> torch.Tensor:
    """vLLM's output format: the k* accepted drafts, then the extra token, padded with -1.

    Args:
        draft_token_ids: [B, γ] int; num_accepted: [B] int64 (k*); extra: [B] int.
    Returns:
        [B, γ+1] int32.
    """
    B, gamma = draft_token_ids.shape
    cols = torch.arange(gamma, device=num_accepted.device)[None, :]
    out = torch.full((B, gamma + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32,
                     device=draft_token_ids.device)
    out[:, :gamma] = torch.where(cols < num_accepted[:, None], draft_token_ids.to(torch.int32),
                                 out[:, :gamma])
    out.scatter_(1, num_accepted[:, None], extra[:, None].to(torch.int32))
    return out
