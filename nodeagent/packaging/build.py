"""Build the project's standalone wheels from a checkout, with the standard library only (no network, no build
backend): the agent's and the command line's (`gpum`), each a package that installs without the web application.

    python -m nodeagent.packaging.build --out dist              # dist/gpumarket_agent-<version>-py3-none-any.whl
    python -m nodeagent.packaging.build --wheel cli --out dist  # dist/gpumarket_cli-<version>-py3-none-any.whl
    python -m nodeagent.packaging.build --pins                  # a wheel's dependencies as requirements.txt pins them

A wheel (PEP 427) holds its package's modules and data files, and depends on that package's libraries only: a
provider's server or a buyer's laptop gets no Django and no scheduler. Its bytes depend only on the sources (fixed
timestamps and modes, sorted entries), so two builds of one tree are identical. The builder lives here, in the
agent's package, because the agent's wheel must carry nothing else; it reads the CLI's package from the checkout.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import importlib
import io
import re
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
REQUIREMENTS_TXT = CHECKOUT / "requirements.txt"  # the checkout's: a wheel is built from one
REQUIRES_PYTHON = ">=3.11"
ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can say: reproducible bytes


@dataclass(frozen=True)
class WheelSpec:
    """One standalone wheel: its package, its name, the libraries it needs (their tested versions are
    requirements.txt's pins; the wheel accepts those up to the next major), its console script and data files."""

    package: str
    dist_name: str
    requirements: tuple[str, ...]
    console_script: str
    package_data: tuple[str, ...] = ()

    @property
    def package_dir(self) -> Path:
        return CHECKOUT / self.package

    @property
    def module(self):
        return importlib.import_module(self.package)

    @property
    def version(self) -> str:
        return self.module.__version__


AGENT = WheelSpec(package="nodeagent", dist_name="gpumarket-agent",
                  requirements=("websockets", "nvidia-ml-py", "docker"),
                  console_script="gpumarket-agent = nodeagent.cli:main",
                  # beside the modules; docs/deployment.md copies it from there
                  package_data=("packaging/gpumarket-agent.service",))
CLI = WheelSpec(package="gpumarket", dist_name="gpumarket-cli", requirements=("websockets",),
                console_script="gpum = gpumarket.cli:main")
WHEELS = {"agent": AGENT, "cli": CLI}


class BuildError(Exception):
    """The checkout cannot give a wheel (missing pin, not a checkout)."""


def pins(requirements_txt: Path = REQUIREMENTS_TXT, spec: WheelSpec = AGENT) -> dict[str, str]:
    """Each of the wheel's dependencies' pinned version in requirements.txt (`name==version`, extras and comments
    allowed)."""
    if not requirements_txt.is_file():
        raise BuildError(f"{requirements_txt} not found: build the wheel from a checkout of the repository")
    found = {}
    for line in requirements_txt.read_text().splitlines():
        match = re.match(r"\s*([A-Za-z0-9._-]+)(?:\[[^]]*\])?\s*==\s*([^\s;#]+)", line)
        if match and match[1].lower() in spec.requirements:
            found[match[1].lower()] = match[2]
    missing = [name for name in spec.requirements if name not in found]
    if missing:
        raise BuildError(f"{requirements_txt} pins none of {', '.join(missing)} (name==version)")
    return {name: found[name] for name in spec.requirements}


def requires_dist(pinned: dict[str, str]) -> list[str]:
    """The pinned version up to the next major one: the API the package was tested against."""
    out = []
    for name, version in pinned.items():
        major = re.match(r"\d+", version)
        if not major:
            raise BuildError(f"{name}=={version}: the pin does not start with a major version number")
        out.append(f"{name}>={version},<{int(major[0]) + 1}")
    return out


def _stem(spec: WheelSpec) -> str:
    """The wheel's name and version as its file and dist-info folder spell them (PEP 427: `-` becomes `_`)."""
    return f"{spec.dist_name.replace('-', '_')}-{spec.version}"


def wheel_name(spec: WheelSpec = AGENT) -> str:
    return f"{_stem(spec)}-py3-none-any.whl"


def package_files(spec: WheelSpec = AGENT) -> dict[str, bytes]:
    """Archive path -> bytes: every module of the package (no bytecode) and its data files."""
    package_dir = spec.package_dir
    files = {}
    for path in sorted(package_dir.rglob("*.py")):
        if "__pycache__" not in path.parts:
            files[path.relative_to(package_dir.parent).as_posix()] = path.read_bytes()
    for name in spec.package_data:
        files[f"{package_dir.name}/{name}"] = (package_dir / name).read_bytes()
    return dict(sorted(files.items()))


def metadata(spec: WheelSpec, requires: list[str]) -> str:
    summary = spec.module.__doc__.strip().splitlines()[0]
    lines = ["Metadata-Version: 2.1", f"Name: {spec.dist_name}", f"Version: {spec.version}", f"Summary: {summary}",
             f"Requires-Python: {REQUIRES_PYTHON}"] + [f"Requires-Dist: {r}" for r in requires]
    return "\n".join(lines) + "\n"


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def wheel_bytes(spec: WheelSpec = AGENT) -> bytes:
    """The wheel, from the package as it is in this checkout."""
    dist_info = f"{_stem(spec)}.dist-info"
    files = package_files(spec)
    files[f"{dist_info}/METADATA"] = metadata(spec, requires_dist(pins(spec=spec))).encode()
    files[f"{dist_info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: nodeagent.packaging.build {spec.version}\n"
                                   "Root-Is-Purelib: true\nTag: py3-none-any\n").encode()
    files[f"{dist_info}/entry_points.txt"] = f"[console_scripts]\n{spec.console_script}\n".encode()
    files[f"{dist_info}/top_level.txt"] = f"{spec.package}\n".encode()
    record = "\n".join([_record_line(p, d) for p, d in files.items()] + [f"{dist_info}/RECORD,,"]) + "\n"
    files[f"{dist_info}/RECORD"] = record.encode()  # last in the archive, as PEP 427 recommends

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as whl:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, date_time=ZIP_TIME)
            info.external_attr = 0o100644 << 16  # a plain file, rw-r--r--
            info.compress_type = zipfile.ZIP_DEFLATED
            whl.writestr(info, data)
    return buf.getvalue()


def build_wheel(out_dir: Path, spec: WheelSpec = AGENT) -> Path:
    """Write the wheel into `out_dir` (made if missing) and return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / wheel_name(spec)
    path.write_bytes(wheel_bytes(spec))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nodeagent.packaging.build", description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", choices=sorted(WHEELS), default="agent",
                        help="which wheel: the agent's (default) or the command line's (gpum)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--out", type=Path, metavar="DIR", help="folder to write the wheel into")
    what.add_argument("--pins", action="store_true",
                      help="print the wheel's dependencies as pinned (name==version), one a line, for pip download")
    args = parser.parse_args(argv)
    spec = WHEELS[args.wheel]
    try:
        if args.pins:
            print("\n".join(f"{name}=={version}" for name, version in pins(spec=spec).items()))
        else:
            print(build_wheel(args.out, spec))
    except BuildError as exc:
        print(f"cannot build the {args.wheel}'s wheel: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
