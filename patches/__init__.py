"""Changes to vLLM's own behaviour, one file per patched vLLM module (see patches/README.md).

Installed as ``vllm_mtad.patches``. Nothing here patches at import time.
"""
