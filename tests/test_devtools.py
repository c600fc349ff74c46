"""The development tools' engine helpers."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_release_memory_hands_the_heaps_free_pages_back():
    """What the policy grid relies on between its sets of engines: memory freed inside the C
    heap goes back to the system, not only to the heap."""
    import ctypes

    from devtools.engine import release_memory

    if not hasattr(ctypes.CDLL(None), "malloc_trim"):
        pytest.skip("the C library has no malloc_trim (not glibc)")

    def rss_mb() -> float:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024

    # Chunks below malloc's mmap threshold come from the heap; keeping every 16th pins it, so
    # freeing the others leaves ~240 MB free inside the heap, which free() does not return.
    chunks = [bytearray(64 << 10) for _ in range(4096)]
    kept = chunks[::16]
    del chunks
    before = rss_mb()
    release_memory()
    after = rss_mb()
    assert len(kept) == 256
    assert before - after > 150, (before, after)
