"""Installing one of the project's standalone wheels (nodeagent/packaging/build.py: the agent's, the CLI's) as its
users do: into a fresh venv, offline, from the dependency wheels `make venv` downloads, with nothing of this
checkout or this machine's pip settings reaching it."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from base64 import urlsafe_b64encode
from hashlib import sha256
from pathlib import Path

import pytest

from tests.conftest import ROOT

WHEELHOUSE = ROOT / ".venv" / "wheelhouse"


def wheelhouse() -> Path:
    """The dependency wheels; without them the install tests are skipped, or fail in CI (GPUMARKET_REQUIRE_ENGINE)."""
    if not any(WHEELHOUSE.glob("websockets-*.whl")):
        reason = f"no dependency wheels in {WHEELHOUSE}: run make venv: it downloads the wheels' dependencies"
        if os.environ.get("GPUMARKET_REQUIRE_ENGINE") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return WHEELHOUSE


def clean_env(**extra: str) -> dict[str, str]:
    """This environment less what points Python or pip at this checkout or this machine's indexes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))}
    return env | {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"} | extra


def run(*argv: str, cwd: Path, env: dict | None = None, check: bool = True, input: str | None = None,
        timeout: float = 240) -> subprocess.CompletedProcess:
    out = subprocess.run(argv, cwd=cwd, env=env if env is not None else clean_env(), capture_output=True, text=True,
                         timeout=timeout, input=input)
    assert out.returncode == 0 or not check, f"{argv} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    return out


def install_alone(wheel: Path, venv: Path) -> Path:
    """A new venv at `venv` with `wheel` and its dependencies only; its bin folder."""
    run(sys.executable, "-m", "venv", str(venv), cwd=venv.parent)
    python = str(venv / "bin" / "python")
    run(python, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(wheelhouse()), str(wheel),
        cwd=venv.parent)
    return venv / "bin"


def every_module_imports(python: Path, package: str, cwd: Path) -> Path:
    """Import each module of the installed `package` (so none needs anything the wheel does not bring); where the
    package was found."""
    code = (f"import importlib, pkgutil, {package}\n"
            f"for m in pkgutil.walk_packages({package}.__path__, '{package}.'):\n"
            "    m.name.endswith('__main__') or importlib.import_module(m.name)\n"
            f"print({package}.__file__)")
    return Path(run(str(python), "-c", code, cwd=cwd).stdout.strip())


def absent(python: Path, module: str, cwd: Path) -> bool:
    out = run(str(python), "-c", f"import {module}", cwd=cwd, check=False)
    return out.returncode != 0 and "ModuleNotFoundError" in out.stderr


def contents(wheel: Path) -> dict[str, bytes]:
    """Archive path -> bytes, in the archive's order."""
    with zipfile.ZipFile(wheel) as whl:
        return {n: whl.read(n) for n in whl.namelist()}


def record_problems(files: dict[str, bytes], dist_info: str) -> list[str]:
    """What is wrong with a wheel's RECORD (PEP 427): every file listed once, with its true sha256 and size, the
    RECORD itself last and without either."""
    problems = []
    names = list(files)
    if names[-1] != f"{dist_info}/RECORD":
        problems.append("RECORD is not the last entry")
    record = [line.rsplit(",", 2) for line in files[f"{dist_info}/RECORD"].decode().splitlines()]
    if sorted(path for path, _, _ in record) != sorted(names):
        problems.append("RECORD does not list exactly the archive's files")
    for path, digest, size in record:
        if path == f"{dist_info}/RECORD":
            if (digest, size) != ("", ""):
                problems.append("RECORD names a hash of itself")
            continue
        data = files.get(path, b"")
        true = "sha256=" + urlsafe_b64encode(sha256(data).digest()).rstrip(b"=").decode()
        if digest != true or int(size) != len(data):
            problems.append(f"{path}: hash or size wrong")
    return problems
