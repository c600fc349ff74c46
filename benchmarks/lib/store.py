"""The resumable record store every benchmark program keeps its measurements in: one JSON
object a line, appended as soon as it is measured, so that a run stopped by hand resumes where
it stopped (a rerun skips the keys the file has)."""

from __future__ import annotations

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
        if path.exists():
            for line in path.read_text().splitlines():
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
