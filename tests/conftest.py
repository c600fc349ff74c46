from __future__ import annotations

import os

import pytest

# vLLM in-process (no engine-core/worker subprocesses) and one thread: ~3 s per engine instead
# of ~17 s (docs/vllm-quirks.md#start-up-speed-on-a-small-cpu-machine). Tests that need the
# real multi-process layout (the server, TP) start their own processes.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")

# The tiers (pytest.ini): what a test needs to run. Every test has exactly one; `slow` is an
# extra marker on a test of any tier that keeps it out of the default run.
TIERS = ("unit", "engine", "system")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Fail the collection (before -m selects anything) if a test has no tier or several."""
    bad = []
    for item in items:
        tiers = sorted({m.name for m in item.iter_markers() if m.name in TIERS})
        if len(tiers) != 1:
            bad.append(f"{item.nodeid}: {', '.join(tiers) or 'no tier'}")
    if bad:
        raise pytest.UsageError(
            "every test needs exactly one tier marker (" + ", ".join(TIERS) + "; see pytest.ini"
            "), usually as the module's pytestmark:\n  " + "\n  ".join(bad))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under pytest-xdist, a test marked ``alone`` runs with no other test running: every test
    (its fixtures' setup and teardown included) holds a shared lock, an ``alone`` one the
    exclusive lock; a gate taken first stops new tests from starting while an ``alone`` one
    waits, so it is not starved. The soak is a load test: beside another worker's engines it
    measured a different machine, and in two of about six parallel runs (never in the serial
    runs before) one request gave two different outputs alone, which 2,800 replays here outside
    pytest did not reproduce (benchmarks/soak.py now reports such a request's runs in full)."""
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if uid is None:  # one process: nothing runs beside the test
        yield
        return
    import fcntl
    import tempfile

    base = os.path.join(tempfile.gettempdir(), f"mtad-tests-{uid}")
    alone = item.get_closest_marker("alone") is not None
    with open(base + ".gate", "a") as gate, open(base + ".lock", "a") as lock:
        if alone:
            fcntl.flock(gate, fcntl.LOCK_EX)  # no test starts from now on ...
            fcntl.flock(lock, fcntl.LOCK_EX)  # ... and the running ones end
        else:
            fcntl.flock(gate, fcntl.LOCK_SH)  # waits while an ``alone`` test waits or runs
            fcntl.flock(lock, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


def pytest_runtest_setup(item):
    from tests import engine_utils

    engine_utils.CURRENT_TIER = next(m.name for m in item.iter_markers() if m.name in TIERS)


def pytest_sessionfinish(session):
    """An xdist worker hands its engine count to the controller (pytest_testnodedown)."""
    from tests import engine_utils

    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["engines_built"] = engine_utils.BUILDS["engines"]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    from tests import engine_utils

    engine_utils.BUILDS["engines"] += getattr(node, "workeroutput", {}).get("engines_built", 0)


def pytest_terminal_summary(terminalreporter):
    from tests import engine_utils

    terminalreporter.write_line(f"in-process vLLM engines built: {engine_utils.BUILDS['engines']}")


@pytest.fixture(scope="session")
def tiny_pair_dirs(tmp_path_factory):
    """(target_dir, draft_dir) of a tiny random Llama pair built for this test session."""
    from devtools.tiny_models import build_tiny_pair

    return build_tiny_pair(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def tiny_pair(tiny_pair_dirs):
    """The tiny pair loaded as (target, draft) transformers models."""
    from devtools.tiny_models import load_pair

    return load_pair(*tiny_pair_dirs)


@pytest.fixture(scope="module")
def engines():
    """The module's shared engines (tests.engine_utils.SharedEngines): ``engines.get(target,
    spec, **make_llm_kwargs)``, shut down when the module's tests are done."""
    from tests.engine_utils import SharedEngines

    shared = SharedEngines()
    yield shared
    shared.close()
