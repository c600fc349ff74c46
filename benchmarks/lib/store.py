"""The resumable record store every benchmark program keeps its measurements in: one JSON
object a line, appended as soon as it is measured, so that a run stopped by hand resumes where
it stopped (a rerun skips the keys the file has). A committed report may keep its records
compressed (``records.jsonl.gz``, under the reports' 1 MB a file): they are read first, and
new records go to the plain file beside them."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path


class Store:
    """Append-only JSONL records, keyed by ``key(record)`` (by default (config, task_id,
    sample)). ``rows``: the last record of each key; ``records``: every record in file order."""

    def __init__(self, path: Path, key: Callable[[dict], tuple] | None = None):
        self.path = path
        self.key = key or (lambda row: (row["config"], row["task_id"], row["sample"]))
        self.rows: dict[tuple, dict] = {}
        self.records: list[dict] = []
        packed = path.with_name(path.name + ".gz")
        for text in (gzip.decompress(packed.read_bytes()).decode() if packed.exists() else "",
                     path.read_text() if path.exists() else ""):
            for line in text.splitlines():
                if line.strip():
                    self._keep(json.loads(line))

    def _keep(self, row: dict) -> None:
        self.records.append(row)
        self.rows[self.key(row)] = row

    def __contains__(self, key) -> bool:
        return key in self.rows

    def append(self, rows: list[dict]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
                self._keep(row)
