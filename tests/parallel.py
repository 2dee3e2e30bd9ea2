"""`make test`: the whole suite as two pytest processes at once, each a shard of the test files.

    .venv/bin/python -m tests.parallel            # what `make test` runs
    .venv/bin/python -m tests.parallel -x -k lease  # pytest options go to both shards (paths are refused:
                                                    # run one file or folder with -m pytest PATH)

Run one after the other, the suite keeps one core busy on a two-core machine: pytest is one Python process,
and its longest tests mostly wait (the operations e2e test's scaling windows are whole minutes of wall
clock; the fault suite waits for processes it kills to come back). Two shards at once take about half the
wall clock. `SHARD_ONE` is chosen by the tests' durations (each shard ends with its 25 slowest; move a folder
across when one shard ends minutes after the other); the other shard is every other file, so a new test file
always runs.

The shards share the machine's PostgreSQL and Redis servers and must not see each other's state there:
- each pytest process makes its own test database (config/settings/test.py names it by process id), and
  the live stacks make databases and Redis servers of their own;
- shard two uses the next Redis database of REDIS_URL (/0 → /1): the throttles' cache, the channel layer's
  groups and Celery's queues of the in-process tests are then apart;
- tests that run real containers start their own `podman system service` and name everything with a
  random suffix (tests/enginefix.py); host port blocks are picked free (`free_port_block`).

Each shard's output goes to a file while it runs and is printed whole when the shard ends, so the two never
interleave; a line every minute says which shards are still running and how far each is. The exit status is the first non-zero
one of the shards (0 when both passed).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse, urlunparse

ROOT = Path(__file__).resolve().parent.parent

# Shard one: folders holding the longest wait-bound tests, about half of the suite's wall clock (durations of a
# clean CI run on this VM kind, one process: 720 of 1,450 s). Everything else is shard two, with every test that
# runs real containers (tests/engine, tests/cli, the browser's workload flow), so that one shard builds the test
# images.
SHARD_ONE = (
    "tests/e2e",  # 350 s, 260 of them the operations e2e test's scaling windows
    "tests/faults",  # 250 s
    "tests/sim",
    "tests/config",
    "tests/nodeagent",
    "tests/operations",
)
NO_TESTS = 5  # pytest's exit status when a shard's selection holds no test (e.g. a -k that matches only the other)
HEARTBEAT_SECONDS = 60.0


def next_redis_database(url: str, offset: int) -> str:
    """REDIS_URL with its database number moved by `offset` (redis://host:6379/0 → /1; no path means /0)."""
    parsed = urlparse(url)
    database = int(parsed.path.lstrip("/") or 0) + offset
    return urlunparse(parsed._replace(path=f"/{database}"))


def shard_commands(args: list[str]) -> list[tuple[str, list[str], dict[str, str]]]:
    """(name, pytest command line, environment) of each shard."""
    pytest = [sys.executable, "-m", "pytest", *args]
    one = [p for p in SHARD_ONE if (ROOT / p).exists()]
    env_two = dict(os.environ)
    if env_two.get("REDIS_URL"):
        env_two["REDIS_URL"] = next_redis_database(env_two["REDIS_URL"], 1)
    return [("shard one (" + " ".join(one) + ")", [*pytest, *one], dict(os.environ)),
            ("shard two (every other test file)", [*pytest, *(f"--ignore={p}" for p in one), "tests"], env_two)]


def progress(log) -> str:
    """How far a running shard is, from the last progress figure pytest wrote to its log ("[ 42%]")."""
    size = os.fstat(log.fileno()).st_size
    found = re.findall(rb"\[\s*(\d+)%\]", os.pread(log.fileno(), 4096, max(0, size - 4096)))
    return f"{int(found[-1])}%" if found else "its start"


def run(args: list[str], *, shards: list[tuple[str, list[str], dict[str, str]]] | None = None, out=sys.stdout) -> int:
    """Run `shards` (default: `shard_commands(args)`) at once; print each one's output when it ends."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpumarket-shards-") as tmp:
        running = []
        for i, (name, command, env) in enumerate(shards or shard_commands(args)):
            log = open(Path(tmp) / f"shard{i}.log", "w+b")
            proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
            running.append((name, proc, log))
            print(f"started {name}: {' '.join(command[1:])}", file=out, flush=True)
        codes: dict[str, int] = {}
        beat = time.monotonic()
        try:
            while running:
                for item in list(running):
                    name, proc, log = item
                    if proc.poll() is None:
                        continue
                    running.remove(item)
                    codes[name] = proc.returncode
                    log.seek(0)
                    print(f"\n===== {name}: exit status {proc.returncode} after "
                          f"{time.monotonic() - started:.0f} s =====", file=out, flush=True)
                    for chunk in iter(lambda: log.read(1 << 16), b""):
                        out.write(chunk.decode(errors="replace"))
                    out.flush()
                    log.close()
                if running and time.monotonic() - beat >= HEARTBEAT_SECONDS:
                    beat = time.monotonic()
                    print(f"... {time.monotonic() - started:.0f} s: still running: "
                          f"{'; '.join(f'{name} at {progress(log)}' for name, _, log in running)}", file=out, flush=True)
                time.sleep(0.5)
        finally:
            for _, proc, _ in running:  # interrupted (Ctrl-C): stop the shards still running
                proc.terminate()
                proc.wait()
    summary = ", ".join(f"{name}: {code}" for name, code in codes.items())
    print(f"\n===== both shards done in {time.monotonic() - started:.0f} s ({summary}) =====", file=out, flush=True)
    if all(code in (0, NO_TESTS) for code in codes.values()) and any(code == 0 for code in codes.values()):
        return 0
    return next((code for code in codes.values() if code not in (0, NO_TESTS)), NO_TESTS)


def paths_in(args: list[str]) -> list[str]:
    """The arguments that name test files or folders: the shards choose those themselves."""
    return [a for a in args if not a.startswith("-") and (ROOT / a.split("::")[0]).exists()]


def main(argv: list[str]) -> int:
    paths = paths_in(argv)
    if paths:
        print(f"tests.parallel runs the whole suite in its own two shards; for {' '.join(paths)} alone run "
              f"{os.path.relpath(sys.executable, ROOT)} -m pytest {' '.join(paths)}", file=sys.stderr)
        return 2
    return run(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
