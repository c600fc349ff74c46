"""MTAD's own settings, validated on construction (no vLLM import)."""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import asdict, dataclass
from typing import Any

GREEDY_ACCEPTANCE_MODES = ("joint", "exact")
SPECULATION_POLICIES = ("fixed", "adaptive")


@dataclass(frozen=True)
class MTADConfig:
    """The settings MTAD adds to a draft-model speculative config.

    num_speculative_tokens: γ, draft tokens per step (>= 1).
    beam_width: W, beams per request in the draft (>= 1; 1 = ordinary ancestral sample/greedy).
    acceptance_threshold: τ in (0, 1]; the longest draft prefix with p̃/q̃ >= τ is accepted.
        Smaller accepts more (faster, further from the target); 1 accepts only prefixes the
        target likes at least as much as the draft does.
    greedy_acceptance: "joint" (MTAD's joint greedy approximation) or "exact" (lossless:
        identical to the target's own greedy decoding) for temperature-0 requests.
    speculation_policy: "adaptive" (the default: each step picks W in [min_beam_width,
        beam_width] and γ in [min_speculative_tokens, num_speculative_tokens] for the best
        expected tokens per second, from this engine's measured step costs and acceptance;
        vllm_mtad.policy) or "fixed" (every step drafts num_speculative_tokens with
        beam_width beams: a seeded request's output then does not depend on the load).
    min_beam_width: the fewest beams the adaptive policy may use (1..beam_width).
    min_speculative_tokens: the shortest draft the adaptive policy may choose
        (0..num_speculative_tokens). 0 lets it skip drafting in a step, when that is faster;
        such a step samples one token per request from the target alone. Set 1 to forbid it.
    beam_kv_fraction: the largest share of the KV cache memory that the beams' draft-only blocks
        (the private tails of beams 1..W-1, vllm_mtad.draft_scratch) may take, in (0, 1). The
        batch rows whose tails fit draft W beams; the rest draft one beam that step.
    """

    num_speculative_tokens: int
    beam_width: int = 4
    acceptance_threshold: float = 0.5
    greedy_acceptance: str = "joint"
    speculation_policy: str = "adaptive"
    min_beam_width: int = 1
    min_speculative_tokens: int = 0
    beam_kv_fraction: float = 0.1

    def __post_init__(self) -> None:
        _check_int("num_speculative_tokens", self.num_speculative_tokens, minimum=1)
        _check_int("beam_width", self.beam_width, minimum=1)
        check_threshold("acceptance_threshold", self.acceptance_threshold)
        check_greedy_acceptance("greedy_acceptance", self.greedy_acceptance)
        if self.speculation_policy not in SPECULATION_POLICIES:
            raise ValueError(f"MTAD setting 'speculation_policy' must be one of "
                             f"{list(SPECULATION_POLICIES)}, got {self.speculation_policy!r}.")
        _check_int("min_beam_width", self.min_beam_width, minimum=1, maximum=self.beam_width)
        _check_int("min_speculative_tokens", self.min_speculative_tokens, minimum=0,
                   maximum=self.num_speculative_tokens)
        f = self.beam_kv_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 < f < 1.0:
            raise ValueError(f"MTAD setting 'beam_kv_fraction' must be a number in (0, 1), got "
                             f"{f!r}: the largest share of the KV cache memory the beams' "
                             "draft-only blocks may take.")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_int(key: str, value: Any, minimum: int, maximum: int | None = None) -> None:
    if (isinstance(value, bool) or not isinstance(value, int) or value < minimum
            or (maximum is not None and value > maximum)):
        allowed = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"MTAD setting {key!r} must be an integer {allowed}, got {value!r}.")


def check_threshold(key: str, value: Any) -> float:
    """Return τ as a float if it lies in (0, 1], else raise naming ``key``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not 0.0 < float(value) <= 1.0:
        raise ValueError(f"MTAD setting {key!r} must be a number in (0, 1], got {value!r}. "
                         "Smaller values accept longer draft prefixes; 1 is the strictest.")
    return float(value)


def check_greedy_acceptance(key: str, value: Any) -> str:
    """Return the mode if it is one of GREEDY_ACCEPTANCE_MODES, else raise naming ``key``."""
    if value not in GREEDY_ACCEPTANCE_MODES:
        raise ValueError(f"MTAD setting {key!r} must be one of {list(GREEDY_ACCEPTANCE_MODES)}, "
                         f"got {value!r}.")
    return value


# --- The user-facing "mtad" speculative config, translated for vLLM ---------------------------

METHOD = "mtad"
# Key under VllmConfig.additional_config (pickled to every process, part of the compile hash).
ADDITIONAL_CONFIG_KEY = "mtad"
# MTAD's own keys in the speculative config; everything else goes to vLLM's draft-model config.
MTAD_KEYS = ("beam_width", "acceptance_threshold", "greedy_acceptance", "speculation_policy",
             "min_beam_width", "min_speculative_tokens", "beam_kv_fraction")
# Per-request overrides, read from SamplingParams.extra_args (OpenAI server: "vllm_xargs").
REQUEST_KEYS = ("acceptance_threshold", "greedy_acceptance", "speculation_policy")
# vLLM's verification settings: MTAD has its own acceptance (acceptance_threshold,
# greedy_acceptance), so these are refused naming the key. rejection_sample_method picks vLLM's
# rule (0.32: standard, synthetic, block; 0.33 adds "fly", FLy's lossy verification) and
# synthetic_* tune one; 0.33's FLy settings are fly_window_size, fly_entropy_threshold,
# fly_entropy_top_k (refused by prefix, so a later fly_* key is too). Without this, vLLM 0.32
# rejects a fly_* key with a pydantic "Unexpected keyword argument" that does not mention MTAD,
# and vLLM 0.33 accepts it without rejection_sample_method="fly" and ignores it silently.
VERIFICATION_KEYS = ("rejection_sample_method", "synthetic_acceptance_rates",
                     "synthetic_acceptance_length")
VERIFICATION_KEY_PREFIXES = ("fly_",)
# vLLM's drafting settings that MTAD's beam drafting replaces.
DRAFTING_KEYS = ("draft_sample_method", "parallel_drafting", "use_heterogeneous_vocab")


def check_foreign_keys(spec: dict[str, Any]) -> None:
    """Refuse, naming the key, vLLM speculative-config keys that MTAD replaces."""
    for key in spec:
        if key in VERIFICATION_KEYS or key.startswith(VERIFICATION_KEY_PREFIXES):
            what = ("FLy's lossy verification" if key.startswith("fly_")
                    or spec.get("rejection_sample_method") == "fly"
                    else "vLLM's rejection sampling")
            raise ValueError(
                f"speculative config key {key!r} does not apply to method 'mtad': MTAD has its "
                f"own acceptance (the joint-likelihood rule, set by 'acceptance_threshold' and "
                f"'greedy_acceptance'), so {what} is not used. Remove {key!r}; to accept more "
                "of each draft, lower 'acceptance_threshold'.")
        if key in DRAFTING_KEYS:
            raise ValueError(f"speculative config key {key!r} does not apply to method 'mtad' "
                             "(MTAD drafts by beam search/sampling and accepts by its own "
                             "rule); remove it.")


def translate_speculative_config(
    speculative_config: dict[str, Any], additional_config: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Turn ``{"method": "mtad", "model": DRAFT, ...}`` into vLLM's draft-model form.

    Returns (speculative_config for vLLM, additional_config with the validated MTAD settings).
    Raises ValueError naming the key for bad settings. Pure dict work: no vLLM import.
    """
    spec = {k.replace("-", "_"): v for k, v in speculative_config.items()}
    if spec.get("method") != METHOD:
        raise ValueError(f"not an MTAD config: method={spec.get('method')!r}")
    if not spec.get("model"):
        raise ValueError("MTAD setting 'model' is required: the path or name of the draft model "
                         "(same tokenizer and vocabulary as the target).")
    gamma = spec.get("num_speculative_tokens")
    if gamma is None:
        raise ValueError("MTAD setting 'num_speculative_tokens' is required: the draft length γ, "
                         "an integer >= 1.")
    mtad_kwargs = {k: spec.pop(k) for k in MTAD_KEYS if k in spec}
    cfg = MTADConfig(num_speculative_tokens=gamma, **mtad_kwargs)
    check_foreign_keys(spec)
    spec["method"] = "draft_model"
    additional = dict(additional_config or {})
    additional[ADDITIONAL_CONFIG_KEY] = cfg.to_dict()
    return spec, additional


# vLLM's shorthand flags for speculative-config keys (EngineArgs / LLM(): spec_method, ...).
SPEC_FLAGS = (("--spec-method", "method", "spec_method"), ("--spec-model", "model", "spec_model"),
              ("--spec-tokens", "num_speculative_tokens", "spec_tokens"))


def fold_spec_flags(speculative_config: dict[str, Any] | None,
                    flags: dict[str, Any]) -> dict[str, Any]:
    """``--spec-method mtad --spec-model D --spec-tokens N`` as one speculative-config dict.

    ``flags`` maps each SPEC_FLAGS attribute (spec_method, ...) to its value or None. vLLM folds
    the flags into the dict itself, but only after the MTAD translation must have run; the same
    rule as vLLM's: a flag and the same key in --speculative-config are mutually exclusive.
    """
    spec = dict(speculative_config or {})
    for flag, key, attr in SPEC_FLAGS:
        value = flags.get(attr)
        if value is None:
            continue
        if key in spec:
            raise ValueError(f"{flag} and --speculative-config['{key}'] are mutually exclusive")
        spec[key] = value
    return spec


# What to run instead of a refused parallel layout (check_parallel's messages).
_PARALLEL_INSTEAD = ("Use tensor parallelism (--tensor-parallel-size) or one MTAD engine per "
                     "replica (python -m vllm_mtad.ray_batch runs one per Ray actor; or one "
                     "vllm-mtad serve per replica behind a load balancer).")


def check_parallel(parallel_config: Any) -> None:
    """Refuse, naming the key, every parallel layout MTAD has not run under; tensor parallelism
    is the one that has (tests/test_e2e_tp.py). Refused, for any beam_width (W = 1 included):

    - decode/prefill context parallelism > 1: the beam KV layout and the beam steps' attention
      metadata assume each rank holds every token of a request (no per-rank lengths).
    - data parallelism > 1 on a mixture-of-experts target: vLLM syncs every forward across the
      DP ranks (DPEngineCoreProc, dummy batches on idle ranks), while each rank decides its own
      W and γ (the adaptive policy's plan is broadcast over the TP group only) and so runs its
      own number of draft forwards.
    - data parallelism > 1 on a dense target: vLLM 0.32 runs each DP rank as an independent
      engine (EngineCoreProc after ParallelConfig.reconfigure_for_independent_dp_rank), but
      that path has never run with MTAD; one engine per replica is the same thing, tested.
    - pipeline parallelism > 1: vLLM puts the whole draft model on the last stage only, so the
      draft-only KV blocks and the beam steps would exist on one stage of several; never run.
    """
    for key in ("decode_context_parallel_size", "prefill_context_parallel_size"):
        size = getattr(parallel_config, key, 1)
        if size > 1:
            raise ValueError(
                f"MTAD does not support {key}={size}: the beam steps assume each rank holds "
                f"every token of a request. Allowed: {key}=1. {_PARALLEL_INSTEAD}")
    dp = getattr(parallel_config, "data_parallel_size", 1)
    if dp > 1 and getattr(parallel_config, "is_moe_model", None):
        raise ValueError(
            f"MTAD does not support data_parallel_size={dp} with a mixture-of-experts target: "
            "vLLM syncs every forward of an MoE model across the data-parallel ranks, and each "
            "rank runs its own number of beam steps (its own W and γ per step). Allowed: "
            f"data_parallel_size=1 (--data-parallel-size 1). {_PARALLEL_INSTEAD}")
    if dp > 1:
        raise ValueError(
            f"MTAD does not support data_parallel_size={dp} (--data-parallel-size): MTAD has not "
            "run under vLLM's data parallelism (for a dense target vLLM runs each data-parallel "
            "rank as an independent engine; that path is untested with MTAD, for any "
            f"beam_width). Allowed: data_parallel_size=1. {_PARALLEL_INSTEAD}")
    pp = getattr(parallel_config, "pipeline_parallel_size", 1)
    if pp > 1:
        raise ValueError(
            f"MTAD does not support pipeline_parallel_size={pp} (--pipeline-parallel-size): vLLM "
            "places the whole draft model on the last pipeline stage, and MTAD's beam steps and "
            "draft-only KV blocks have not run split across stages. Allowed: "
            f"pipeline_parallel_size=1. {_PARALLEL_INSTEAD}")


def check_executor(parallel_config: Any, platform_name: str, ray_device_key: str) -> None:
    """Refuse vLLM's Ray executor on a platform that declares no Ray device (vLLM 0.32's CPU
    platform: ``Platform.ray_device_key`` is empty), before vLLM fails on it later with
    "current platform cpu does not support ray" (vllm/v1/executor/ray_utils.py), naming what
    spans machines there instead."""
    if getattr(parallel_config, "distributed_executor_backend", None) == "ray" \
            and not ray_device_key:
        raise ValueError(
            f"MTAD cannot run with distributed_executor_backend='ray' "
            f"(--distributed-executor-backend ray) on vLLM's {platform_name} platform: it "
            "declares no Ray device (Platform.ray_device_key is empty), and vLLM's Ray executor "
            f"refuses it (vllm/v1/executor/ray_utils.py: \"current platform {platform_name} "
            "does not support ray.\"). Across machines use vLLM's multiprocessing executor: "
            "--nnodes N --node-rank R --master-addr NODE0 --master-port P on every node, "
            "--headless on all but node 0 (docs/usage.md#across-nodes); or one MTAD engine per "
            "Ray actor (python -m vllm_mtad.ray_batch).")


def from_additional_config(additional_config: Any) -> MTADConfig | None:
    """The engine's MTADConfig, or None for an engine that does not use MTAD."""
    if not isinstance(additional_config, dict) or ADDITIONAL_CONFIG_KEY not in additional_config:
        return None
    return MTADConfig(**additional_config[ADDITIONAL_CONFIG_KEY])


def check_request_keys(extra_args: dict[str, Any]) -> None:
    """Refuse MTAD keys a request cannot set and near-misses of the ones it can.

    extra_args is shared with vLLM (kv_transfer_params, ...) and with custom logits processors,
    so other keys pass: only engine-wide MTAD keys and likely typos of MTAD's per-request keys
    (difflib ratio >= 0.8, e.g. 'acceptnce_threshold') are errors.
    """
    allowed = ", ".join(repr(k) for k in REQUEST_KEYS)
    for key in extra_args:
        if key in REQUEST_KEYS:
            continue
        if key in MTAD_KEYS or key == "num_speculative_tokens":
            raise ValueError(f"MTAD setting {key!r} is engine-wide and cannot be set per request "
                             f"(set it in the speculative config); keys a request can set: "
                             f"{allowed}.")
        close = difflib.get_close_matches(str(key), REQUEST_KEYS, n=1, cutoff=0.8)
        if close:
            raise ValueError(f"unknown MTAD request key {key!r} (did you mean {close[0]!r}?); "
                             f"keys a request can set: {allowed}.")


def request_settings(extra_args: dict[str, Any] | None, default: MTADConfig
                     ) -> tuple[float, str, bool]:
    """(τ, greedy mode, fixed) for one request: its extra_args overrides, else the engine's
    settings. ``fixed``: the request asked for ``speculation_policy: "fixed"`` in an adaptive
    engine (every step it is in drafts the configured W and γ); a fixed engine's requests are
    fixed already, and cannot ask for "adaptive" (that engine measures no costs).

    Raises ValueError naming the key for a bad override (the front end turns it into a 400).
    """
    extra_args = extra_args or {}
    check_request_keys(extra_args)
    tau = default.acceptance_threshold
    mode = default.greedy_acceptance
    if "acceptance_threshold" in extra_args:
        tau = check_threshold("acceptance_threshold", extra_args["acceptance_threshold"])
    if "greedy_acceptance" in extra_args:
        mode = check_greedy_acceptance("greedy_acceptance", extra_args["greedy_acceptance"])
    policy = extra_args.get("speculation_policy", default.speculation_policy)
    if policy not in SPECULATION_POLICIES:
        raise ValueError(f"MTAD setting 'speculation_policy' must be one of "
                         f"{list(SPECULATION_POLICIES)}, got {policy!r}.")
    if policy == "adaptive" and default.speculation_policy == "fixed":
        raise ValueError("MTAD setting 'speculation_policy' 'adaptive' needs an engine started "
                         "with \"speculation_policy\": \"adaptive\" (this one drafts the "
                         "configured W and γ every step); a request can only ask for 'fixed'.")
    return tau, mode, policy == "fixed" and default.speculation_policy == "adaptive"


def _looks_local(name: str) -> bool:
    return (os.path.isabs(name) or name.startswith((".", "~")) or os.path.exists(name))


def check_draft_model(draft: str, target: str | None) -> None:
    """Refuse, naming the 'model' key, a draft that cannot work: a local path that does not
    exist or holds no readable config.json, or a draft whose tokenizer maps tokens to other ids
    than the target's (MTAD compares the two models' probabilities of the same token ids).
    Hub names (not local paths) are left to vLLM."""
    draft = str(draft)
    if not _looks_local(draft):
        return
    path = os.path.expanduser(draft)
    if os.path.isfile(path):
        return  # a single-file model (GGUF): vLLM reads it
    if not os.path.isdir(path):
        raise ValueError(
            f"MTAD setting 'model': the draft model directory {draft!r} does not exist. Give the "
            "path of a local Hugging Face model directory (config.json and weights) or a model "
            "name on the Hugging Face Hub.")
    config_file = os.path.join(path, "config.json")
    if not os.path.exists(config_file) and os.path.exists(os.path.join(path, "params.json")):
        return  # Mistral format: vLLM reads it
    try:
        with open(config_file) as fh:
            json.load(fh)
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"MTAD setting 'model': cannot read the draft's {config_file} "
            f"({type(exc).__name__}: {exc}). The draft must be a Hugging Face model directory "
            "with a readable config.json.") from exc
    if target and os.path.isdir(os.path.expanduser(str(target))):
        _check_same_tokenizer(path, os.path.expanduser(str(target)))


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def _base_vocab(tokenizer) -> dict[str, int]:
    """The tokenizer's vocabulary without added tokens (all of it for slow tokenizers)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend.get_vocab(with_added_tokens=False)
    return tokenizer.get_vocab()


def _check_same_tokenizer(draft: str, target: str) -> None:
    if not any(os.path.exists(os.path.join(draft, f)) for f in _TOKENIZER_FILES):
        return  # no tokenizer of its own: vLLM uses the target's
    from transformers import AutoTokenizer

    try:
        vocab_d = _base_vocab(AutoTokenizer.from_pretrained(draft))
        vocab_t = _base_vocab(AutoTokenizer.from_pretrained(target))
    except Exception:  # noqa: BLE001 — an unloadable tokenizer is vLLM's to report
        return
    # Regular tokens only: added/special tokens may be named differently in a family (e.g.
    # reserved special tokens) while every regular token keeps its id.
    differ = [tok for tok, i in vocab_t.items() if tok in vocab_d and vocab_d[tok] != i]
    differ += [tok for tok in vocab_d if tok not in vocab_t]
    if differ:
        raise ValueError(
            f"MTAD setting 'model': the draft's tokenizer differs from the target's "
            f"({len(differ)} of {len(vocab_t)} tokens have other ids or are missing, e.g. "
            f"{differ[:3]!r}). MTAD compares the two models' probabilities of the same token "
            "ids, so the draft must use the target's tokenizer.")


def check_context_fits(gamma: int, max_model_len: int, draft_max_model_len: int | None) -> None:
    """Refuse, naming the keys, a γ no request can draft, and a draft whose context is shorter
    than the engine's: MTAD drafts up to the end of the engine's context (vLLM would stop
    drafting for every request of a batch that holds a longer one, and past its positions a
    draft's rotary tables end)."""
    if gamma + 1 >= max_model_len:
        raise ValueError(
            f"MTAD setting 'num_speculative_tokens'={gamma} cannot fit max_model_len="
            f"{max_model_len}: a round needs γ draft slots past at least one prompt token and "
            f"the target's extra token. Allowed: num_speculative_tokens <= {max_model_len - 2}; "
            "or raise --max-model-len.")
    if draft_max_model_len is not None and draft_max_model_len < max_model_len:
        raise ValueError(
            f"MTAD setting 'model': the draft's context ({draft_max_model_len} tokens: its "
            f"max_position_embeddings, or the speculative config's max_model_len) is shorter "
            f"than the engine's max_model_len ({max_model_len}); MTAD drafts up to the end of "
            f"the engine's context. Set --max-model-len {draft_max_model_len} or lower, or use a "
            "draft with a longer context.")
