"""vllm-mtad: Multi-Token Assisted Decoding (arXiv 2407.09722) for vLLM.

What a serving process needs, and only that: the plugin entry point (:mod:`vllm_mtad.plugin`),
the configuration (:mod:`vllm_mtad.config`), the algorithm in :mod:`vllm_mtad.core` (plain
PyTorch, no vLLM import), the vLLM glue (proposer, sampler, beam KV layout, draft-only blocks)
and the patches (``vllm_mtad.patches``, from the repository's ``patches/``). The oracle and the
developer tools live outside the package, in the repository's ``devtools/``; the design in
``docs/``.
"""

from vllm_mtad.config import MTADConfig
from vllm_mtad.version import __version__

__all__ = ["MTADConfig", "__version__"]
