"""Keep vLLM's log off the terminal: the demo's and the benchmarks' progress and tables go to the
terminal, everything vLLM and its kernels print goes to a log file."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path


@contextlib.contextmanager
def output_to(log: Path | None):
    """Yield a text stream on the terminal's stdout; while inside, everything else this process
    and its children write to file descriptors 1 and 2 (vLLM's logger, tqdm, C++ warnings)
    goes to ``log``, appended. ``log=None`` changes nothing."""
    if log is None:
        yield sys.stdout
        return
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    target = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    terminal = os.fdopen(os.dup(saved[0]), "w", buffering=1)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield terminal
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)
        terminal.close()


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log, for an error message."""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
