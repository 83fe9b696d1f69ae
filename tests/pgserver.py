"""A throwaway PostgreSQL cluster for tests: initdb into a temp folder, start on a free port, stop, delete.

Knows nothing about kvgraft's schema; it hands out `postgresql+psycopg://` URLs. Binaries are taken
from PATH or Debian's `/usr/lib/postgresql/<version>/bin` (apt package `postgresql`). initdb refuses
to run as root, so as root the cluster runs as the unprivileged `postgres` user (else `nobody`) via
`runuser -u <user> --` (or `su <user> -s /bin/sh -c`), in a temp folder owned by that user. The cluster trades durability for speed
(fsync off); it is deleted when stopped.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg

SUPERUSER = "kvgraft"
_SPEED = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=50"


class PgUnavailable(RuntimeError):
    """No PostgreSQL server binaries (initdb, pg_ctl) were found on this machine."""


def find_bin_dir() -> Path:
    """The folder holding initdb and pg_ctl: PATH first, then the newest /usr/lib/postgresql/*/bin."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).parent
    candidates = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "initdb").exists() and (p / "pg_ctl").exists()]
    candidates.sort(key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    if not candidates:
        raise PgUnavailable(
            "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or under /usr/lib/postgresql/*/bin; install the apt package `postgresql`"
        )
    return candidates[-1]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_as() -> str | None:
    """The unprivileged user to run the cluster as when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise PgUnavailable("running as root and neither a `postgres` nor a `nobody` user exists to run PostgreSQL as")


@dataclass
class PgServer:
    """One running cluster. `url` points at its `postgres` database as superuser `kvgraft` (trust auth)."""

    root: Path
    port: int
    bin_dir: Path
    user: str | None

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/postgres"

    def _cmd(self, *args: str) -> list[str]:
        if not self.user:
            return list(args)
        runuser = shutil.which("runuser") or next((p for p in ("/usr/sbin/runuser", "/sbin/runuser") if os.path.exists(p)), None)
        if runuser:
            return [runuser, "-u", self.user, "--", *args]
        return ["su", self.user, "-s", "/bin/sh", "-c", shlex.join(args)]

    def _run(self, *args: str, timeout: float = 60) -> None:
        proc = subprocess.run(self._cmd(*args), capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if proc.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}\n{tail}")

    def create_database(self, name: str | None = None) -> str:
        """Create an empty database and return its URL."""
        name = name or f"t_{uuid.uuid4().hex[:12]}"
        assert name.isidentifier(), f"database name must be a plain identifier, got {name!r}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname=postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def start(attempts: int = 3) -> PgServer:
    """initdb + pg_ctl start on a free port (retried if another process takes the port first)."""
    bin_dir = find_bin_dir()
    user = _run_as()
    root = Path(tempfile.mkdtemp(prefix="kvgraft-pg-"))  # in /tmp: pytest's tmp_path is root-only (0700)
    if user:
        pw = pwd.getpwnam(user)
        os.chown(root, pw.pw_uid, pw.pw_gid)
    server = PgServer(root=root, port=0, bin_dir=bin_dir, user=user)
    try:
        server._run(
            str(bin_dir / "initdb"),
            "-D",
            str(server.data),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        for attempt in range(attempts):
            server.port = _free_port()
            opts = f"-k {root} -h 127.0.0.1 -p {server.port} {_SPEED}"
            try:
                server._run(
                    str(bin_dir / "pg_ctl"),
                    "-D",
                    str(server.data),
                    "-l",
                    str(root / "server.log"),
                    "-w",
                    "-t",
                    "60",
                    "-o",
                    opts,
                    "start",
                )
                return server
            except RuntimeError:
                if attempt == attempts - 1:
                    raise
    except BaseException:
        server.stop()
        raise
    raise AssertionError("unreachable")
