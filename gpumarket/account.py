"""Commands of the account: login, logout, ssh-key."""
from __future__ import annotations

import getpass
import sys
from pathlib import Path

from . import config
from .client import Client
from .context import command
from .errors import ApiError, AuthError, NotFound, UsageError
from .table import Column, local_time


def register(sub, parent) -> None:
    p = command(sub, "login", parent, "check an API key and remember it (and the server's URL)",
                description="Check an API key against the server (a GET of your wallet) and store the server's URL "
                            "and the key in ~/.config/gpumarket/config.json, readable by you only. Create keys on the "
                            "console's Account page. GPUM_URL and GPUM_API_KEY, when set, win over the file.",
                epilog="examples:\n  gpum login --url https://market.example.org        (asks for the key)\n"
                       "  echo \"$KEY\" | gpum login --key - --url http://127.0.0.1:8000")
    p.add_argument("--key", help="the API key (gpm_key_...); `-` reads it from stdin; without it gpum asks "
                                 "(a key on the command line is visible to other users of the machine)")
    p.add_argument("--url", help=f"the server (default: $GPUM_URL, the URL stored before, else {config.DEFAULT_URL})")
    p.set_defaults(run=login)

    p = command(sub, "logout", parent, "forget the stored key",
                description="Delete ~/.config/gpumarket/config.json (the key stays valid on the server: revoke it on "
                            "the console's Account page).")
    p.set_defaults(run=logout)

    p = command(sub, "ssh-key", parent, "your SSH public keys (every new container lets them in)",
                description="The SSH public keys of your account: each container started after a key was added "
                            "lets it log in as root (`gpum ssh`).")
    keys = p.add_subparsers(title="ssh-key commands", metavar="ACTION", required=True)
    k = command(keys, "list", parent, "list your keys", aliases=["ls"])
    k.set_defaults(run=ssh_key_list)
    k = command(keys, "add", parent, "add a public key (default ~/.ssh/id_ed25519.pub)",
                description="Add a public key file's line to your account.",
                epilog="example:\n  gpum ssh-key add ~/.ssh/id_ed25519.pub --name laptop")
    k.add_argument("path", nargs="?", help="the public key file (default: ~/.ssh/id_ed25519.pub, else id_ecdsa.pub, "
                                           "else id_rsa.pub)")
    k.add_argument("--name", help="what to call it (default: the key's comment, else the file's name)")
    k.set_defaults(run=ssh_key_add)
    k = command(keys, "remove", parent, "remove a key (by its ID or name)", aliases=["rm"])
    k.add_argument("key", help="the key's ID or name, as `gpum ssh-key list` shows")
    k.set_defaults(run=ssh_key_remove)


def _read_key(ctx) -> str:
    given = ctx.args.key
    if given == "-":
        key = sys.stdin.readline().strip()
    elif given is not None:
        key = given.strip()
    elif sys.stdin.isatty():
        key = getpass.getpass("API key (from the console's Account page): ").strip()
    else:
        raise UsageError("no key: give --key KEY, or --key - to read it from stdin")
    if not key:
        raise UsageError("the key is empty")
    return key


def login(ctx) -> int:
    s = ctx.settings
    url = config.normalize_url(ctx.args.url) if ctx.args.url else s.url
    key = _read_key(ctx)
    readable = True
    try:
        Client(url, key, warn=ctx.note).get("wallet/")
    except ApiError as exc:
        if exc.status == 401:
            raise AuthError(exc.message, hint=f"the server at {url} does not know this key: copy it again from the "
                                              "console's Account page (it is shown once)") from None
        if exc.status != 403:
            raise
        readable = False  # a key without the read scope: valid, but most commands will be refused
    path = config.save(url, key, ctx.env)
    ctx.result({"url": url, "config": str(path), "read": readable},
               f"Logged in to {url} with key {key[:16]}... (saved in {path}, mode 0600)")
    if not readable:
        ctx.note("gpum: warning: this key may not read (403 on your wallet): commands that list or show things "
                 "will be refused; create a key with the read scope")
    if ctx.env.get(config.KEY_ENV):
        ctx.note(f"gpum: note: ${config.KEY_ENV} is set and wins over the stored key in this shell")
    return 0


def logout(ctx) -> int:
    path = config.forget(ctx.env)
    ctx.result({"removed": str(path) if path else None},
               f"Logged out: removed {path}" if path else "Not logged in: no stored key")
    if ctx.env.get(config.KEY_ENV):
        ctx.note(f"gpum: note: ${config.KEY_ENV} is still set in this shell and still used")
    return 0


# --- ssh keys -------------------------------------------------------------------------------------------------------

def ssh_key_list(ctx) -> int:
    return ctx.listing(ctx.client.all_pages("ssh-keys/"),
                       [Column("ID", right=True), Column("NAME", shrink=True), Column("FINGERPRINT", shrink=True),
                        Column("ADDED", drop=1)],
                       lambda k: [k["id"], k["name"], k["fingerprint"], local_time(k["created_at"])],
                       empty="no SSH keys: add one with `gpum ssh-key add` (containers let it log in as root)")


def _default_public_key() -> Path:
    ssh = Path.home() / ".ssh"
    for name in ("id_ed25519.pub", "id_ecdsa.pub", "id_rsa.pub"):
        if (ssh / name).is_file():
            return ssh / name
    raise UsageError(f"no public key in {ssh} (id_ed25519.pub, id_ecdsa.pub, id_rsa.pub)",
                     hint="make one with `ssh-keygen -t ed25519`, or name the file: gpum ssh-key add PATH")


def ssh_key_add(ctx) -> int:
    path = Path(ctx.args.path).expanduser() if ctx.args.path else _default_public_key()
    if path.suffix != ".pub" and path.with_suffix(path.suffix + ".pub").is_file():
        raise UsageError(f"{path} looks like a private key: give {path}.pub")
    try:
        line = path.read_text().strip()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    if "PRIVATE KEY" in line:
        raise UsageError(f"{path} is a private key: give the public one ({path}.pub)")
    parts = line.split()
    name = ctx.args.name or (parts[2] if len(parts) > 2 else path.name)
    key = ctx.client.post("ssh-keys/", {"name": name[:80], "public_key": line})
    return ctx.result(key, f"Added SSH key {key['id']} {key['name']} ({key['fingerprint']}): containers started "
                           "from now on let it log in as root")


def ssh_key_remove(ctx) -> int:
    keys = ctx.client.all_pages("ssh-keys/")
    wanted = ctx.args.key
    found = [k for k in keys if str(k["id"]) == wanted] or [k for k in keys if k["name"] == wanted]
    if not found:
        raise NotFound(f"no SSH key of yours has the ID or name {wanted!r}")
    if len(found) > 1:
        raise UsageError(f"{len(found)} keys are called {wanted!r}: give the ID (gpum ssh-key list)")
    ctx.client.delete(f"ssh-keys/{found[0]['id']}/")
    return ctx.result(found[0], f"Removed SSH key {found[0]['id']} {found[0]['name']} (running containers keep it)")
