"""The MTAD algorithm in plain PyTorch: no vLLM import, batched, device-agnostic."""

from vllm_mtad.core.acceptance import (AcceptanceResult, accepted_lengths, assemble_output,
                                       extra_tokens, mtad_accept)
from vllm_mtad.core.beam import BeamState, beam_step, best_beam
from vllm_mtad.core.processing import is_greedy, processed_logprobs

__all__ = [
    "AcceptanceResult", "BeamState", "accepted_lengths", "assemble_output", "beam_step",
    "best_beam",
    "extra_tokens", "is_greedy", "mtad_accept", "processed_logprobs",
]
