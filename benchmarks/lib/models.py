"""The model pairs a program runs on: the command-line model arguments (``add_model_args``:
``--tiny``, or ``--target`` with ``--draft``; ``resolve_pair``: else the real pair), the grid
syntax of the sweeps (``grid_parser``, ``parse_grid``, ``number_list``) and the tiny pairs
built locally (``build_tiny_pair``, ``TinyPairSpec``). They are devtools' (devtools/models.py,
devtools/tiny_models.py, shared with the tests), named here so that a program imports only
benchmarks.lib and the package (tests/test_benchmarks_shape.py).
"""

from __future__ import annotations

from devtools.models import (add_model_args, grid_parser, number_list,  # noqa: F401
                             parse_grid, resolve_pair)
from devtools.tiny_models import TinyPairSpec, build_tiny_pair  # noqa: F401
