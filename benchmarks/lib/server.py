"""A vLLM OpenAI server in a subprocess, for benchmarks.soak: its command line
(``serve_command``), a free port, the server held for a block (``running_server``, a
``Server``) and its /metrics read (``read_metrics``). They are devtools.server's (shared with
the tests' system tier), named here so that a program imports only benchmarks.lib and the
package (tests/test_benchmarks_shape.py).
"""

from __future__ import annotations

from devtools.server import (Server, free_port, read_metrics, running_server,  # noqa: F401
                             serve_command)
