"""vllm-mtad: Multi-Token Assisted Decoding (arXiv 2407.09722) for vLLM.

The algorithm lives in :mod:`vllm_mtad.core` (plain PyTorch, no vLLM import); an independent
reference implementation over ``transformers`` models in :mod:`vllm_mtad.reference`.
"""

from vllm_mtad.config import MTADConfig
from vllm_mtad.version import __version__

__all__ = ["MTADConfig", "__version__"]
