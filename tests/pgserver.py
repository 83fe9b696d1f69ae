"""A throwaway PostgreSQL cluster for tests: initdb into a temp folder, start on a free port, stop, delete.

Knows nothing about kvgraft's schema; it hands out `postgresql+psycopg://` URLs. Binaries are taken
from PATH or Debian's `/usr/lib/postgresql/<version>/bin` (apt package `postgresql`). initdb refuses
to run as root, so as root the cluster runs as the unprivileged `postgres` user (else `nobody`) via
`runuser -u <user> --` (or `su <user> -s /bin/sh -c`), in a temp folder owned by that user. The cluster trades durability for speed
(fsync off, and synchronous_commit off unless started `crash_safe`); it is deleted when stopped. `kill` and `restart` let a test crash the server under load and
bring it back on the same port and data.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg

SUPERUSER = "kvgraft"
_SPEED = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=50"
# What a server crash test needs: a commit is acknowledged only once its WAL reached the operating system
# (PostgreSQL's default). fsync stays off: a killed server loses no page the kernel already holds.
_CRASH_SAFE = "-c fsync=off -c synchronous_commit=on -c full_page_writes=off -c max_connections=50"


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


def _children(pid: int) -> list[int]:
    """Every process whose parent is `pid` (read from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


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
    crash_safe: bool = False

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

    def kill(self) -> int:
        """SIGKILL the server (the postmaster and every backend, as an OOM killer or a crash would), wait
        until all of them are gone and return how many processes were killed. The data folder stays."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        victims = [pid] + [p for p in _children(pid)]
        for p in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in victims):
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL processes {victims} still alive 30 s after SIGKILL")
            time.sleep(0.05)
        # Every process is dead (a zombie holds no memory, but a container's init may never reap it, and the
        # server would then take the pid in its lock files for a live postmaster): the lock files are stale.
        for stale in (
            self.data / "postmaster.pid",
            self.root / f".s.PGSQL.{self.port}.lock",
            self.root / f".s.PGSQL.{self.port}",
        ):
            stale.unlink(missing_ok=True)
        return len(victims)

    def restart(self) -> None:
        """Start the server again on the same port and data folder (crash recovery replays its WAL)."""
        self._run(
            str(self.bin_dir / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "server.log"),
            "-w",
            "-t",
            "60",
            "-o",
            self._opts(),
            "start",
        )

    def _opts(self) -> str:
        return f"-k {self.root} -h 127.0.0.1 -p {self.port} {_CRASH_SAFE if self.crash_safe else _SPEED}"

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def start(attempts: int = 3, crash_safe: bool = False) -> PgServer:
    """initdb + pg_ctl start on a free port (retried if another process takes the port first). The cluster
    trades durability for speed unless `crash_safe`: then a commit survives a SIGKILL of the server."""
    bin_dir = find_bin_dir()
    user = _run_as()
    root = Path(tempfile.mkdtemp(prefix="kvgraft-pg-"))  # in /tmp: pytest's tmp_path is root-only (0700)
    if user:
        pw = pwd.getpwnam(user)
        os.chown(root, pw.pw_uid, pw.pw_gid)
    server = PgServer(root=root, port=0, bin_dir=bin_dir, user=user, crash_safe=crash_safe)
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
            opts = server._opts()
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
