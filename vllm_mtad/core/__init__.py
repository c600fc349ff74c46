"""The MTAD algorithm in plain PyTorch: no vLLM import, batched, device-agnostic."""

from vllm_mtad.core.acceptance import (AcceptanceResult, Bonus, DenseTarget, TargetView,
                                       accepted_lengths, accepted_lengths_from, assemble_output,
                                       extra_tokens, extra_tokens_from, mtad_accept,
                                       prefix_accepted_lengths_from)
from vllm_mtad.core.beam import BeamState, StepCandidates, beam_step, best_beam, keep_rows
from vllm_mtad.core.noise import NoiseKeys
from vllm_mtad.core.processing import (CandidateSizing, Candidates, draft_candidates, is_greedy,
                                       mask_top_k_top_p, processed_logprobs, size_candidates)

__all__ = [
    "AcceptanceResult", "BeamState", "Bonus", "CandidateSizing", "Candidates", "DenseTarget",
    "NoiseKeys", "StepCandidates", "TargetView", "accepted_lengths", "accepted_lengths_from",
    "assemble_output", "beam_step", "best_beam", "draft_candidates", "extra_tokens",
    "extra_tokens_from", "is_greedy", "keep_rows", "mask_top_k_top_p", "mtad_accept",
    "prefix_accepted_lengths_from", "processed_logprobs", "size_candidates",
]
