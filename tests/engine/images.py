"""The engine tests' images, built on this machine with no registry: a root filesystem assembled as a tar from the
host's static busybox (busybox-static) and dropbear (dropbear-bin, with every library `ldd` names), imported
through the engine's own API (`POST /images/create?fromSrc=-`), so it lands in the storage of whichever engine
the tests talk to — Docker, or Podman's service (a root service shares root `podman`'s storage).

Idempotent: an image whose recipe label matches this module's source is kept; any other image under the tag
(an older recipe, one imported by hand) is replaced.

    python -m tests.engine.images unix:///run/podman/podman.sock   # build both, as the fixtures do
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

BUSYBOX_IMAGE = "localhost/gpm-busybox:test"
SSHD_IMAGE = "localhost/gpm-sshd:test"
HTTP_PORT = 8080  # `busybox httpd -f -p 8080 -h /www` serves INDEX_HTML
INDEX_HTML = b"<h1>GPU Market engine test page</h1>\n"
SSH_PORT = 22
RECIPE_LABEL = "gpumarket.test-recipe"

BUSYBOX = "/bin/busybox"
DROPBEAR = "/usr/sbin/dropbear"
DROPBEARKEY = "/usr/bin/dropbearkey"
HOST_KEY = "/etc/dropbear/dropbear_ed25519_host_key"


class ImageBuildError(RuntimeError):
    """A tool the images are made of is missing here (CI installs busybox-static and dropbear-bin)."""


class Rootfs:
    """A root filesystem as a tar in memory: every entry owned by root, parents made on the way."""

    def __init__(self) -> None:
        self._buf = io.BytesIO()
        self._tar = tarfile.open(fileobj=self._buf, mode="w")
        self._dirs: set[str] = set()

    def _info(self, path: str, kind: bytes, mode: int) -> tarfile.TarInfo:
        path = path.strip("/")
        parent = os.path.dirname(path)
        if parent and parent not in self._dirs:
            self.dir(parent)
        info = tarfile.TarInfo(path)
        info.type, info.mode, info.mtime = kind, mode, 1_700_000_000
        return info

    def dir(self, path: str, mode: int = 0o755) -> None:
        info = self._info(path, tarfile.DIRTYPE, mode)
        if info.name not in self._dirs:
            self._dirs.add(info.name)
            self._tar.addfile(info)

    def file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        info = self._info(path, tarfile.REGTYPE, mode)
        info.size = len(data)
        self._tar.addfile(info, io.BytesIO(data))

    def copy(self, path: str, host_path: str) -> None:
        """The host file's content (through its symlinks) and mode, at `path`."""
        real = Path(host_path).resolve()
        self.file(path, real.read_bytes(), real.stat().st_mode & 0o7777)

    def link(self, path: str, target: str) -> None:
        info = self._info(path, tarfile.SYMTYPE, 0o777)
        info.linkname = target
        self._tar.addfile(info)

    def data(self) -> bytes:
        self._tar.close()
        return self._buf.getvalue()


def _need(path: str, package: str) -> str:
    if not os.access(path, os.X_OK):
        raise ImageBuildError(f"{path} is missing: install {package} (apt-get install {package})")
    return path


def busybox_rootfs() -> Rootfs:
    """busybox with a link per applet (sh, sleep, httpd, cat, kill...), root's account, and /www for httpd."""
    busybox = _need(BUSYBOX, "busybox-static")
    applets = subprocess.run([busybox, "--list"], check=True, capture_output=True, text=True).stdout.split()
    root = Rootfs()
    root.copy("bin/busybox", busybox)
    for applet in applets:
        if applet != "busybox" and "/" not in applet:
            root.link(f"bin/{applet}", "busybox")
    root.link("sbin", "bin")
    root.dir("usr")
    root.link("usr/bin", "../bin")
    root.dir("root", 0o700)  # dropbear refuses keys under a home others can write to
    root.dir("tmp", 0o1777)
    for path in ("run", "var/run", "var/log", "dev", "proc", "sys"):
        root.dir(path)
    root.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
    root.file("etc/shadow", b"root:*:19000:0:99999:7:::\n", 0o600)  # no password: keys only
    root.file("etc/group", b"root:x:0:\n")
    root.file("etc/shells", b"/bin/sh\n")
    root.file("etc/nsswitch.conf", b"passwd: files\ngroup: files\nshadow: files\n")
    root.file("www/index.html", INDEX_HTML)
    return root


def _libraries(binary: str) -> list[str]:
    """The paths `ldd` resolves a dynamic binary's libraries and loader to."""
    out = subprocess.run(["ldd", binary], check=True, capture_output=True, text=True).stdout
    paths = []
    for line in out.splitlines():
        found = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
        if found:
            paths.append(found.group(1))
    return paths


def sshd_rootfs() -> Rootfs:
    """busybox plus dropbear and its libraries, with an ed25519 host key made now."""
    dropbear = _need(DROPBEAR, "dropbear-bin")
    root = busybox_rootfs()
    root.copy("usr/sbin/dropbear", dropbear)
    for library in _libraries(dropbear):
        root.copy(library, library)
        nss = os.path.join(os.path.dirname(library), "libnss_files.so.2")
        if library.endswith("/libc.so.6") and os.path.exists(nss):  # an older glibc dlopens it for getpwnam
            root.copy(nss, nss)
    with tempfile.TemporaryDirectory() as tmp:
        key = os.path.join(tmp, "host_key")
        subprocess.run([_need(DROPBEARKEY, "dropbear-bin"), "-t", "ed25519", "-f", key], check=True,
                       capture_output=True)
        root.file(HOST_KEY, Path(key).read_bytes(), 0o600)
    root.dir("root/.ssh", 0o700)
    return root


def _recipe() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def ensure_image(client, ref: str, rootfs: Callable[[], Rootfs], changes: list[str]) -> str:
    """`ref` in the engine `client` (a docker.DockerClient) talks to, imported from `rootfs()` unless an image of
    this recipe is there already; returns its id."""
    import docker

    recipe = _recipe()
    old = None
    try:
        old = client.images.get(ref)
        if (old.labels or {}).get(RECIPE_LABEL) == recipe:
            return old.id
    except docker.errors.ImageNotFound:
        pass
    # `repo` may carry the tag (Docker Engine API, ImageCreate); Podman 4 ignores a separate `tag` on import.
    answer = client.api.import_image_from_data(rootfs().data(), repository=ref,
                                               changes=[*changes, f"LABEL {RECIPE_LABEL}={recipe}"])
    for line in str(answer).splitlines():
        if '"error' in line:
            raise ImageBuildError(f"the engine refused to import {ref}: {json.loads(line).get('error', line)}")
    image = client.images.get(ref)
    if old is not None and old.id != image.id:
        try:
            client.images.remove(old.id)  # the replaced image, unless a container still uses it
        except docker.errors.APIError:
            pass
    return image.id


def busybox_image(client) -> str:
    """BUSYBOX_IMAGE; its default command serves /www over HTTP on HTTP_PORT; /data is a volume."""
    ensure_image(client, BUSYBOX_IMAGE, busybox_rootfs,
                 [f'CMD ["/bin/busybox", "httpd", "-f", "-p", "{HTTP_PORT}", "-h", "/www"]',
                  f"EXPOSE {HTTP_PORT}", "ENV PATH=/bin", "VOLUME /data"])  # each container: an anonymous volume
    return BUSYBOX_IMAGE


def sshd_image(client) -> str:
    """SSHD_IMAGE; its default command runs dropbear in the foreground on SSH_PORT, key logins only."""
    ensure_image(client, SSHD_IMAGE, sshd_rootfs,
                 [f'CMD ["/usr/sbin/dropbear", "-F", "-E", "-s", "-r", "{HOST_KEY}", "-p", "{SSH_PORT}"]',
                  f"EXPOSE {SSH_PORT}", "ENV PATH=/bin:/usr/sbin"])
    return SSHD_IMAGE


def have_tools() -> str | None:
    """Why the images cannot be built here, or None."""
    for path, package in ((BUSYBOX, "busybox-static"), (DROPBEAR, "dropbear-bin"), (DROPBEARKEY, "dropbear-bin")):
        if not os.access(path, os.X_OK):
            return f"{path} is missing (apt-get install {package})"
    if shutil.which("ldd") is None:
        return "ldd is missing"
    return None


if __name__ == "__main__":
    import docker

    engine = docker.DockerClient(base_url=sys.argv[1] if len(sys.argv) > 1 else "unix:///run/podman/podman.sock")
    print(busybox_image(engine), sshd_image(engine))
