"""Reading a trial's ``reports.jsonl`` (written by rank 0's ``report``) while it grows.

The tuner (and, with ``backend="ray"``, the Ray trial that drives a trial's workers) reads
the new whole lines between its polls; a line still being written waits for the next poll.
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Tuple

from .session import REPORTS_FILE

Values = Dict[str, Optional[float]]  # a non-finite value is stored as None


class ReportReader:
    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, REPORTS_FILE)
        self.last_values: Values = {}  # every metric's latest value
        self._offset = 0

    def new_reports(self) -> List[Tuple[int, Values]]:
        """(step, values) of the whole lines appended since the last call."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self._offset += end
        found = []
        for line in data[:end].splitlines():
            record = json.loads(line)
            self.last_values.update(record["values"])
            found.append((int(record["step"]), record["values"]))
        return found
