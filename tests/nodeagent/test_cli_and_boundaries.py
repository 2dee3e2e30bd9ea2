"""Command-line parsing and the package boundary (the agent imports nothing from the web app)."""
import ast
import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from nodeagent import cli

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("django", "rest_framework", "channels", "celery", "marketplace", "config")


@pytest.mark.parametrize("argv, words", [
    ([], "--server"),
    (["--server", "http://host/ws/agent/", "--token", "t"], "not a ws:// or wss:// URL"),
    (["--server", "ws://host:notaport/", "--token", "t"], "bad port"),
    (["--server", "ws://a/ws/agent/,http://b/ws/agent/", "--token", "t"], "not a ws:// or wss:// URL"),
    (["--server", ",", "--token", "t"], "names no server"),
    (["--server", "ws://h/", "--token", "t", "--simulate", "h100-80gb:0"], "bad count"),
    (["--server", "ws://h/", "--token", "t", "--simulate", "z900:1"], "unknown GPU model"),
    (["--server", "ws://h/", "--token", "t", "--simulate", "l4:1", "--interval", "0"], "interval must be"),
    (["--server", "ws://h/", "--token", "t", "--simulate", "l4:1", "--interval", "soon"], "not a number"),
    (["--server", "ws://h/", "--token", "t", "--simulate", "l4:1", "--seed", "x"], "invalid int"),
    (["--server", "ws://h/", "--token", "t", "--seed", "1"], "--seed only applies with --simulate"),
    (["--server", "ws://h/", "--token", "t", "--simulate", "l4:1", "--log-level", "loud"], "invalid choice"),
    (["--server", "ws://h/", "--simulate", "l4:1"], "no token"),
    (["--server", "ws://h/", "--token", "t", "--simulate", "l4:1", "--busy-on-create", "2"], "between 0 and 1"),
    (["--server", "ws://h/", "--token", "t", "--busy-on-create", "0.5"], "only applies with --simulate"),
    (["--server", "ws://h/", "--token", "t", "--state-file", "s.json"], "--state-file only applies with --simulate"),
    (["--server", "ws://h/", "--token", "t", "--create-seconds", "1"], "--create-seconds only applies with"),
    (["--server", "ws://h/", "--token", "t", "--simulate", "l4:1", "--create-seconds", "-1"], "carving must be"),
])
def test_bad_command_lines_exit_2_with_a_clear_error(argv, words, capsys, monkeypatch):
    monkeypatch.delenv("NODEAGENT_TOKEN", raising=False)
    monkeypatch.delenv("NODEAGENT_SERVER", raising=False)
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    assert words in capsys.readouterr().err


def test_good_command_line_parses_with_token_from_the_environment(monkeypatch):
    args = cli.build_parser().parse_args(["--server", "wss://market.example/ws/agent/", "--simulate",
                                          "h100-80gb:8,l4:2", "--interval", "0.5", "--seed", "4",
                                          "--hostname", "rack1-n3", "--log-level", "debug"])
    assert args.simulate == [("h100-80gb", 8), ("l4", 2)]
    assert (args.interval, args.seed, args.hostname, args.log_level) == (0.5, 4, "rack1-n3", "DEBUG")
    backend = cli.make_backend(args)
    assert backend.name == "simulated" and len(backend.inventory()["gpus"]) == 10
    assert backend.busy_on_create == 0.0
    args = cli.build_parser().parse_args(["--server", "ws://h/", "--simulate", "l4:1", "--busy-on-create", "0.8"])
    assert cli.make_backend(args).busy_on_create == 0.8


def test_several_servers_come_from_repeated_flags_commas_or_the_environment(monkeypatch):
    parse = cli.build_parser().parse_args
    assert parse(["--server", "wss://a/ws/agent/", "--server", "wss://b/ws/agent/,wss://c/ws/agent/"]).servers == [
        "wss://a/ws/agent/", "wss://b/ws/agent/", "wss://c/ws/agent/"]
    seen = {}
    monkeypatch.setattr(cli, "_serve", lambda backend, runtime, **kw: seen.update(kw) or asyncio.sleep(0, 0))
    monkeypatch.setenv("NODEAGENT_SERVER", "ws://a:8000/ws/agent/, ws://b:8000/ws/agent/")
    monkeypatch.setenv("NODEAGENT_TOKEN", "t")
    assert cli.main(["--simulate", "l4:1"]) == 0
    assert seen["servers"] == ["ws://a:8000/ws/agent/", "ws://b:8000/ws/agent/"]


def test_nodeagent_source_imports_nothing_from_the_web_application():
    offenders = []
    for path in (REPO / "nodeagent").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []


def test_importing_the_whole_agent_loads_no_web_framework():
    code = ("import sys, nodeagent.cli, nodeagent.client, nodeagent.backends.nvml, "
            "nodeagent.backends.simulated; "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
