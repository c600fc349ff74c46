"""Shared test helpers: toy language models, brute-force oracles and the statistics used to
compare empirical frequencies with exact probabilities."""

from __future__ import annotations

import itertools
import math
import zlib

import torch

from vllm_mtad.core import NoiseKeys, beam_step, best_beam, processed_logprobs


class ToyLM:
    """A deterministic toy LM: next-token logits are a fixed random function of the prefix."""

    def __init__(self, vocab_size: int, seed: int = 0, scale: float = 2.0):
        self.vocab_size, self.seed, self.scale = vocab_size, seed, scale

    def logits(self, prefix: list[int]) -> torch.Tensor:
        key = zlib.crc32(bytes(str((self.seed, tuple(prefix))), "ascii"))
        gen = torch.Generator().manual_seed(key)
        return self.scale * torch.randn(self.vocab_size, generator=gen)

    def logprob(self, prefix: list[int], token: int) -> float:
        return float(self.logits(prefix).log_softmax(-1)[token])


def core_draft(lm: ToyLM, contexts: list[list[int]], gamma: int, beam_width: int,
               temperature: list[float], seeds: list[int], positions: list[int] | None = None,
               top_k: list[int] | None = None, top_p: list[float] | None = None,
               step_fn=beam_step):
    """Drive vllm_mtad.core's beam steps over a ToyLM for a batch of contexts.

    Returns (draft_token_ids [B, γ], draft_logprobs [B, γ], final BeamState)."""
    B = len(contexts)
    temp = torch.tensor(temperature, dtype=torch.float32)
    tk = None if top_k is None else torch.tensor(top_k)
    tp = None if top_p is None else torch.tensor(top_p, dtype=torch.float32)
    greedy = temp < 1e-5
    seeds_t = torch.tensor(seeds, dtype=torch.int64)
    pos_t = torch.tensor(positions if positions is not None else [len(c) for c in contexts])
    keys = NoiseKeys(greedy, seeds_t, pos_t)
    state = None
    for step in range(1, gamma + 1):
        W_in = 1 if state is None else beam_width
        rows = []
        for b in range(B):
            for w in range(W_in):
                suffix = [] if state is None else state.tokens[b, w].tolist()
                rows.append(lm.logits(contexts[b] + suffix))
        logits = torch.stack(rows)  # [B * W_in, V]
        rep = lambda t: None if t is None else t.repeat_interleave(W_in)  # noqa: E731
        lp = processed_logprobs(logits, rep(temp), rep(tk), rep(tp)).reshape(B, W_in, -1)
        state = step_fn(lp, state, beam_width, keys, step)
    tokens, lps = best_beam(state)
    return tokens, lps, state


def brute_force_best(lm: ToyLM, context: list[int], gamma: int) -> tuple[list[int], float]:
    """The highest joint log-probability sequence of length γ, by enumerating all V^γ."""
    best, best_score = None, -math.inf
    for seq in itertools.product(range(lm.vocab_size), repeat=gamma):
        score = sum(lm.logprob(context + list(seq[:i]), seq[i]) for i in range(gamma))
        if score > best_score:
            best, best_score = list(seq), score
    return best, best_score


def ordered_draw_probability(weights: list[float], order: tuple[int, ...]) -> float:
    """P(drawing exactly ``order``) when drawing without replacement proportional to weights."""
    total, p = sum(weights), 1.0
    for i in order:
        p *= weights[i] / total
        total -= weights[i]
    return p


def set_draw_probabilities(weights: list[float], n: int) -> dict[frozenset, float]:
    """P(the set of n items drawn without replacement) for every n-subset with positive mass."""
    live = [i for i, w in enumerate(weights) if w > 0]
    n = min(n, len(live))
    probs: dict[frozenset, float] = {}
    for order in itertools.permutations(live, n):
        key = frozenset(order)
        probs[key] = probs.get(key, 0.0) + ordered_draw_probability(weights, order)
    return probs


def chi_square_pvalue(counts: dict, probs: dict, total: int) -> float:
    """Pearson chi-square goodness-of-fit p-value; outcomes outside ``probs`` give 0.

    Bins with expected count < 5 are pooled into one bin (the usual validity rule)."""
    if any(k not in probs for k in counts):
        return 0.0
    stat, dof = 0.0, -1
    pooled_obs = pooled_exp = 0.0
    for k, p in probs.items():
        exp, obs = p * total, counts.get(k, 0)
        if exp < 5:
            pooled_obs, pooled_exp = pooled_obs + obs, pooled_exp + exp
            continue
        stat += (obs - exp) ** 2 / exp
        dof += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        dof += 1
    return chi2_sf(stat, max(dof, 1))


def chi2_sf(x: float, k: int) -> float:
    """Survival function of the chi-square distribution (regularised upper gamma Q(k/2, x/2))."""
    a, z = k / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    if z < a + 1:  # series for P, then Q = 1 - P
        term = total = 1.0 / a
        n = a
        for _ in range(10_000):
            n += 1
            term *= z / n
            total += term
            if term < total * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(-z + a * math.log(z) - math.lgamma(a)))
    # continued fraction for Q (Lentz)
    b, c, d = z + 1 - a, 1e300, 1.0 / (z + 1 - a)
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return math.exp(-z + a * math.log(z) - math.lgamma(a)) * h
