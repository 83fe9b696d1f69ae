"""Where the web app runs and what that implies: a local machine, or a Hugging Face Space (detected by
the variables Spaces sets: SYSTEM=spaces, SPACE_ID), with its bind address, the URL users reach it at,
the proxies whose forwarded headers are believed, its persistent `/data` folder and its read-only public
demo mode. Pure settings from an environment; it starts nothing and knows no Gradio.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import settings

DATA_ROOT = Path("/data")  # where a Space mounts its persistent storage, when it has some
SPACE_PORT = 7860
# A Space is reached only through Hugging Face's proxy, which connects from the Space's private network.
PRIVATE_NETWORKS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")


@dataclass(frozen=True)
class Hosting:
    on_space: bool
    space_id: str
    host: str
    port: int
    home: Path | None  # None: the Library's own default (KVGRAFT_HOME or ~/.local/share/kvgraft)
    model_cache: Path | None  # None: graft_core's default (KVGRAFT_MODEL_CACHE or ~/.cache/kvgraft/models)
    persistent: bool  # the store survives a restart of the machine or the Space
    admin_token: str
    proxies: tuple[str, ...] = ()  # peers whose X-Forwarded-For is believed (KVGRAFT_TRUST_PROXY)
    public_url: str = ""  # the root Gradio gives every page (KVGRAFT_PUBLIC_URL); "" for `url`

    @property
    def read_only(self) -> bool:
        """A public demo: a Space without an admin token has no deposit, import or delete UI."""
        return self.on_space and not self.admin_token

    @property
    def url(self) -> str:
        shown = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{shown}:{self.port}"

    @property
    def root(self) -> str:
        """The app's own URL, pinned: a page never takes its root from the Host header a request claims."""
        return self.public_url or self.url

    def notices(self) -> list[str]:
        """What the page says about this deployment, plainly (empty on a local machine)."""
        out = []
        if self.on_space and not self.persistent:
            out.append(
                "This Space has no persistent storage: the store (and the converted model) live on its ephemeral disk "
                "and are lost at every restart; each cold start converts the model and seeds the library again. "
                "Add persistent storage in the Space's settings to keep them under /data."
            )
        if self.read_only:
            out.append(
                "Read-only public demo: ask, browse and verify; deposits, imports and deletes are off "
                "(the Space has no KVGRAFT_ADMIN_TOKEN secret)."
            )
        return out


def _writable(folder: Path) -> bool:
    return folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)


def _under(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def detect(environ: Mapping[str, str] | None = None, data_root: Path = DATA_ROOT) -> Hosting:
    """The hosting an environment describes. Explicit settings (KVGRAFT_HOME, KVGRAFT_MODEL_CACHE,
    GRADIO_SERVER_NAME/PORT) always win; on a Space the defaults are 0.0.0.0:7860 and `data_root`."""
    env = os.environ if environ is None else environ
    on_space = env.get("SYSTEM") == "spaces" or bool(env.get("SPACE_ID"))
    token = settings.get("KVGRAFT_ADMIN_TOKEN", env)
    space_host = env.get("SPACE_HOST", "")
    public = settings.get("KVGRAFT_PUBLIC_URL", env, default=f"https://{space_host}" if on_space and space_host else "")
    proxies = settings.get("KVGRAFT_TRUST_PROXY", env, default=PRIVATE_NETWORKS if on_space else ())
    if not on_space:
        host, port = env.get("GRADIO_SERVER_NAME") or "127.0.0.1", int(env.get("GRADIO_SERVER_PORT") or 7860)
        return Hosting(False, "", host, port, None, None, True, token, proxies, public)
    host, port = env.get("GRADIO_SERVER_NAME") or "0.0.0.0", int(env.get("GRADIO_SERVER_PORT") or SPACE_PORT)
    data_ok = _writable(data_root)
    home = settings.get("KVGRAFT_HOME", env, default=data_root / "kvgraft" if data_ok else None)
    cache = settings.get("KVGRAFT_MODEL_CACHE", env, default=data_root / "kvgraft-models" if data_ok else None)
    persistent = data_ok and home is not None and _under(home, data_root)
    return Hosting(True, env.get("SPACE_ID", ""), host, port, home, cache, persistent, token, proxies, public)


def apply(hosting: Hosting, environ: dict | None = None) -> None:
    """Point the store and the model cache where `hosting` says (before a Library is made)."""
    env = os.environ if environ is None else environ
    if hosting.home is not None:
        env["KVGRAFT_HOME"] = str(hosting.home)
    if hosting.model_cache is not None:
        env["KVGRAFT_MODEL_CACHE"] = str(hosting.model_cache)
