"""An independent reference implementation of MTAD over Hugging Face ``transformers`` models.

Written for clarity, not speed: batch 1, no KV cache (every forward recomputes the whole
sequence), beams as Python lists, sampling without replacement done literally (draw one
candidate, remove it, renormalise, repeat), with its own ``torch.Generator``. It shares no beam
or acceptance code with :mod:`vllm_mtad.core`, so the two can check each other; it does share
:func:`vllm_mtad.core.processing.processed_logprobs` (the definition of the request's processed
distribution, tested on its own).

It follows docs/algorithm.md exactly, with vLLM's framing: the first output token comes from the
prompt's prefill (target only); MTAD steps start from prompt + that token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from vllm_mtad.config import MTADConfig
from vllm_mtad.core.processing import GREEDY_TEMPERATURE, processed_logprobs


@dataclass(frozen=True)
class Sampling:
    """The request's sampling parameters; temperature 0 means greedy."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE


@dataclass
class ReferenceOutput:
    token_ids: list[int]  # generated tokens, the prefill token first
    accepted_per_step: list[int] = field(default_factory=list)  # k* of every MTAD step
    drafts: list[list[int]] = field(default_factory=list)  # the draft of every MTAD step

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted/drafts, the bonus/extra token included."""
        steps = len(self.accepted_per_step)
        return 1 + sum(self.accepted_per_step) / steps if steps else float("nan")


def _process(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """[n, V] logits -> the request's processed log-probs (the same parameters on every row)."""
    n = logits.shape[0]
    return processed_logprobs(
        logits, torch.full((n,), sampling.temperature), torch.full((n,), sampling.top_k),
        torch.full((n,), sampling.top_p), torch.full((n,), sampling.min_p))


def _next_logprobs(model, sequences: list[list[int]], sampling: Sampling) -> torch.Tensor:
    """[len(sequences), V]: processed next-token log-probs after each (equal-length) sequence."""
    with torch.no_grad():
        logits = model(torch.tensor(sequences)).logits[:, -1].float()
    return _process(logits, sampling)


def _draw_without_replacement(weights: list[float], n: int, gen: torch.Generator) -> list[int]:
    """Indices of n draws without replacement, each proportional to the remaining weights."""
    w = torch.tensor(weights, dtype=torch.float64)
    picks = []
    for _ in range(min(n, int((w > 0).sum()))):
        i = int(torch.multinomial(w / w.sum(), 1, generator=gen))
        picks.append(i)
        w[i] = 0.0
    return picks


def draft_block(draft, context: list[int], cfg: MTADConfig, sampling: Sampling,
                gen: torch.Generator, steps: int | None = None) -> tuple[list[int], list[float]]:
    """Beam search (greedy) or beam sampling over ``steps`` (default γ) steps; returns the best
    beam's tokens and its per-token draft log-probs."""
    # A beam: (score = cumulative log q̃, tokens, per-token log q̃).
    beams: list[tuple[float, list[int], list[float]]] = [(0.0, [], [])]
    for _ in range(cfg.num_speculative_tokens if steps is None else steps):
        lp = _next_logprobs(draft, [context + b[1] for b in beams], sampling).tolist()
        candidates = []  # (joint score, beam index, token), in (beam, token) order
        for b, (score, _, _) in enumerate(beams):
            for v, token_lp in enumerate(lp[b]):
                if token_lp > -math.inf:
                    candidates.append((score + token_lp, b, v))
        if sampling.greedy:
            # Stable sort: equal scores keep (beam, token) order.
            chosen = sorted(range(len(candidates)), key=lambda i: -candidates[i][0])
            chosen = chosen[:cfg.beam_width]
        else:
            top = max(c[0] for c in candidates)
            weights = [math.exp(c[0] - top) for c in candidates]
            chosen = _draw_without_replacement(weights, cfg.beam_width, gen)
        beams = [(candidates[i][0], beams[candidates[i][1]][1] + [candidates[i][2]],
                  beams[candidates[i][1]][2] + [lp[candidates[i][1]][candidates[i][2]]])
                 for i in chosen]
    best = max(range(len(beams)), key=lambda i: (beams[i][0], -i))  # ties: lowest index
    return beams[best][1], beams[best][2]


def _pick(logprobs: torch.Tensor, sampling: Sampling, gen: torch.Generator) -> int:
    if sampling.greedy:
        return int(logprobs.argmax())
    return int(torch.multinomial(logprobs.double().exp(), 1, generator=gen))


def generate(target, draft, prompt: list[int], max_new_tokens: int, cfg: MTADConfig,
             sampling: Sampling = Sampling(), seed: int = 0, threshold: float | None = None,
             eos_token_id: int | None = None, max_len: int | None = None) -> ReferenceOutput:
    """Generate up to ``max_new_tokens`` tokens after ``prompt`` with MTAD.

    Args:
        target, draft: causal LMs called as ``model(input_ids).logits``.
        threshold: τ for this request; defaults to ``cfg.acceptance_threshold``.
        max_len: the context limit (vLLM's max_model_len), or None. A round whose context has
            L tokens drafts min(γ, max_len - L - 1) tokens (a beam search of that many steps),
            so that the accepted tokens and the extra one fit; generation stops at max_len.
    """
    gen = torch.Generator().manual_seed(seed)
    tau = cfg.acceptance_threshold if threshold is None else threshold
    exact = sampling.greedy and cfg.greedy_acceptance == "exact"

    first = _pick(_next_logprobs(target, [prompt], sampling)[0], sampling, gen)
    out = ReferenceOutput(token_ids=[first])
    limit = max_new_tokens if max_len is None else min(max_new_tokens, max_len - len(prompt))
    while len(out.token_ids) < limit and out.token_ids[-1] != eos_token_id:
        context = prompt + out.token_ids
        steps = None if max_len is None else min(cfg.num_speculative_tokens,
                                                 max_len - len(context) - 1)
        tokens, draft_lps = draft_block(draft, context, cfg, sampling, gen, steps)
        # Target distributions at every draft position and one past the last: [γ+1, V].
        with torch.no_grad():
            logits = target(torch.tensor([context + tokens])).logits[0, len(context) - 1:].float()
        target_lp = _process(logits, sampling)

        accepted = 0
        if exact:
            while accepted < len(tokens) and tokens[accepted] == int(target_lp[accepted].argmax()):
                accepted += 1
        else:
            ratio = 0.0
            for k in range(1, len(tokens) + 1):
                ratio += float(target_lp[k - 1, tokens[k - 1]]) - draft_lps[k - 1]
                if ratio >= math.log(tau):
                    accepted = k  # the largest passing k wins
        extra = _pick(target_lp[accepted], sampling, gen)
        out.drafts.append(tokens)
        out.accepted_per_step.append(accepted)
        for tok in tokens[:accepted] + [extra]:
            if len(out.token_ids) < limit and out.token_ids[-1] != eos_token_id:
                out.token_ids.append(tok)
    return out


def greedy_decode(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Plain greedy decoding, one full forward per token."""
    seq = list(prompt)
    for _ in range(max_new_tokens):
        with torch.no_grad():
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt):]
