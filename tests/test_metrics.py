"""The policy's (W, γ) counts on their way to /metrics: running counts to increments, the
SchedulerStats field through vLLM's own engine-core serialisation, and the stat logger's
Prometheus counter. (The whole path through a real server: tests/test_serve.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_mtad.metrics import FIELD, METRIC, increments, parse

pytestmark = pytest.mark.unit


def test_running_counts_become_increments():
    assert increments({}, {"W4_g4": 3}) == {"W4_g4": 3}
    assert increments({"W4_g4": 3}, {"W4_g4": 5, "W1_g0": 2}) == {"W4_g4": 2, "W1_g0": 2}
    assert increments({"W4_g4": 5}, {"W4_g4": 5}) == {}
    # The drafter was rebuilt: its counts started from zero again; all of them are new.
    assert increments({"W4_g4": 50}, {"W4_g4": 2}) == {"W4_g4": 2}
    assert parse("W4_g2") == (4, 2) and parse("W12_g0") == (12, 0)
    with pytest.raises(ValueError, match="not a policy choice"):
        parse("W4g2")


def test_scheduler_stats_carry_the_counts_through_the_engine_core_encoding():
    """vLLM encodes EngineCoreOutputs with msgspec (fields only): without the field
    patch_metrics_stats adds, the counts set on a SchedulerStats are dropped on the way."""
    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.metrics.stats import SchedulerStats
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    from vllm_mtad import plugin

    plugin.register()
    stats = SchedulerStats(num_running_reqs=3)
    assert getattr(stats, FIELD) is None  # every SchedulerStats has it, None by default
    setattr(stats, FIELD, {"W4_g4": 7, "W1_g0": 2})
    encoder, decoder = MsgpackEncoder(), MsgpackDecoder(EngineCoreOutputs)
    back = decoder.decode(encoder.encode(EngineCoreOutputs(scheduler_stats=stats)))
    assert back.scheduler_stats.num_running_reqs == 3
    assert getattr(back.scheduler_stats, FIELD) == {"W4_g4": 7, "W1_g0": 2}
    plain = decoder.decode(encoder.encode(EngineCoreOutputs(scheduler_stats=SchedulerStats())))
    assert getattr(plain.scheduler_stats, FIELD) is None


def test_stat_logger_counts_each_step_once():
    from prometheus_client import REGISTRY
    from vllm.v1.metrics.stats import SchedulerStats

    from vllm_mtad import plugin
    from vllm_mtad.stat_logger import MTADStatLogger

    plugin.register()
    config = SimpleNamespace(model_config=SimpleNamespace(served_model_name="metrics-test"))
    logger = MTADStatLogger(config, engine_index=0)

    def value(width, tokens):
        return REGISTRY.get_sample_value(f"{METRIC}_total", {
            "model_name": "metrics-test", "engine": "0", "beam_width": str(width),
            "num_speculative_tokens": str(tokens)}) or 0.0

    before = value(4, 4), value(1, 0)

    def record(counts):
        stats = SchedulerStats()
        setattr(stats, FIELD, counts)
        logger.record(stats, None, engine_idx=0)

    record({"W4_g4": 3})
    record({"W4_g4": 3})  # the same running counts again (a later step's stats): no change
    record({"W4_g4": 5, "W1_g0": 4})
    logger.record(None, None, engine_idx=0)  # a step without scheduler stats
    logger.record(SchedulerStats(), None, engine_idx=0)  # an engine without MTAD
    assert (value(4, 4) - before[0], value(1, 0) - before[1]) == (5, 4)
