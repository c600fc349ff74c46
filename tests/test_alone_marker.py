"""The ``alone`` marker (tests/conftest.py): under pytest-xdist, a test marked ``alone`` runs
while no other test runs, and no test starts until it ends. Checked on two probe files run by a
pytest of their own with two workers (one file per worker, as ``--dist loadfile`` gives them):
each probe test logs when it starts and ends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent

PROBE = '''
import os, time
import pytest

pytestmark = pytest.mark.unit


def log(name, start):
    with open(os.environ["ALONE_PROBE_LOG"], "a") as fh:
        fh.write(f"{name} {start} {time.time()}\\n")
'''

ALONE = PROBE + '''

@pytest.mark.alone
def test_alone():
    time.sleep(0.4)  # the other file's first test has started by now
    start = time.time()
    time.sleep(1.5)
    log("alone", start)
'''

OTHERS = PROBE + "".join(f'''

def test_other_{i}():
    start = time.time()
    time.sleep(0.5)
    log("other{i}", start)
''' for i in range(6))


def test_alone_test_runs_with_no_other_test(tmp_path):
    pytest.importorskip("xdist")
    (tmp_path / "test_probe_a.py").write_text(ALONE)
    (tmp_path / "test_probe_b.py").write_text(OTHERS)
    log = tmp_path / "log.txt"
    env = dict(os.environ, ALONE_PROBE_LOG=str(log), PYTHONPATH=str(ROOT))
    env.pop("PYTEST_XDIST_TESTRUNUID", None)  # this run's own workers set their own
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-c", str(ROOT / "pytest.ini"), "--rootdir",
         str(tmp_path), "-p", "tests.conftest", "-n", "2", "--dist", "loadfile", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    spans = {}
    for line in log.read_text().split("\n"):
        if line:
            name, start, end = line.split()
            spans[name] = (float(start), float(end))
    assert len(spans) == 7
    # The alone test's own span (after its 0.4 s in which the lock already held) overlaps no
    # other test's span.
    a0, a1 = spans.pop("alone")
    overlapping = [n for n, (s, e) in spans.items() if s < a1 and e > a0]
    assert overlapping == [], (overlapping, a0, a1, spans)
