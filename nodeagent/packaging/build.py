"""Build the agent's own wheel from a checkout, with the standard library only (no network, no build backend).

    python -m nodeagent.packaging.build --out dist     # writes dist/gpumarket_agent-<version>-py3-none-any.whl
    python -m nodeagent.packaging.build --pins         # the agent's dependencies as pinned in requirements.txt

The wheel (PEP 427) holds the `nodeagent` package's modules and the systemd unit, and depends on the agent's three
libraries only: a provider's server gets no Django and no scheduler. Its bytes depend only on the sources (fixed
timestamps and modes, sorted entries), so two builds of one tree are identical.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import io
import re
import sys
import zipfile
from pathlib import Path

import nodeagent

PACKAGE_DIR = Path(__file__).resolve().parents[1]
REQUIREMENTS_TXT = PACKAGE_DIR.parent / "requirements.txt"  # the checkout's: the wheel is built from one

DIST_NAME = "gpumarket-agent"
# The agent's dependencies: nothing else is installed beside it. Their tested versions are requirements.txt's pins
# (the server's environment runs the same agent code in its tests); the wheel accepts those up to the next major.
REQUIREMENTS = ("websockets", "nvidia-ml-py", "docker")
REQUIRES_PYTHON = ">=3.11"
CONSOLE_SCRIPT = "gpumarket-agent = nodeagent.cli:main"
PACKAGE_DATA = ("packaging/gpumarket-agent.service",)  # beside the modules; docs/deployment.md copies it from there
ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can say: reproducible bytes


class BuildError(Exception):
    """The checkout cannot give a wheel (missing pin, not a checkout)."""


def pins(requirements_txt: Path = REQUIREMENTS_TXT) -> dict[str, str]:
    """Each agent dependency's pinned version in requirements.txt (`name==version`, extras and comments allowed)."""
    if not requirements_txt.is_file():
        raise BuildError(f"{requirements_txt} not found: build the agent's wheel from a checkout of the repository")
    found = {}
    for line in requirements_txt.read_text().splitlines():
        match = re.match(r"\s*([A-Za-z0-9._-]+)(?:\[[^]]*\])?\s*==\s*([^\s;#]+)", line)
        if match and match[1].lower() in REQUIREMENTS:
            found[match[1].lower()] = match[2]
    missing = [name for name in REQUIREMENTS if name not in found]
    if missing:
        raise BuildError(f"{requirements_txt} pins none of {', '.join(missing)} (name==version)")
    return {name: found[name] for name in REQUIREMENTS}


def requires_dist(pinned: dict[str, str]) -> list[str]:
    """The pinned version up to the next major one: the API the agent was tested against."""
    out = []
    for name, version in pinned.items():
        major = re.match(r"\d+", version)
        if not major:
            raise BuildError(f"{name}=={version}: the pin does not start with a major version number")
        out.append(f"{name}>={version},<{int(major[0]) + 1}")
    return out


def _stem() -> str:
    """The wheel's name and version as its file and dist-info folder spell them (PEP 427: `-` becomes `_`)."""
    return f"{DIST_NAME.replace('-', '_')}-{nodeagent.__version__}"


def wheel_name() -> str:
    return f"{_stem()}-py3-none-any.whl"


def package_files(package_dir: Path = PACKAGE_DIR) -> dict[str, bytes]:
    """Archive path -> bytes: every module of the package (no bytecode) and its data files."""
    files = {}
    for path in sorted(package_dir.rglob("*.py")):
        if "__pycache__" not in path.parts:
            files[path.relative_to(package_dir.parent).as_posix()] = path.read_bytes()
    for name in PACKAGE_DATA:
        files[f"{package_dir.name}/{name}"] = (package_dir / name).read_bytes()
    return dict(sorted(files.items()))


def metadata(version: str, requires: list[str]) -> str:
    summary = nodeagent.__doc__.strip().splitlines()[0]
    lines = ["Metadata-Version: 2.1", f"Name: {DIST_NAME}", f"Version: {version}", f"Summary: {summary}",
             f"Requires-Python: {REQUIRES_PYTHON}"] + [f"Requires-Dist: {r}" for r in requires]
    return "\n".join(lines) + "\n"


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def wheel_bytes() -> bytes:
    """The wheel, from the package as it is in this checkout."""
    version = nodeagent.__version__
    dist_info = f"{_stem()}.dist-info"
    files = package_files()
    files[f"{dist_info}/METADATA"] = metadata(version, requires_dist(pins())).encode()
    files[f"{dist_info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: nodeagent.packaging.build {version}\n"
                                   "Root-Is-Purelib: true\nTag: py3-none-any\n").encode()
    files[f"{dist_info}/entry_points.txt"] = f"[console_scripts]\n{CONSOLE_SCRIPT}\n".encode()
    files[f"{dist_info}/top_level.txt"] = b"nodeagent\n"
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


def build_wheel(out_dir: Path) -> Path:
    """Write the wheel into `out_dir` (made if missing) and return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / wheel_name()
    path.write_bytes(wheel_bytes())
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nodeagent.packaging.build", description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--out", type=Path, metavar="DIR", help="folder to write the wheel into")
    what.add_argument("--pins", action="store_true",
                      help="print the agent's dependencies as pinned (name==version), one a line, for pip download")
    args = parser.parse_args(argv)
    try:
        if args.pins:
            print("\n".join(f"{name}=={version}" for name, version in pins().items()))
        else:
            print(build_wheel(args.out))
    except BuildError as exc:
        print(f"cannot build the agent's wheel: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
