"""DESIGN.md §3: the pure cores, the agent and the CLI import nothing from Django, DRF, Channels or Celery."""
from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

FORBIDDEN = ("django", "rest_framework", "channels", "celery", "kombu", "marketplace", "config", "drf_spectacular")
PURE_PACKAGES = ["scheduler.core", "scheduler.sim", "nodeagent", "gpumarket"]


def _modules(package: str) -> list[str]:
    path = ROOT / package.replace(".", "/")
    # The prefix lets walk_packages import subpackages by their full name to recurse into them (without it, it
    # tries `backends`, fails quietly and skips their modules; a subpackage named like an installed
    # distribution, `packaging`, would walk that distribution instead).
    return [package] + [m.name for m in pkgutil.walk_packages([str(path)], prefix=f"{package}.")
                        if not m.name.endswith(".__main__")]


# The agent installs alone on a provider's server, the CLI on a buyer's laptop (each its own wheel): not even the
# scheduler's pure core, nor one the other.
EXTRA_FORBIDDEN = {"nodeagent": ("scheduler", "gpumarket"), "gpumarket": ("scheduler", "nodeagent")}


@pytest.mark.parametrize("package", PURE_PACKAGES)
def test_pure_packages_import_nothing_from_the_web_stack(package):
    modules = _modules(package)
    assert len(modules) > 1, f"{package} has no modules?"
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"bad = sorted({{n.split('.')[0] for n in sys.modules}} & set({FORBIDDEN + EXTRA_FORBIDDEN.get(package, ())!r}))\n"
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


# --- marketplace layers (DESIGN.md §3, "Inside marketplace/") --------------------------------------------------

import ast  # noqa: E402
from pathlib import Path  # noqa: E402

# Each module's layer; a module may import only marketplace modules of lower layers, or of its own package.
LAYERS = [
    ("models", ["marketplace.models"]),
    ("pricing and events", ["marketplace.conf", "marketplace.amounts", "marketplace.pricing", "marketplace.events",
                            "marketplace.notifications"]),
    ("money", ["marketplace.money"]),
    ("claims", ["marketplace.claims"]),
    ("metering", ["marketplace.metering"]),
    ("lifecycle", ["marketplace.lifecycle"]),
    ("products", ["marketplace.products", "marketplace.selectors"]),
    # Acting for a buyer through products (idle reclaim, autoscaling: an autoscaling rule places orders).
    ("operations", ["marketplace.operations"]),
    ("interfaces", ["marketplace"]),  # api/, views/, consumers, tasks, admin, forms, urls, management, apps
]
# Products do not import each other; orders routes an order to its mode's module.
PRODUCT_ROUTER = "marketplace.products.orders"


def layer_of(module: str) -> int:
    for rank, (_, prefixes) in reversed(list(enumerate(LAYERS))):
        for prefix in prefixes:
            if rank < len(LAYERS) - 1 and (module == prefix or module.startswith(prefix + ".")):
                return rank
    return len(LAYERS) - 1


def marketplace_imports(root: Path) -> dict[str, set[str]]:
    """module -> the marketplace modules it imports (at any depth of the file, function-level too)."""
    mods = {}
    for p in root.rglob("*.py"):
        if "migrations" in p.parts:
            continue
        name = ".".join(p.relative_to(root.parent).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = p
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(p.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            graph[m] |= {n for n in names if n in mods and n != m}
    return graph


def layering_problems(graph: dict[str, set[str]]) -> list[str]:
    problems = []
    for m, deps in graph.items():
        for d in deps:
            if d.startswith(m + ".") or m.startswith(d + ".") and graph.get(d) is not None and d.count(".") == 1:
                continue  # a package and its own modules
            if layer_of(d) > layer_of(m):
                problems.append(f"{m} ({LAYERS[layer_of(m)][0]}) imports {d} ({LAYERS[layer_of(d)][0]}), a layer above")
            if (layer_of(m) == layer_of(d) == 6 and m.startswith("marketplace.products.")
                    and d.startswith("marketplace.products.") and m != PRODUCT_ROUTER
                    and d.rsplit(".", 1)[0] == "marketplace.products"):
                problems.append(f"{m} imports another product, {d}; what two share moves down a layer")
    # cycles (Tarjan's strongly connected components)
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    problems += [f"import cycle: {' -> '.join(c)}" for c in sccs]
    return problems


def test_marketplace_modules_import_only_lower_layers_and_never_in_a_cycle():
    graph = marketplace_imports(ROOT / "marketplace")
    assert len(graph) > 40
    assert layering_problems(graph) == []


def test_the_layer_check_would_catch_an_upward_import_a_product_importing_a_product_and_a_cycle():
    graph = marketplace_imports(ROOT / "marketplace")
    up = {**graph, "marketplace.metering": graph["marketplace.metering"] | {"marketplace.lifecycle.leases"}}
    assert any("a layer above" in p for p in layering_problems(up))
    sideways = {**graph, "marketplace.products.spot": graph["marketplace.products.spot"] | {
        "marketplace.products.resale"}}
    assert any("imports another product" in p for p in layering_problems(sideways))
    cycle = {**graph, "marketplace.money.ledger": graph["marketplace.money.ledger"] | {
        "marketplace.money.movements"}}
    assert any("import cycle" in p for p in layering_problems(cycle))
