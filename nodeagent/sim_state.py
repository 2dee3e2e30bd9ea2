"""Where a simulated machine keeps what real hardware keeps across an agent restart: the GPUs' MIG instances (the
driver holds them until destroyed) and the containers of leases (the engine runs them until stopped).

One JSON file per node, shared by the simulated backend and the simulated runtime, each owning one section. Every
change is written at once (a temporary file renamed over the old one), so an agent killed at any moment leaves the
file as it was before or after the change, never half-written.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any


_LOCKS: dict[Path, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


class StateFile:
    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        # One lock per file in this process: the backend and the runtime each hold a StateFile of the same file and
        # save from different threads; each save reads the whole file and writes it back, so two must not overlap.
        with _LOCKS_GUARD:
            self._lock = _LOCKS.setdefault(self.path.resolve(), threading.Lock())

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            raise ValueError(f"the state file {self.path} is not valid JSON ({exc}); move it away to start "
                             f"the simulated machine empty") from None
        return data if isinstance(data, dict) else {}

    def load(self, section: str) -> Any:
        """What `section` held when last written (None when never written)."""
        with self._lock:
            return self._read().get(section)

    def save(self, section: str, value: Any) -> None:
        with self._lock:
            data = self._read()
            data[section] = value
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
