"""The CLI's own wheel (nodeagent/packaging/build.py, `make cli-wheel`): its package's modules under true hashes, a
`gpum` console script, websockets as its one dependency at the version the server pins, the same bytes from the
same tree. tests/cli/test_cli_live.py installs it alone and runs it."""
from __future__ import annotations

import email.parser
import re
import zipfile

import pytest
from packaging.requirements import Requirement

import gpumarket
from nodeagent.packaging import build
from tests.conftest import ROOT
from tests.wheels import contents, record_problems

DIST_INFO = f"gpumarket_cli-{gpumarket.__version__}.dist-info"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return build.build_wheel(tmp_path_factory.mktemp("dist"), build.CLI)


def test_the_wheel_needs_websockets_only_at_the_version_the_server_pins(wheel):
    assert wheel.name == f"gpumarket_cli-{gpumarket.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as whl:
        meta = email.parser.Parser().parsestr(whl.read(f"{DIST_INFO}/METADATA").decode())
        entry_points = whl.read(f"{DIST_INFO}/entry_points.txt").decode()
    assert (meta["Name"], meta["Version"], meta["Requires-Python"]) == (
        "gpumarket-cli", gpumarket.__version__, ">=3.11")
    assert meta["Summary"] == gpumarket.__doc__.splitlines()[0]
    (requires,) = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    pinned = re.search(r"^websockets==(\S+)", (ROOT / "requirements.txt").read_text(), re.M)[1]
    assert requires.name == "websockets" and requires.specifier.contains(pinned)
    assert entry_points == "[console_scripts]\ngpum = gpumarket.cli:main\n"


def test_the_wheel_holds_every_module_of_the_package_and_nothing_else_under_true_hashes(wheel):
    files = contents(wheel)
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "gpumarket").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert {n for n in files if not n.startswith(DIST_INFO)} == sources
    assert record_problems(files, DIST_INFO) == []
    broken = dict(files, **{"gpumarket/cli.py": files["gpumarket/cli.py"] + b"# changed\n"})
    assert record_problems(broken, DIST_INFO) == ["gpumarket/cli.py: hash or size wrong"]


def test_two_builds_of_one_tree_are_the_same_bytes(wheel, tmp_path):
    assert build.build_wheel(tmp_path, build.CLI).read_bytes() == wheel.read_bytes()
