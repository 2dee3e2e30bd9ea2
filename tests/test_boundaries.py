"""DESIGN.md §3: the pure cores and the agent import nothing from Django, DRF, Channels or Celery."""
from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

FORBIDDEN = ("django", "rest_framework", "channels", "celery", "kombu", "marketplace", "config", "drf_spectacular")
PURE_PACKAGES = ["scheduler.core", "scheduler.sim", "nodeagent"]


def _modules(package: str) -> list[str]:
    path = ROOT / package.replace(".", "/")
    return [package] + [f"{package}.{m.name}" for m in pkgutil.walk_packages([str(path)]) if m.name != "__main__"]


@pytest.mark.parametrize("package", PURE_PACKAGES)
def test_pure_packages_import_nothing_from_the_web_stack(package):
    modules = _modules(package)
    assert len(modules) > 1, f"{package} has no modules?"
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"bad = sorted({{n.split('.')[0] for n in sys.modules}} & set({FORBIDDEN!r}))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"{package} pulls in {out.stdout.strip()}"


def test_the_boundary_check_would_catch_a_django_import(tmp_path):
    """The check above is only worth something if it can fail."""
    (tmp_path / "leaky.py").write_text("import django\n")
    code = "import sys; sys.path.insert(0, %r); import leaky; print('django' in sys.modules)" % str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True"
