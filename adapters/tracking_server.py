"""A shared MLflow tracking store for a cluster: PostgreSQL and an MLflow tracking server on it.

SQLite (``mlflow.db``) is the store of one machine. Runs on several hosts log through an MLflow tracking
server instead (``MLFLOW_TRACKING_URI=http://host:port``): the server keeps runs, params, metrics and tags
in PostgreSQL and proxies the artifacts to a store it alone writes (a folder, or an S3-compatible
bucket), so no worker needs a shared filesystem. ``fp8rl tracking-server`` (:mod:`flows.cli`), the tests
and the Ray integration test use the two context managers here::

    with Postgres(Path(".tracking-server")) as db, TrackingServer(db.uri, None, db.data_dir) as server:
        os.environ["MLFLOW_TRACKING_URI"] = server.url

:class:`Postgres` initialises a database cluster in ``<data_dir>/pgdata`` on first use (``initdb``),
starts ``postgres`` on a loopback port, creates the database ``mlflow`` and stops the server on exit.
PostgreSQL refuses to run as root: when this process is root it runs as the ``postgres`` system user.
:class:`TrackingServer` starts ``mlflow server`` on a database URI (``Postgres.uri`` or the user's own)
and waits until it answers ``/health``. Each server runs in its own session (a Ctrl-C in the terminal
reaches only the caller, which stops MLflow first, then PostgreSQL); its output goes to a log file in the
data dir that every error names.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from pathlib import Path

__all__ = ["Postgres", "ServerError", "TrackingServer", "free_port", "postgres_binaries"]

INSTALL = ("install them with `apt-get install -y postgresql` (Debian puts them under "
           "/usr/lib/postgresql/<version>/bin), or pass --db-uri to use a PostgreSQL of your own")
#: hosts that mean "every interface": clients reach such a server through this host's address
WILDCARD = ("0.0.0.0", "::", "")
#: where Debian's postgresql packages put the server binaries: <DEBIAN_BINS>/<version>/bin
DEBIAN_BINS = Path("/usr/lib/postgresql")


class ServerError(RuntimeError):
    """A server could not start (or answer): the message names what failed and the log to read."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on at ``host`` now (the kernel's choice)."""
    with socket.socket(_family(host)) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def check_port(host: str, port: int, what: str, option: str) -> None:
    """Raise :class:`ServerError` when ``port`` on ``host`` cannot be listened on (in use, or no such address)."""
    with socket.socket(_family(host)) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT does not count
        try:
            s.bind((host, port))
        except OSError as e:
            raise ServerError(f"{what}: cannot listen on {host}:{port} ({e.strerror}: another server uses "
                              f"it?); choose another port with {option}") from e


def postgres_binaries() -> Path:
    """The folder with PostgreSQL's ``postgres`` and ``initdb``: the one of ``postgres`` on PATH (or of the
    file that link points to), else the newest ``/usr/lib/postgresql/<version>/bin``."""
    folders = []
    if on_path := shutil.which("postgres"):
        folders += [Path(on_path).parent, Path(on_path).resolve().parent]
    versions = sorted(DEBIAN_BINS.glob("*/bin"),
                      key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.name)], reverse=True)
    for folder in folders + versions:
        if all(os.access(folder / b, os.X_OK) for b in ("postgres", "initdb")):
            return folder
    raise ServerError(f"PostgreSQL server binaries (postgres, initdb) not found on PATH or under "
                      f"/usr/lib/postgresql/*/bin: {INSTALL}")


def _tail(log: Path, lines: int = 15) -> str:
    try:
        text = log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "\n  | ".join(["", *text]) if text else ""


def _redact(uri: str) -> str:
    """A database URI without its password."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", uri)


def _stop(proc: subprocess.Popen | None, first: int, wait_s: float, then: int = signal.SIGKILL) -> None:
    """Signal the process group ``proc`` leads with ``first``, after ``wait_s`` with ``then``, and SIGKILL
    whatever of the group is left (a uvicorn worker, a postgres backend): nothing of it keeps running."""
    if proc is None:
        return
    for sig, timeout in ((first, wait_s), (then, 10.0)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout)
            break
        except ProcessLookupError:
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


class _Server(ABC):
    """A server process of ours: :meth:`start` launches it (``_launch``) and waits until it is ready
    (``_ready``), stopping it when that fails or is interrupted; a context manager (started on entry,
    stopped on exit)."""

    proc: subprocess.Popen | None = None
    log: Path
    start_timeout_s: float

    @abstractmethod
    def _launch(self) -> None: ...

    @abstractmethod
    def _ready(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    def start(self):
        self._launch()
        try:
            self._ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait_until(self, ready, name: str, what: str):
        """Poll ``ready()`` until it returns something not None (returned); fail naming ``name`` and the log
        when the process exits first or ``start_timeout_s`` passes."""
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if (rc := self.proc.poll()) is not None:
                raise ServerError(f"{name} exited (code {rc}) while starting: see {self.log}{_tail(self.log)}")
            if (got := ready()) is not None:
                return got
            if time.monotonic() > deadline:
                raise ServerError(f"{name} did not {what} within {self.start_timeout_s:.0f} s: see "
                                  f"{self.log}{_tail(self.log)}")
            time.sleep(0.2)


class Postgres(_Server):
    """A PostgreSQL server of its own on ``host:port`` (loopback; ``port`` None: a free one, kept across
    restarts), its cluster in ``<data_dir>/pgdata`` (created by ``initdb`` on first use, trust
    authentication on loopback), its output in ``<data_dir>/postgres.log``; the database ``database`` is
    created when missing. As root it runs as the ``postgres`` user, so ``data_dir`` must be reachable by
    that user (a folder of its own under /tmp with mode 0711 is; pytest's 0700 ``tmp_path`` is not: the error
    says so). A context manager: started on entry, stopped (fast shutdown: open transactions
    are rolled back, committed data kept) on exit. :meth:`stop` and :meth:`start` may be called again."""

    def __init__(self, data_dir: Path, port: int | None = None, host: str = "127.0.0.1",
                 database: str = "mlflow", start_timeout_s: float = 60.0) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.pgdata = self.data_dir / "pgdata"
        self.log = self.data_dir / "postgres.log"
        self.host, self.port, self.database = host, port, database
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None
        self._user = self._run_as()

    @property
    def uri(self) -> str:
        """The SQLAlchemy URI of the database (user ``postgres``, no password: loopback trust; the psycopg2
        driver, the one installed)."""
        return f"postgresql+psycopg2://postgres@{self.host}:{self.port}/{self.database}"

    @staticmethod
    def _run_as() -> dict:
        """``subprocess`` arguments that drop root to the ``postgres`` user (PostgreSQL refuses root)."""
        if os.geteuid() != 0:
            return {}
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            raise ServerError("running as root, and PostgreSQL refuses root, but there is no `postgres` user "
                              f"to run it as: {INSTALL} (the package creates the user)") from None
        return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": [],
                "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": pw.pw_dir, "LANG": "C.UTF-8"}}

    def _init(self, bins: Path) -> None:
        self.pgdata.mkdir(parents=True, exist_ok=True)
        if self._user:
            os.chown(self.pgdata, self._user["user"], self._user["group"])
            self.pgdata.chmod(0o700)
            if subprocess.run(["test", "-w", str(self.pgdata)], **self._user).returncode:
                raise ServerError(f"the postgres user cannot write {self.pgdata}: a folder above it is not "
                                  "searchable by that user; choose a data dir it can reach (e.g. under /tmp or "
                                  "/var/lib) or give the folders above o+x")
        log = self.data_dir / "initdb.log"
        with log.open("wb") as out:
            rc = subprocess.run([str(bins / "initdb"), "-D", str(self.pgdata), "-U", "postgres", "--auth=trust",
                                 "-E", "UTF8"], stdout=out, stderr=subprocess.STDOUT, **self._user).returncode
        if rc:
            raise ServerError(f"initdb {self.pgdata} failed (exit {rc}): see {log}{_tail(log)}")

    def _launch(self) -> None:
        bins = postgres_binaries()
        if self.port is None:
            self.port = free_port(self.host)
        check_port(self.host, self.port, "PostgreSQL", "--pg-port")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not (self.pgdata / "PG_VERSION").is_file():
            self._init(bins)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(bins / "postgres"), "-D", str(self.pgdata), "-p", str(self.port), "-h", self.host,
                 "-c", "unix_socket_directories="],  # TCP only: no socket folder to own
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                cwd=self.pgdata, **self._user)

    def _ready(self) -> None:
        """Wait until PostgreSQL accepts connections; create the database when missing."""
        import psycopg2

        def connect():
            try:
                return psycopg2.connect(host=self.host, port=self.port, user="postgres", dbname="postgres",
                                        connect_timeout=2)
            except psycopg2.OperationalError:  # not listening yet, or "the database system is starting up"
                return None

        where = f"{self.host}:{self.port}"
        conn = self._wait_until(connect, f"PostgreSQL on {where}", f"accept connections on {where}")
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.database,))
                if cur.fetchone() is None:
                    cur.execute(f'CREATE DATABASE "{self.database}"')
        finally:
            conn.close()

    def stop(self) -> None:
        """Fast shutdown (SIGINT); after 30 s immediate shutdown (SIGQUIT), then SIGKILL."""
        _stop(self.proc, signal.SIGINT, 30.0, signal.SIGQUIT)
        self.proc = None


def sqlalchemy_uri(uri: str) -> str:
    """A PostgreSQL URI with the psycopg2 driver named (SQLAlchemy 2.1 reads a bare ``postgresql://`` as
    psycopg 3, which is not installed); other URIs unchanged."""
    return re.sub(r"^postgres(ql)?://", "postgresql+psycopg2://", uri)


def check_database(uri: str) -> None:
    """Raise :class:`ServerError` when the PostgreSQL database ``uri`` refuses a connection (other URIs: not
    checked here; ``mlflow server`` reports them)."""
    if not uri.startswith("postgresql+psycopg2://"):
        return
    import psycopg2

    try:
        psycopg2.connect(uri.replace("+psycopg2", "", 1), connect_timeout=10).close()
    except psycopg2.OperationalError as e:
        raise ServerError(f"the database {_redact(uri)} refused the connection: {str(e).strip()}") from e


def this_host_address() -> str:
    """The address other hosts reach this one at: the source address of the default route (no packet is
    sent), else the host name."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.254.254.254", 1))
            return s.getsockname()[0]
        except OSError:
            return socket.gethostname()


class TrackingServer(_Server):
    """``mlflow server`` on the database ``db_uri`` at ``host:port``, proxying artifacts
    (``--serve-artifacts``) to ``artifacts``: a folder (default ``<log_dir>/artifacts``, created) or a
    bucket URI (``s3://…``: the server needs its credentials and boto3). Output in
    ``<log_dir>/mlflow.log``. A context manager: started on entry — returns once ``/health`` answers —
    and stopped on exit (SIGTERM to its process group, SIGKILL after 30 s). ``allowed_hosts``: MLflow's
    ``--allowed-hosts`` (Host headers it accepts; its default: localhost and private IP addresses)."""

    def __init__(self, db_uri: str, artifacts: str | Path | None, log_dir: Path, host: str = "127.0.0.1",
                 port: int = 5000, workers: int = 2, allowed_hosts: str | None = None,
                 start_timeout_s: float = 180.0) -> None:
        self.db_uri, self.host, self.port, self.workers = sqlalchemy_uri(db_uri), host, port, workers
        self.log_dir = Path(log_dir).resolve()
        self.log = self.log_dir / "mlflow.log"
        if artifacts is None:
            artifacts = self.log_dir / "artifacts"
        self.artifacts = str(artifacts) if "://" in str(artifacts) else str(Path(artifacts).resolve())
        self.allowed_hosts = allowed_hosts
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """What clients set ``MLFLOW_TRACKING_URI`` to (this host's address when bound to every interface)."""
        host = this_host_address() if self.host in WILDCARD else self.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    @property
    def local_url(self) -> str:
        host = ("127.0.0.1" if self.host != "::" else "::1") if self.host in WILDCARD else self.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def _launch(self) -> None:
        check_port(self.host, self.port, "MLflow tracking server", "--port")
        check_database(self.db_uri)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if "://" not in self.artifacts:
            Path(self.artifacts).mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", self.db_uri, "--serve-artifacts",
               "--artifacts-destination", self.artifacts, "--host", self.host, "--port", str(self.port),
               "--workers", str(self.workers)]
        if self.allowed_hosts:
            cmd += ["--allowed-hosts", self.allowed_hosts]
        # pytest's marker makes MLflow's store run test-only checks on every session: a server is production
        # MLflow's job runner (GenAI scorers, trace jobs: ~10 huey processes) serves nothing fp8rl logs
        env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"} | {
            k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True, env=env)

    def _ready(self) -> None:
        def health():
            try:
                with urllib.request.urlopen(f"{self.local_url}/health", timeout=5) as r:
                    return True if r.status == 200 else None
            except (urllib.error.URLError, OSError):
                return None

        self._wait_until(health, f"the MLflow server on {self.host}:{self.port} (store {_redact(self.db_uri)})",
                         f"answer {self.local_url}/health")

    def stop(self) -> None:
        _stop(self.proc, signal.SIGTERM, 30.0)
        self.proc = None
