"""Where `gpum` finds its server and key: the environment (GPUM_URL, GPUM_API_KEY) over the file `gpum login`
writes, $XDG_CONFIG_HOME/gpumarket/config.json (~/.config/gpumarket/config.json), readable by its owner only."""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from .errors import UsageError

DEFAULT_URL = "http://127.0.0.1:8000"  # `make demo`
URL_ENV, KEY_ENV = "GPUM_URL", "GPUM_API_KEY"


@dataclass(frozen=True)
class Settings:
    url: str
    key: str | None
    source: str  # where the key came from: "GPUM_API_KEY", the file's path, or "" (none)


def config_dir(env: dict | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(base) / "gpumarket"


def config_path(env: dict | None = None) -> Path:
    return config_dir(env) / "config.json"


def normalize_url(text: str) -> str:
    """The server's base URL: http(s)://host[:port][/prefix], without a trailing slash or the API's own path."""
    text = text.strip()
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{text!r} is not an http:// or https:// URL of a GPU Market server",
                         hint=f"for example {DEFAULT_URL} or https://market.example.org")
    try:
        parts.port
    except ValueError:
        raise UsageError(f"{text!r} has a bad port") from None
    path = parts.path.rstrip("/")
    for suffix in ("/api/v1", "/api"):  # a URL copied from the API docs names the same server
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    return f"{parts.scheme}://{parts.netloc}{path}"


def load_file(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path}: {exc}", hint="run gpum login again, or delete the file") from None
    return data if isinstance(data, dict) else {}


def settings(env: dict | None = None) -> Settings:
    """The server and key this call uses: the environment wins over the file."""
    env = os.environ if env is None else env
    path = config_path(env)
    stored = load_file(path)
    url = env.get(URL_ENV) or stored.get("url") or DEFAULT_URL
    if env.get(KEY_ENV):
        key, source = env[KEY_ENV].strip(), KEY_ENV
    elif stored.get("key"):
        key, source = str(stored["key"]), str(path)
    else:
        key, source = None, ""
    return Settings(url=normalize_url(url), key=key, source=source)


def save(url: str, key: str, env: dict | None = None) -> Path:
    """Write url and key to the config file, mode 0600 from its first byte (never readable by others, even
    briefly), replacing any earlier one atomically."""
    path = config_path(env)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".config-", suffix=".json")  # mkstemp makes it 0600
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"url": url, "key": key}, f, indent=2)
            f.write("\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def forget(env: dict | None = None) -> Path | None:
    """Remove the stored key (the file); the path removed, or None when there was none."""
    path = config_path(env)
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    return path
