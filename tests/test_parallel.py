"""`make test`'s runner (tests/parallel.py): two shards at once, each one's output whole, the worst exit status."""
from __future__ import annotations

import io
import sys

from tests import parallel


def _shard(name: str, code: str, env: dict | None = None) -> tuple[str, list[str], dict]:
    return name, [sys.executable, "-c", code], env or {}


def test_each_shards_output_is_printed_whole_and_a_failure_is_the_runs_exit_status():
    out = io.StringIO()
    code = parallel.run([], out=out, shards=[
        _shard("slow", "import time\nfor i in range(3): print('slow', i, flush=True); time.sleep(0.3)"),
        _shard("failing", "import sys\nprint('fast line one'); print('fast line two'); sys.exit(3)"),
    ])
    text = out.getvalue()
    assert code == 3
    # after the commands, the one that ended first is printed first, each shard's lines together, never interleaved
    printed = text[text.index("=====", text.index("started failing")):]
    assert printed.index("failing: exit status 3") < printed.index("fast line one") < printed.index("fast line two") \
        < printed.index("slow: exit status 0") < printed.index("slow 0") < printed.index("slow 2")
    assert "both shards done" in text


def test_a_shard_whose_selection_holds_no_test_does_not_fail_the_run_unless_both_are_empty():
    assert parallel.run([], out=io.StringIO(), shards=[_shard("a", "pass"), _shard("b", "raise SystemExit(5)")]) == 0
    assert parallel.run([], out=io.StringIO(), shards=[_shard("a", "raise SystemExit(5)"),
                                                       _shard("b", "raise SystemExit(5)")]) == 5


def test_shard_two_uses_the_next_redis_database_and_the_same_pytest_options(monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    (one, cmd_one, env_one), (two, cmd_two, env_two) = parallel.shard_commands(["-x", "-k", "lease"])
    assert env_one["REDIS_URL"] == "redis://127.0.0.1:6379/0" and env_two["REDIS_URL"] == "redis://127.0.0.1:6379/1"
    assert cmd_one[1:6] == ["-m", "pytest", "-x", "-k", "lease"] and cmd_two[1:6] == cmd_one[1:6]
    # every folder of shard one is left out of shard two, which runs the rest of tests/
    assert set(parallel.SHARD_ONE) <= set(cmd_one)
    assert {f"--ignore={p}" for p in parallel.SHARD_ONE} <= set(cmd_two) and cmd_two[-1] == "tests"
    assert parallel.next_redis_database("redis://:pw@10.0.0.5:6380", 1) == "redis://:pw@10.0.0.5:6380/1"


def test_the_progress_figure_is_the_last_one_pytest_wrote(tmp_path):
    log = tmp_path / "shard.log"
    log.write_bytes(b"tests/a.py ....   [ 12%]\ntests/b.py ..    [ 57%]\ntests/c.py .")
    with open(log, "rb") as f:
        assert parallel.progress(f) == "57%"
    log.write_bytes(b"collecting ...")
    with open(log, "rb") as f:
        assert parallel.progress(f) == "its start"


def test_a_test_path_is_refused_with_the_command_that_runs_it_alone(capsys):
    assert parallel.main(["tests/test_parallel.py::test_x", "-q"]) == 2
    err = capsys.readouterr().err
    assert "-m pytest tests/test_parallel.py::test_x" in err
    assert parallel.paths_in(["-k", "lease", "-x"]) == []  # "lease" is an option's value, not a path here
