"""`make test`: the whole suite as two pytest processes at once, so that it fits CI's 20 minutes on two cores.

Most of the wall clock of the suite's longest parts is waiting, not computing: the fault suite drives one
production-layout stack (its own PostgreSQL database and Redis server, web processes, workers, beat, agents)
through kills and restarts and waits for it to recover, and the autoscaling e2e waits out scaling windows of whole
minutes. Those run in a second pytest process (`SIDE`) beside the rest. Nothing is shared between the two: each
pytest has its own test database (config/settings/test.py names it by process id), each live stack its own
database, ports and Redis, and neither side uses the container engine the other does.

`python -m pytest` alone still runs everything in one process; options given to `python -m tests.suite` (`-x`,
`-q`, ...) go to both.
The side's output is kept in a file while it runs and printed after the main run's, each under a heading.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIDE = ("tests/faults", "tests/e2e/test_operations_e2e.py")


def main(argv: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest", *argv]
    with tempfile.NamedTemporaryFile("w+", prefix="gpumarket-tests-side-", suffix=".log", delete=False) as log:
        print(f"== tests, two processes: {' '.join(SIDE)} beside the rest (its output: {log.name}, shown at the end)",
              flush=True)
        side = subprocess.Popen([*pytest, *SIDE], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rest = subprocess.run([*pytest, *(f"--ignore={path}" for path in SIDE)], cwd=ROOT, check=False).returncode
            side_rc = side.wait()
        except BaseException:
            os.killpg(side.pid, signal.SIGTERM)
            side.wait()
            raise
        log.seek(0)
        print(f"\n== {' '.join(SIDE)} (the second process)", flush=True)
        sys.stdout.write(log.read())
    os.unlink(log.name)
    print(f"\n== tests: the rest exited {rest}, {' '.join(SIDE)} exited {side_rc}", flush=True)
    return rest or side_rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
