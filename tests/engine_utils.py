"""The tests' preset for the real vLLM engine on the tiny pair (devtools.engine builds it)."""

from __future__ import annotations

from devtools.engine import (build_llm, close, counters_delta, mtad_spec,  # noqa: F401
                             spec_counters)  # (re-exported)

from devtools.tiny_models import TinyPairSpec

# Per-token KV bytes of the tiny pair: (4 target + 3 draft layers) x (K, V) x 2 KV heads x 32
# head dims x 4 bytes.
TINY_KV_BYTES_PER_TOKEN = TinyPairSpec().kv_bytes_per_token()


# In-process engines built in this test process (tests/conftest.py prints the count), and the
# tier of the test running (set by tests/conftest.py): unit tests build no engine.
BUILDS = {"engines": 0}
CURRENT_TIER = None


def make_llm(target_dir, speculative_config=None, kv_tokens=16384, **kwargs):
    """An engine on the tiny pair with room for ``kv_tokens`` tokens of KV."""
    assert CURRENT_TIER != "unit", "a unit test builds no engine: mark it engine (pytest.ini)"
    llm = build_llm(target_dir, speculative_config,
                    kv_cache_bytes=kv_tokens * TINY_KV_BYTES_PER_TOKEN, **kwargs)
    BUILDS["engines"] += 1
    return llm


def engine_config(target_dir, speculative_config=None, kv_tokens=16384, **kwargs):
    """The VllmConfig :func:`make_llm`'s engine would get, built as ``LLM()`` builds it before
    anything else (``EngineArgs.create_engine_config``): the plugin loads, the MTAD settings are
    translated and checked, vLLM checks its own; no model is loaded, no engine is built. What
    fails here fails the same way at the start of ``LLM()``."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    from devtools.engine import engine_kwargs

    args = EngineArgs(**engine_kwargs(target_dir, speculative_config,
                                      kv_cache_bytes=kv_tokens * TINY_KV_BYTES_PER_TOKEN, **kwargs))
    return args.create_engine_config(UsageContext.LLM_CLASS)


def token_prompts(prompts):
    from vllm.inputs import TokensPrompt

    return [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]


def generate_ids(llm, prompts, params):
    outs = llm.generate(token_prompts(prompts), params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


class SharedEngines:
    """The engines of one test module, built once for consecutive tests that ask for the same
    settings (the ``engines`` fixture in tests/conftest.py).

    ``get`` takes :func:`make_llm`'s arguments. At most one engine is alive: asking for other
    settings shuts the current one down first, so which engine a test gets never depends on the
    order the tests run in (only the number of builds does; a module orders its tests so that
    those sharing settings are adjacent). A reused engine has its prefix cache reset, so no test
    hits blocks an earlier test cached; vLLM's and the drafter's counters accumulate over the
    engine's life, so a test on a shared engine reads them as differences (:func:`counters_delta`,
    :func:`stats_delta`)."""

    def __init__(self):
        self.key = self.llm = None

    def get(self, target_dir, speculative_config=None, **kwargs):
        import json

        key = json.dumps([str(target_dir), speculative_config, kwargs], sort_keys=True,
                         default=str)
        if key == self.key:
            assert self.llm.reset_prefix_cache(), "a shared engine still holds requests"
            return self.llm
        self.close()
        self.llm = make_llm(target_dir, speculative_config, **kwargs)
        self.key = key
        return self.llm

    def close(self):
        if self.llm is not None:
            llm, self.llm, self.key = self.llm, None, None
            close(llm)


def stats_delta(after: dict, before: dict) -> dict:
    """The numeric drafter counters (vllm_mtad.worker_rpc.drafter_stats) gained between two
    readings; other entries as they are ``after``."""
    return {k: (v - before.get(k, 0) if isinstance(v, (int, float)) and not isinstance(v, bool)
                else v) for k, v in after.items()}
