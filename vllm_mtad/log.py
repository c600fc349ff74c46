"""Loggers for the vLLM glue: vLLM's own ``init_logger``, named under vLLM's logger tree
(``vllm.mtad.*``) so that vLLM's handlers, format and VLLM_LOGGING_LEVEL apply to them."""

from __future__ import annotations


def get_logger(module_name: str):
    from vllm.logger import init_logger

    return init_logger("vllm.mtad." + module_name.removeprefix("vllm_mtad."))
