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

import torch

from vllm_mtad.core import noise

PLACEHOLDER_TOKEN_ID = -1


@dataclass
class AcceptanceResult:
    # [B, γ+1] int32: accepted draft tokens, then the extra token, padded with -1.
    output_token_ids: torch.Tensor
    # [B] int64: k*, the number of accepted draft tokens.
    num_accepted: torch.Tensor


def accepted_lengths(
    draft_token_ids: torch.Tensor,
    draft_logprobs: torch.Tensor,
    target_logprobs: torch.Tensor,
    threshold: torch.Tensor,
    greedy_exact: torch.Tensor,
) -> torch.Tensor:
    """k* for every row.

    Args:
        draft_token_ids: [B, γ] int, -1 = invalid position (ends the chain).
        draft_logprobs: [B, γ] float, log q̃ of each draft token.
        target_logprobs: [B, γ+1, V] float, log p̃ at each position (only the first γ are read).
        threshold: [B] float, τ in (0, 1].
        greedy_exact: [B] bool, rows accepted by "draft token == target argmax" instead.
    Returns:
        [B] int64.
    """
    B, gamma = draft_token_ids.shape
    assert draft_logprobs.shape == (B, gamma)
    assert target_logprobs.ndim == 3 and target_logprobs.shape[:2] == (B, gamma + 1)
    assert threshold.shape == greedy_exact.shape == (B,)

    valid = draft_token_ids >= 0
    chain = valid.to(torch.int64).cumprod(dim=1).bool()  # [B, γ]: position inside the chain
    tok = draft_token_ids.clamp(min=0).to(torch.int64)[:, :, None]
    target_at_draft = target_logprobs[:, :gamma].gather(2, tok)[:, :, 0].to(torch.float32)

    # Joint rule. A non-finite draft log-prob cannot come from a real draft: treat as failing.
    ratio = target_at_draft - draft_logprobs.to(torch.float32)
    ratio = torch.where(chain & torch.isfinite(draft_logprobs), ratio,
                        torch.full_like(ratio, float("-inf")))
    cum = ratio.cumsum(dim=1)  # [B, γ]: S_1..S_γ; -inf sticks once reached
    passes = cum >= torch.log(threshold.to(torch.float32))[:, None]
    ks = torch.arange(1, gamma + 1, device=passes.device)
    joint_k = (passes.to(torch.int64) * ks).amax(dim=1)

    # Exact greedy rule: accept while draft == target argmax.
    match = chain & (target_logprobs[:, :gamma].argmax(dim=2) == draft_token_ids)
    exact_k = match.to(torch.int64).cumprod(dim=1).sum(dim=1)

    return torch.where(greedy_exact, exact_k, joint_k)


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
    B, _, V = target_logprobs.shape
    idx = num_accepted[:, None, None].expand(B, 1, V)
    logprobs = target_logprobs.gather(1, idx)[:, 0].to(torch.float32)  # [B, V]
    sampled = ~greedy
    if bool(sampled.any()):
        keys = noise.row_keys(seeds[sampled], positions[sampled] + num_accepted[sampled], 0,
                              noise.STREAM_EXTRA_TOKEN)
        logprobs = logprobs.clone()
        logprobs[sampled] = logprobs[sampled] + noise.gumbel(keys, V)  # Gumbel-max sampling
    return logprobs.argmax(dim=1)


def mtad_accept(
    draft_token_ids: torch.Tensor,
    draft_logprobs: torch.Tensor,
    target_logprobs: torch.Tensor,
    threshold: torch.Tensor,
    greedy: torch.Tensor,
    greedy_exact: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
) -> AcceptanceResult:
    """Apply MTAD's acceptance rule to a batch; see the module docstring for the terms.

    Args:
        draft_token_ids: [B, γ] int, -1 = invalid.
        draft_logprobs: [B, γ] float.
        target_logprobs: [B, γ+1, V] float; processed for sampled rows, plain log-softmax for
            greedy rows.
        threshold: [B] float, τ per row.
        greedy: [B] bool; greedy_exact: [B] bool ("exact" mode, read only for greedy rows).
        seeds, positions: [B] int64, noise keys for the extra token.
    """
    exact = greedy & greedy_exact
    k = accepted_lengths(draft_token_ids, draft_logprobs, target_logprobs, threshold, exact)
    extra = extra_tokens(target_logprobs, k, greedy, seeds, positions)
    return AcceptanceResult(output_token_ids=assemble_output(draft_token_ids, k, extra),
                            num_accepted=k)


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
