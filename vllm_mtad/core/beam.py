"""Beam drafting for MTAD: greedy beam search and beam *sampling* (Gumbel-top-W), batched.

Legend (inside function bodies): B = rows (requests), W = beams per row, V = vocabulary size,
t = draft steps taken so far.

One step extends every live beam by one token. Candidates are all (beam b, token v) pairs, with
joint score ``scores[b] + draft_logprobs[b, v]`` (the cumulative log-probability of the extended
sequence under the draft). A greedy row keeps the W best candidates (beam search); a sampled row
draws W distinct candidates without replacement with probability proportional to
exp(joint score), via Gumbel-top-W over the flattened [W·V] candidates (arXiv 2407.09722 §3;
Kool et al., 2019). Step 1 is the same with a single root beam of score 0.

A candidate with score -inf (the draft's processed distribution gives it no mass) is never
chosen while a finite one is left; when fewer than W finite candidates exist, the surplus beams
are *dead* (score -inf), carry a placeholder token, and are never chosen later.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_mtad.core import noise


@dataclass
class BeamState:
    """The W beams of every row after some draft steps."""

    # [B, W] float32: cumulative draft log-probability of each beam; -inf marks a dead beam.
    scores: torch.Tensor
    # [B, W, t] int64: each beam's draft tokens so far.
    tokens: torch.Tensor
    # [B, W, t] float32: log q̃(token | context, beam's earlier tokens) per draft token.
    token_logprobs: torch.Tensor
    # [B, W] int64: index of each beam's parent in the previous step (all 0 after step 1).
    parents: torch.Tensor

    @property
    def num_steps(self) -> int:
        return self.tokens.shape[-1]

    def last_tokens(self) -> torch.Tensor:
        """[B, W] int64: the token each beam feeds to the next draft forward."""
        return self.tokens[:, :, -1]


@dataclass(frozen=True)
class StepCandidates:
    """The candidates of one beam step, sparse: only the K tokens per input beam that can be
    chosen (:func:`vllm_mtad.core.processing.draft_candidates`)."""

    # [B, W_in, K] float: log q̃ of each candidate.
    logprobs: torch.Tensor
    # [B, W_in, K] int64: the token id of each candidate.
    token_ids: torch.Tensor
    # V: the noise of candidate (beam b, token v) is keyed by the index b·V + v, so sparse and
    # dense steps draw the same noise.
    vocab_size: int


def beam_step(
    candidates: torch.Tensor | StepCandidates,
    state: BeamState | None,
    beam_width: int,
    keys: noise.NoiseKeys,
    step: int,
    row_beam_width: torch.Tensor | None = None,
) -> BeamState:
    """Extend the beams of every row by one token.

    Args:
        candidates: [B, W_in, K] float, log q̃(v | context, beam) of each input beam's
            candidate tokens; processed (temperature/top-k/top-p/min-p) for sampled rows, plain
            log-softmax for greedy rows. Dense (a tensor): K = V, candidate v is token v.
            Sparse (:class:`StepCandidates`): every token left out has probability 0, or, for
            greedy rows, cannot be among the W best. W_in = 1 at step 1 (``state is None``),
            else ``state``'s W.
        state: the beams after the previous step, or None at step 1.
        beam_width: W, beams kept per row.
        keys: per row, greedy (beam search instead of beam sampling), seed, and the sequence
            position of the first draft token (noise keys).
        step: 1-based draft step (noise key).
        row_beam_width: [B] int64 or None; beams at index >= this are killed for that row
            (a request without KV room for W beams drafts with one).
    Returns:
        The new BeamState, W beams per row, sorted by selection order (for greedy rows, by
        descending score).
    """
    sparse = isinstance(candidates, StepCandidates)
    draft_logprobs = candidates.logprobs if sparse else candidates
    token_ids = candidates.token_ids if sparse else None
    assert draft_logprobs.ndim == 3, f"draft_logprobs must be [B, W_in, K], got {tuple(draft_logprobs.shape)}"
    B, W_in, K = draft_logprobs.shape
    assert (state is None) == (step == 1), "state must be None exactly at step 1"
    assert state is None or state.scores.shape == (B, W_in)
    assert keys.greedy.shape == keys.seeds.shape == keys.positions.shape == (B,)
    assert token_ids is None or token_ids.shape == draft_logprobs.shape
    V = candidates.vocab_size if sparse else K

    prev_scores = (torch.zeros(B, 1, device=draft_logprobs.device) if state is None
                   else state.scores)
    # [B, W_in * K]: joint log-probability of every (beam, candidate) pair.
    cand = (prev_scores[:, :, None] + draft_logprobs.to(torch.float32)).reshape(B, W_in * K)

    perturbed = _perturbed(cand, keys, step, token_ids, V)
    chosen, new_scores = _select(perturbed, cand, beam_width, row_beam_width)
    parents = chosen // K  # [B, W]
    if token_ids is None:
        tokens = chosen % K  # [B, W]
    else:
        tokens = token_ids.reshape(B, W_in * K).gather(1, chosen)
    token_lp = draft_logprobs.reshape(B, W_in * K).gather(1, chosen).to(torch.float32)

    hist_tokens, hist_lp = _extend_history(state, parents, tokens, token_lp)
    return BeamState(scores=new_scores, tokens=hist_tokens, token_logprobs=hist_lp,
                     parents=parents)


def _select(perturbed: torch.Tensor, cand: torch.Tensor, beam_width: int,
            row_beam_width: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, W] indices of the chosen candidates, best (perturbed) first, and their unperturbed
    joint scores; dead beams (-inf) past the candidates and past each row's beam width."""
    B = cand.shape[0]
    k = min(beam_width, cand.shape[1])
    _, chosen = perturbed.topk(k, dim=-1)
    new_scores = cand.gather(1, chosen)
    if k < beam_width:  # fewer candidates than beams: pad with dead beams.
        pad = beam_width - k
        chosen = torch.cat([chosen, chosen[:, :1].expand(B, pad)], dim=1)
        new_scores = torch.cat([new_scores, new_scores.new_full((B, pad), float("-inf"))], dim=1)
    if row_beam_width is not None:
        beam_idx = torch.arange(beam_width, device=chosen.device)
        new_scores = new_scores.masked_fill(beam_idx[None, :] >= row_beam_width[:, None],
                                            float("-inf"))
    return chosen, new_scores


def _perturbed(cand: torch.Tensor, keys: noise.NoiseKeys, step: int,
               token_ids: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """[B, W_in·K] joint scores, with Gumbel noise added on the sampled rows (keyed by seed,
    position, step and the candidate's index b·V + v)."""
    if not keys.sampled_any_host_sync():
        return cand
    B = cand.shape[0]
    row = noise.row_keys(keys.seeds, keys.positions, step, noise.STREAM_DRAFT)
    if token_ids is None:
        gumbel = noise.gumbel(row, cand.shape[1])
    else:
        W_in, K = token_ids.shape[1:]
        beam = torch.arange(W_in, device=token_ids.device, dtype=torch.int64)
        cols = (beam[None, :, None] * vocab_size + token_ids).reshape(B, W_in * K)
        gumbel = noise.gumbel_at(row, cols)
    return torch.where(~keys.greedy[:, None], cand + gumbel, cand)


def _extend_history(state: BeamState | None, parents: torch.Tensor, tokens: torch.Tensor,
                    token_lp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, W, t+1] tokens and log-probs: each new beam's parent's history, then its token."""
    if state is None:
        return tokens[:, :, None], token_lp[:, :, None]
    B, W = parents.shape
    idx = parents[:, :, None].expand(B, W, state.num_steps)
    hist_tokens = torch.cat([state.tokens.gather(1, idx), tokens[:, :, None]], dim=2)
    hist_lp = torch.cat([state.token_logprobs.gather(1, idx), token_lp[:, :, None]], dim=2)
    return hist_tokens, hist_lp


def keep_rows(new: BeamState, old: BeamState, frozen: torch.Tensor) -> BeamState:
    """``new`` (one step after ``old``) with the rows in ``frozen`` [B] bool left as they were
    in ``old``: a row whose context ends before this step drafts fewer steps. Its beams keep
    their scores and parents (themselves), and get a placeholder token (its last one, log-prob
    0) that the caller never verifies, so best_beam picks the beam a search of fewer steps would
    have picked."""
    B, W = old.scores.shape
    keep = frozen[:, None]
    last = old.tokens[:, :, -1:]
    tokens = torch.where(keep[:, :, None], torch.cat([old.tokens, last], dim=2), new.tokens)
    lp = torch.where(keep[:, :, None],
                     torch.cat([old.token_logprobs, torch.zeros_like(last, dtype=torch.float32)],
                               dim=2), new.token_logprobs)
    same = torch.arange(W, device=old.parents.device).expand(B, W)
    return BeamState(scores=torch.where(keep, old.scores, new.scores), tokens=tokens,
                     token_logprobs=lp, parents=torch.where(keep, same, new.parents))


def best_beam(state: BeamState) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft of every row: the beam with the highest score (ties: lowest index).

    Returns:
        draft_token_ids: [B, t] int64.
        draft_logprobs: [B, t] float32, log q̃ of each draft token along that beam.
    """
    best = state.scores.argmax(dim=1)  # first maximum
    idx = best[:, None, None].expand(-1, 1, state.num_steps)
    return state.tokens.gather(1, idx)[:, 0], state.token_logprobs.gather(1, idx)[:, 0]
