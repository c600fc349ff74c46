"""The ``vllm.stat_logger_plugins`` entry point: MTAD's policy counts on ``/metrics``.

vLLM's AsyncLLM (``vllm serve``) builds one per engine beside its own loggers; offline ``LLM``
engines load none. See :mod:`vllm_mtad.metrics` for how the counts get here.
"""

from __future__ import annotations

from vllm.v1.metrics.loggers import StatLoggerBase

from vllm_mtad.metrics import FIELD, counter, increments, parse


class MTADStatLogger(StatLoggerBase):
    """Per engine (vLLM wraps it for data parallelism): the policy's counts, as a Prometheus
    counter. Does nothing for engines without MTAD (their stats carry no counts)."""

    def __init__(self, vllm_config, engine_index: int = 0):
        self.model_name = vllm_config.model_config.served_model_name
        self.last: dict[str, int] = {}

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
        counts = getattr(scheduler_stats, FIELD, None) if scheduler_stats is not None else None
        if not counts:
            return
        gained = increments(self.last, counts)
        self.last = dict(counts)
        if not gained:
            return
        metric = counter()
        for key, n in gained.items():
            width, tokens = parse(key)
            metric.labels(self.model_name, str(engine_idx), str(width), str(tokens)).inc(n)

    def log_engine_initialized(self):
        pass
