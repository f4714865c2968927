"""Local stack for airflow_eo: a single-node Kafka (KRaft), a MariaDB and a PostgreSQL, on loopback.

Usage: ``python scripts/stack.py up|down|status|clean`` (``postgres up|down``: the PostgreSQL alone; ``connect``: a
Kafka Connect worker with Debezium's PostgreSQL connector, scripts/stack_connect.py); for fault tests
``kill mariadb|postgres|kafka|connect`` (SIGKILL, as a crash would), ``restart mariadb|postgres|kafka`` (SIGKILL, then
start it again on the same data) and ``second-mariadb up|down`` / ``second-postgres up|down`` (another MariaDB /
PostgreSQL server on the next port, for a store and a sink on two servers).

Everything the stack writes lives under ``.stack/`` in the repo (ignored by git), with one exception: as root, in a
repo whose folder (or a parent) is closed to other users, PostgreSQL's data and socket live in a folder of the
``postgres`` user's under /var/tmp (the server runs as that user and could not reach ``.stack``), linked from
``.stack/postgres/root`` and removed by ``clean``. Downloaded artifacts (Kafka's jars) are cached under
``~/.cache/airflow-eo`` so a second start is fast. A user who has their own Kafka, MySQL or PostgreSQL sets
``EO_KAFKA_BOOTSTRAP``, ``EO_MYSQL_HOST`` (plus ``EO_MYSQL_PORT``, ``EO_MYSQL_USER``,
``EO_MYSQL_PASSWORD``, ``EO_MYSQL_DATABASE``) or ``EO_PG_HOST`` (plus ``EO_PG_PORT``, ``EO_PG_USER``,
``EO_PG_PASSWORD``, ``EO_PG_DATABASE``) and the stack starts nothing for that part.
``up`` always (re)writes ``.stack/env``, a file to ``source`` that exports the
Airflow connections and settings the example DAGs use, migrates the Airflow
metadata database that file points to (SQLite under ``.stack/airflow``) and writes
the DAG folder into it, so ``airflow dags test`` works right after ``up``, several at once included.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any
from urllib.parse import quote

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # airflow_eo.core needs nothing but the standard library: usable before the venv
from airflow_eo.core.failpoints import running  # noqa: E402

STACK = Path(os.environ.get("EO_STACK_DIR", REPO / ".stack"))
CACHE = Path(os.environ.get("EO_CACHE_DIR", Path.home() / ".cache" / "airflow-eo"))
KAFKA_POM = REPO / "scripts" / "kafka" / "pom.xml"
KAFKA_LOG4J = REPO / "scripts" / "kafka" / "log4j2.properties"

# Every default port is below the kernel's ephemeral ports (32768-60999): a JVM's bind(0) or a client socket
# could hold one of those while a killed service restarts (seen with Spark Connect on 35002).
KAFKA_PORT = int(os.environ.get("EO_STACK_KAFKA_PORT", "29092"))
KAFKA_CONTROLLER_PORT = KAFKA_PORT + 1
MARIADB_PORT = int(os.environ.get("EO_STACK_MYSQL_PORT", "23306"))
POSTGRES_PORT = int(os.environ.get("EO_STACK_PG_PORT", "25432"))
DB_NAME, DB_USER, DB_PASSWORD = "airflow_eo", "eo", "eo"


def die(message: str) -> None:
    print(f"stack: {message}", file=sys.stderr)
    sys.exit(1)


def require(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if not path:
        die(f"'{tool}' not found: {hint}")
    return path


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def pid_alive(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if running(pid) else None


def wait_for(what: str, check, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
    die(f"{what} did not become ready in {timeout:.0f}s; last log lines:\n{tail}")


def spawn(cmd: list[str], log: Path, pid_file: Path, env: dict | None = None, **as_user: Any) -> None:
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env, **as_user,
        )
    pid_file.write_text(str(proc.pid))


# --------------------------------------------------------------------------- Kafka

def kafka_version() -> str:
    text = KAFKA_POM.read_text()
    return text.split("<kafka.version>")[1].split("</kafka.version>")[0]


def kafka_jars() -> Path:
    """Resolve Kafka's runtime classpath from Maven Central once, into the cache."""
    jars = CACHE / f"kafka-{kafka_version()}" / "libs"
    if (jars / ".complete").exists():
        return jars
    require("java", "install a Java 17+ runtime (Debian: apt-get install openjdk-17-jre-headless)")
    mvn = require("mvn", "install Maven (Debian: apt-get install maven)")
    jars.mkdir(parents=True, exist_ok=True)
    print(f"stack: resolving Kafka {kafka_version()} from Maven Central into {jars}")
    subprocess.run(
        [mvn, "-q", "-B", "-f", str(KAFKA_POM), "dependency:copy-dependencies",
         "-DincludeScope=runtime", f"-DoutputDirectory={jars}"],
        check=True,
    )
    (jars / ".complete").touch()
    return jars


def kafka_up() -> str:
    bootstrap = os.environ.get("EO_KAFKA_BOOTSTRAP")
    if bootstrap:
        print(f"stack: using your Kafka at {bootstrap} (EO_KAFKA_BOOTSTRAP)")
        return bootstrap
    return local_kafka_up()


def local_kafka_up() -> str:
    """Start (or find running) the stack's own broker (``.stack/kafka``)."""
    return kafka_node_up(STACK / "kafka", 1, KAFKA_PORT, {1: KAFKA_CONTROLLER_PORT}, replicas=1)


def kafka_node_up(home: Path, node_id: int, port: int, voters: dict[int, int], replicas: int,
                  heap: str = "768m", cluster: str | None = None) -> str:
    """One KRaft node (broker and controller) of a quorum of ``voters`` (node id → controller port).

    ``replicas``: replication of the internal topics (offsets, transaction state) and default of new topics;
    with 3, ``min.insync.replicas`` is 2 so that a write survives the loss of any one node.
    """
    pid_file, log = home / "kafka.pid", home / "stdout.log"
    bootstrap = f"127.0.0.1:{port}"
    if pid_alive(pid_file):
        wait_for("Kafka", lambda: kafka_ready(bootstrap), 60, home / "server.log")
        print(f"stack: Kafka already running at {bootstrap}")
        return bootstrap
    if port_open(port):
        die(f"port {port} is taken by another process; set EO_STACK_KAFKA_PORT or "
            "EO_KAFKA_BOOTSTRAP to use that broker")
    java = require("java", "install a Java 17+ runtime (Debian: apt-get install openjdk-17-jre-headless)")
    jars = kafka_jars()
    home.mkdir(parents=True, exist_ok=True)
    config = home / "server.properties"
    min_isr = 2 if replicas >= 3 else 1
    config.write_text("\n".join([
        "process.roles=broker,controller",
        f"node.id={node_id}",
        "controller.quorum.voters=" + ",".join(f"{n}@127.0.0.1:{p}" for n, p in sorted(voters.items())),
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{voters[node_id]}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        f"log.dirs={home / 'data'}",
        "num.partitions=1",
        # One node: internal topics and transactions must work with a single replica; three: with two.
        f"default.replication.factor={replicas}",
        f"min.insync.replicas={min_isr}",
        f"offsets.topic.replication.factor={replicas}",
        f"transaction.state.log.replication.factor={replicas}",
        f"transaction.state.log.min.isr={min_isr}",
        f"share.coordinator.state.topic.replication.factor={replicas}",
        f"share.coordinator.state.topic.min.isr={min_isr}",
        "unclean.leader.election.enable=false",
        "group.initial.rebalance.delay.ms=0",
        "transaction.max.timeout.ms=900000",
        # Retention checks every 5s so data-loss tests need not wait long.
        "log.retention.check.interval.ms=5000",
        # DeleteRecords moves a partition's start in memory; a SIGKILLed broker restarts from the last
        # checkpoint of it (default every 60s), bringing the records back. The tests empty topics that way
        # and the fault tests kill the broker: checkpoint every second (wait_until_deleted_records_stay_deleted).
        "log.flush.start.offset.checkpoint.interval.ms=1000",
        "auto.create.topics.enable=false",
        "",
    ]))
    java_cmd = [java, "-Xms128m", f"-Xmx{heap}", "-XX:+UseG1GC",
                f"-Dkafka.logs.dir={home}",
                f"-Dlog4j2.configurationFile={KAFKA_LOG4J}",
                "-cp", f"{jars}/*"]
    if not (home / "data" / "meta.properties").exists():
        subprocess.run(
            # "--cluster-id=": an id may start with "-", which the tool would take for an option.
            java_cmd + ["kafka.tools.StorageTool", "format", f"--cluster-id={cluster or cluster_id()}",
                        "-c", str(config), "--ignore-formatted"],
            check=True, stdout=subprocess.DEVNULL,
        )
    spawn(java_cmd + ["kafka.Kafka", str(config)], log, pid_file)
    if len(voters) == 1:  # a node of a quorum answers only once a majority of it runs
        wait_for("Kafka", lambda: kafka_ready(bootstrap), 90, home / "server.log")
        print(f"stack: Kafka {kafka_version()} (KRaft) ready at {bootstrap}")
    return bootstrap


def cluster_id() -> str:
    # KRaft wants a base64url-encoded UUID (22 characters, no padding).
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def kafka_ready(bootstrap: str) -> bool:
    """True when the broker answers a metadata request (not just an open port)."""
    host, port = bootstrap.rsplit(":", 1)
    if not port_open(int(port), host):
        return False
    from confluent_kafka.admin import AdminClient

    try:
        metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=3)
        return bool(metadata.brokers)
    except Exception:
        return False


# --------------------------------------------------------------------------- MariaDB

def mysql_settings() -> dict:
    if os.environ.get("EO_MYSQL_HOST"):
        return {
            "host": os.environ["EO_MYSQL_HOST"],
            "port": int(os.environ.get("EO_MYSQL_PORT", "3306")),
            "user": os.environ.get("EO_MYSQL_USER", "root"),
            "password": os.environ.get("EO_MYSQL_PASSWORD", ""),
            "database": os.environ.get("EO_MYSQL_DATABASE", DB_NAME),
            "external": True,
        }
    return {"host": "127.0.0.1", "port": MARIADB_PORT, "user": DB_USER,
            "password": DB_PASSWORD, "database": DB_NAME, "external": False}


def mysql_ready(settings: dict) -> bool:
    import pymysql

    try:
        pymysql.connect(host=settings["host"], port=settings["port"], user=settings["user"],
                        password=settings["password"], database=settings["database"],
                        connect_timeout=2).close()
        return True
    except pymysql.MySQLError:
        return False


def mariadb_up(home: Path | None = None, port: int = MARIADB_PORT) -> dict:
    """Start (or find running) the MariaDB server of ``home`` on ``port`` (default: the stack's)."""
    settings = mysql_settings() if home is None else {
        "host": "127.0.0.1", "port": port, "user": DB_USER, "password": DB_PASSWORD, "database": DB_NAME,
        "external": False}
    if settings["external"]:
        print(f"stack: using your MySQL at {settings['host']}:{settings['port']} (EO_MYSQL_HOST)")
        if not mysql_ready(settings):
            die(f"cannot connect to MySQL at {settings['host']}:{settings['port']} as "
                f"{settings['user']} (database {settings['database']}); check EO_MYSQL_* settings")
        return settings
    home = home or STACK / "mariadb"
    pid_file, log, sock = home / "mariadb.pid", home / "error.log", home / "mysqld.sock"
    if pid_alive(pid_file):
        wait_for("MariaDB", lambda: mysql_ready(settings), 60, log)
        print(f"stack: MariaDB already running at 127.0.0.1:{port}")
        return settings
    if port_open(port):
        die(f"port {port} is taken by another process; set EO_STACK_MYSQL_PORT, "
            "or EO_MYSQL_HOST to use that server")
    apt_hint = "install MariaDB (Debian: apt-get update && apt-get install mariadb-server)"
    mariadbd = shutil.which("mariadbd") or shutil.which("mariadbd", path="/usr/sbin:/usr/local/sbin")
    if not mariadbd:
        die(f"'mariadbd' not found: {apt_hint}")
    install_db = require("mariadb-install-db", apt_hint)
    data = home / "data"
    home.mkdir(parents=True, exist_ok=True)
    fresh = not (data / "mysql").exists()
    if fresh:
        subprocess.run(
            [install_db, f"--datadir={data}", "--user=root", "--auth-root-authentication-method=socket",
             "--skip-test-db"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
    spawn([mariadbd, "--no-defaults", f"--datadir={data}", f"--socket={sock}", f"--port={port}",
           "--bind-address=127.0.0.1", f"--pid-file={home / 'mariadbd.pid'}", f"--log-error={log}",
           "--user=root", "--innodb-buffer-pool-size=256M", "--max-connections=500",
           "--innodb-lock-wait-timeout=20", "--skip-name-resolve"],
          home / "stdout.log", pid_file)
    # A SIGKILLed server leaves its socket file behind: wait for the new server to answer on it.
    wait_for("MariaDB socket", lambda: sock.exists() and port_open(port), 120, log)
    if fresh:
        mariadb = require("mariadb", apt_hint)
        sql = (f"CREATE DATABASE IF NOT EXISTS {DB_NAME};"
               f"CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{DB_PASSWORD}';"
               f"CREATE USER IF NOT EXISTS '{DB_USER}'@'localhost' IDENTIFIED BY '{DB_PASSWORD}';"
               f"GRANT ALL PRIVILEGES ON *.* TO '{DB_USER}'@'127.0.0.1';"
               f"GRANT ALL PRIVILEGES ON *.* TO '{DB_USER}'@'localhost';")
        deadline = time.monotonic() + 60
        while subprocess.run([mariadb, f"--socket={sock}", "-uroot", "-e", sql],
                             capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                die(f"could not create database {DB_NAME}; see {log}")
            time.sleep(0.5)
    wait_for("MariaDB", lambda: mysql_ready(settings), 60, log)
    print(f"stack: MariaDB ready at 127.0.0.1:{port} (database {DB_NAME})")
    return settings


# --------------------------------------------------------------------------- PostgreSQL

POSTGRES_HOME = STACK / "postgres"
# Settings of the stack's server: two-phase commit on (0 by default), room for a test suite's connections; the
# data only has to survive a SIGKILL of the server (not of the machine), so fsync buys nothing here. Logical
# decoding for Debezium (`pgoutput`): wal_level=logical, and room for a replication slot and a WAL sender per
# connector a test suite registers (10 of each by default).
POSTGRES_SETTINGS = {"listen_addresses": "127.0.0.1", "max_prepared_transactions": "100", "max_connections": "300",
                     "fsync": "off", "full_page_writes": "off", "log_min_messages": "warning",
                     "wal_level": "logical", "max_replication_slots": "20", "max_wal_senders": "20"}


def postgres_settings() -> dict:
    if os.environ.get("EO_PG_HOST"):
        return {
            "host": os.environ["EO_PG_HOST"],
            "port": int(os.environ.get("EO_PG_PORT", "5432")),
            "user": os.environ.get("EO_PG_USER", "postgres"),
            "password": os.environ.get("EO_PG_PASSWORD", ""),
            "database": os.environ.get("EO_PG_DATABASE", DB_NAME),
            "external": True,
        }
    return {"host": "127.0.0.1", "port": POSTGRES_PORT, "user": DB_USER, "password": DB_PASSWORD,
            "database": DB_NAME, "external": False}


def postgres_ready(settings: dict) -> bool:
    import psycopg

    try:
        psycopg.connect(host=settings["host"], port=settings["port"], user=settings["user"],
                        password=settings["password"], dbname=settings["database"], connect_timeout=2).close()
        return True
    except psycopg.Error:
        return False


def postgres_bin_dir() -> Path:
    """Debian's PostgreSQL server programs (``initdb``, ``postgres``, ``psql``), the newest installed."""
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).resolve().parent
    installed = [p for p in Path("/usr/lib/postgresql").glob("*/bin/initdb") if p.parent.parent.name.isdigit()]
    if not installed:
        die("PostgreSQL's 'initdb' not found: install PostgreSQL (Debian: apt-get update && apt-get install "
            "postgresql), or set EO_PG_HOST to use your server")
    return max(installed, key=lambda p: int(p.parent.parent.name)).parent


def postgres_user() -> dict[str, Any]:
    """As root, the server runs as Debian's ``postgres`` user (PostgreSQL refuses to run as root)."""
    if os.geteuid() != 0:
        return {}
    import pwd

    try:
        entry = pwd.getpwnam("postgres")
    except KeyError:
        die("running as root needs the 'postgres' OS user that Debian's postgresql package creates")
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def postgres_root(home: Path, as_user: dict[str, Any]) -> Path:
    """The folder of the server's data directory (``data``) and socket, and its working directory.

    ``home`` itself when the server's OS user can reach it. When it cannot (root's clone in a folder closed to
    others, like ``/root`` or a ``mktemp -d`` folder: the server runs as ``postgres``), a folder of that user's
    under /var/tmp, which ``home/root`` links to; every path the server is given is that folder's, never one
    through ``home``. ``clean`` removes it with the stack.
    """
    link = home / "root"
    if link.is_symlink():
        return link.resolve()
    if (home / "data").is_symlink():  # the layout of earlier releases: only the data directory lived elsewhere
        return (home / "data").resolve().parent
    if not as_user or reaches(home, as_user):
        return home
    elsewhere = Path("/var/tmp") / f"airflow-eo-postgres-{uuid.uuid5(uuid.NAMESPACE_URL, str(home)).hex[:12]}"
    if elsewhere.exists():  # a stack once at this path was removed without `clean`: its data is not ours
        shutil.rmtree(elsewhere)
    elsewhere.mkdir(mode=0o700, parents=True)
    os.chown(elsewhere, as_user["user"], as_user["group"])
    link.symlink_to(elsewhere)
    return elsewhere


def reaches(folder: Path, as_user: dict[str, Any]) -> bool:
    """Whether ``as_user`` can enter and write ``folder`` (every parent searchable): asked as that user, so that
    groups and ACLs count as the kernel counts them."""
    return subprocess.run(["test", "-x", str(folder), "-a", "-w", str(folder)], **as_user).returncode == 0


def postgres_roots() -> list[Path]:
    """The folders outside ``.stack`` that the stack's PostgreSQL servers keep their data in (see
    :func:`postgres_root`)."""
    links = [home / "root" for home in (POSTGRES_HOME, SECOND_POSTGRES)] + [
        home / "data" for home in (POSTGRES_HOME, SECOND_POSTGRES)]
    return [link.resolve() if link.name == "root" else link.resolve().parent for link in links if link.is_symlink()]


def wait_until_reaped(postmaster_pid: Path, socket_lock: Path, log: Path, timeout: float = 30) -> None:
    """Wait until a killed postmaster is dead, and clear its lock files if only its zombie is left.

    A new postmaster refuses to start while the pid in ``postmaster.pid`` answers ``kill(pid, 0)``, which an
    unreaped zombie does. We reap it if it is our child; a zombie of another process (e.g. the test run that
    started the server, killed by a soak it runs) may stay for as long as that process lives, so once the
    pid runs no thread any more its lock files (the data directory's and the socket's, both holding its pid)
    are stale, and PostgreSQL's documented fix is to remove them."""
    try:
        pid = int(postmaster_pid.read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            pass  # another user's pid
        if not running(pid):  # a zombie nobody here can reap
            postmaster_pid.unlink(missing_ok=True)
            socket_lock.unlink(missing_ok=True)
            return
        time.sleep(0.05)
    die(f"the previous PostgreSQL server (pid {pid}) is still there after {timeout:.0f}s; see {log}")


def postgres_up(home: Path | None = None, port: int = POSTGRES_PORT) -> dict:
    """Start (or find running) the PostgreSQL server of ``home`` on ``port`` (default: the stack's, or the user's
    server of ``EO_PG_HOST``): its own data under ``home``."""
    settings = postgres_settings() if home is None else {
        "host": "127.0.0.1", "port": port, "user": DB_USER, "password": DB_PASSWORD, "database": DB_NAME,
        "external": False}
    if settings["external"]:
        print(f"stack: using your PostgreSQL at {settings['host']}:{settings['port']} (EO_PG_HOST)")
        if not postgres_ready(settings):
            die(f"cannot connect to PostgreSQL at {settings['host']}:{settings['port']} as {settings['user']} "
                f"(database {settings['database']}); check EO_PG_* settings")
        return settings
    home = home or POSTGRES_HOME
    pid_file, log = home / "postgres.pid", home / "postgres.log"
    if pid_alive(pid_file):
        wait_for("PostgreSQL", lambda: postgres_ready(settings), 60, log)
        print(f"stack: PostgreSQL already running at 127.0.0.1:{port}")
        return settings
    if port_open(port):
        die(f"port {port} is taken by another process; set EO_STACK_PG_PORT, or EO_PG_HOST to use that server")
    bin_dir, as_user = postgres_bin_dir(), postgres_user()
    home.mkdir(parents=True, exist_ok=True)
    if as_user:
        os.chown(home, as_user["user"], as_user["group"])
    # The server's OS user gets only paths under ``root`` (its working directory included); our own files (the
    # pid file, the log the server writes through an inherited descriptor) stay in ``home``.
    root = postgres_root(home, as_user)
    data = root / "data"
    wait_until_reaped(data / "postmaster.pid", root / f".s.PGSQL.{port}.lock", log)
    fresh = not (data / "PG_VERSION").exists()
    if fresh:
        done = subprocess.run([str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth-local=trust",
                               "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"],
                              capture_output=True, text=True, cwd=root, **as_user)
        if done.returncode != 0:
            die(f"initdb failed:\n{(done.stdout + done.stderr)[-3000:]}")
    server = [str(bin_dir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(root)]
    for name, value in POSTGRES_SETTINGS.items():
        server += ["-c", f"{name}={value}"]
    spawn(server, log, pid_file, cwd=root, **as_user)
    psql = [str(bin_dir / "psql"), "-h", str(root), "-p", str(port), "-U", "postgres", "-v", "ON_ERROR_STOP=1"]
    def answers() -> bool:
        if not pid_alive(pid_file):
            die(f"PostgreSQL exited while starting; last log lines:\n{log.read_text(errors='replace')[-3000:]}")
        return subprocess.run([*psql, "-c", "SELECT 1"], capture_output=True, cwd=root, **as_user).returncode == 0

    wait_for("PostgreSQL", answers, 120, log)
    if fresh:
        sql = (f"CREATE ROLE {DB_USER} LOGIN SUPERUSER REPLICATION PASSWORD '{DB_PASSWORD}';"
               f"CREATE DATABASE {DB_NAME} OWNER {DB_USER};")
        for statement in sql.split(";")[:-1]:
            done = subprocess.run([*psql, "-c", statement], capture_output=True, text=True, cwd=root, **as_user)
            if done.returncode != 0:
                die(f"could not set up PostgreSQL ({statement.split(' PASSWORD')[0]}): {done.stderr}")
    wait_for("PostgreSQL", lambda: postgres_ready(settings), 60, log)
    print(f"stack: PostgreSQL ready at 127.0.0.1:{port} (database {DB_NAME})")
    return settings


# --------------------------------------------------------------------------- env file

def stack_env(bootstrap: str, mysql: dict, postgres: dict) -> dict[str, str]:
    mysql_uri = (f"mysql://{quote(mysql['user'], safe='')}:{quote(mysql['password'], safe='')}"
                 f"@{mysql['host']}:{mysql['port']}/{quote(mysql['database'], safe='')}")
    postgres_uri = (f"postgresql://{quote(postgres['user'], safe='')}:{quote(postgres['password'], safe='')}"
                    f"@{postgres['host']}:{postgres['port']}/{quote(postgres['database'], safe='')}")
    kafka_conn = json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": bootstrap}})
    airflow_home = STACK / "airflow"
    airflow_home.mkdir(parents=True, exist_ok=True)
    lines = {
        "AIRFLOW_CONN_KAFKA_DEFAULT": kafka_conn,
        "AIRFLOW_CONN_MYSQL_DEFAULT": mysql_uri,
        "AIRFLOW_CONN_EO_OFFSET_STORE": mysql_uri,
        "AIRFLOW_CONN_POSTGRES_DEFAULT": postgres_uri,
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "EO_KAFKA_BOOTSTRAP": bootstrap,
        # The ports the services run on: a service the fault tests kill starts again on its own port whoever
        # sources this file (not on the default, when `make up` had EO_STACK_*_PORT and the shell running the
        # tests has not).
        "EO_STACK_KAFKA_PORT": str(KAFKA_PORT),
        "EO_STACK_MYSQL_PORT": str(mysql["port"]),
        "EO_STACK_PG_PORT": str(postgres["port"]),
        # The Kafka Connect worker's REST port (`make connect`; started by the tests when they need it).
        "EO_STACK_CONNECT_PORT": str(connect_module().port()),
        # Where this stack keeps its files and its replicated Kafka's ports: a test lane's stack
        # (tests/support/lanes.py) restarts its own services, not lane 1's.
        "EO_STACK_DIR": str(STACK),
        "EO_STACK_KAFKA_CLUSTER_PORT": str(KAFKA_CLUSTER_PORT),
    }
    return lines


def write_env(lines: dict[str, str]) -> Path:
    env_file = STACK / "env"
    env_file.write_text("".join(f"export {k}={shell_quote(v)}\n" for k, v in lines.items()))
    return env_file


def shell_quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


# --------------------------------------------------------------------------- Airflow

def airflow_cli(lines: dict[str, str], *args: str) -> None:
    """``airflow *args`` with the environment of ``.stack/env``; its output (which may name the database URL) is
    shown only on failure, with any password masked."""
    done = subprocess.run([sys.executable, "-m", "airflow", *args], env={**os.environ, **lines},
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        tail = re.sub(r"(://[^:/@\s]*:)[^@\s]*@", r"\1***@", (done.stdout + done.stderr)[-3000:])
        die(f"airflow {' '.join(args)} failed (exit {done.returncode}); last output:\n{tail}")


def airflow_db_migrate(lines: dict[str, str]) -> None:
    """``airflow db migrate`` (idempotent: a no-op when migrated)."""
    airflow_cli(lines, "db", "migrate")
    print(f"stack: Airflow metadata database migrated (AIRFLOW_HOME={lines['AIRFLOW_HOME']})")


def airflow_dags_reserialize(lines: dict[str, str]) -> None:
    """``airflow dags reserialize``: write every DAG of the DAG folder into the metadata database once, now.

    Each ``airflow dags test`` (and ``dag.test()``) writes the whole folder's DAGs before its run. On a database
    that has never seen them, runs started side by side insert the same rows and all but one die with an
    IntegrityError before their batch starts (seen in a fresh clone's first ``make demo``); once the rows exist,
    a run only compares them. A few seconds.
    """
    airflow_cli(lines, "dags", "reserialize")
    print(f"stack: the DAGs of {lines['AIRFLOW__CORE__DAGS_FOLDER']} written to the metadata database")


def spark_class_archive() -> None:
    """The Spark driver's class-data-sharing archive (:mod:`airflow_eo.spark.class_archive`), made now rather than
    in the background of the first batch: every driver started after it (each DAG run's, each test's) starts ~3 s
    sooner. Once per pyspark and Java, ~15 s; a failure only costs the speed-up."""
    done = subprocess.run([sys.executable, "-m", "airflow_eo.spark.class_archive", "--cache", str(CACHE)],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    said = (done.stdout.strip().splitlines() or [f"not made (exit {done.returncode})"])[-1]
    print(f"stack: {said}")


# --------------------------------------------------------------------------- commands

def up() -> None:
    STACK.mkdir(parents=True, exist_ok=True)
    bootstrap = kafka_up()
    mysql = mariadb_up()
    postgres = postgres_up()
    lines = stack_env(bootstrap, mysql, postgres)
    env_file = write_env(lines)
    airflow_db_migrate(lines)
    airflow_dags_reserialize(lines)
    spark_class_archive()
    print(f"stack: up; connections in {env_file} (source it)")


def stop(name: str, pid_file: Path, how: signal.Signals = signal.SIGTERM) -> None:
    stop_together({name: pid_file}, how)


def stop_together(services: dict[str, Path], how: signal.Signals = signal.SIGTERM) -> None:
    """Signal every service at once, give them 30 s together, then SIGKILL what is left. The nodes of a KRaft
    cluster must go together: stopped one after another, the last voter waits for a quorum that is gone and takes
    the whole 30 s (seen: a 35 s teardown of the three-node cluster)."""
    running = {name: (pid_file, pid) for name, pid_file in services.items() if (pid := pid_alive(pid_file))}
    for _, pid in running.values():
        os.killpg(pid, how)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(pid_alive(pid_file) for pid_file, _ in running.values()):
        time.sleep(0.3)
    for name, (pid_file, pid) in running.items():
        if pid_alive(pid_file):
            os.killpg(pid, signal.SIGKILL)
        pid_file.unlink(missing_ok=True)
        print(f"stack: {name} stopped")


def connect_module() -> ModuleType:
    """scripts/stack_connect.py, the stack's Kafka Connect worker (a fresh import: its port is read at import)."""
    spec = importlib.util.spec_from_file_location("eo_stack_connect", Path(__file__).with_name("stack_connect.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def connect() -> str:
    """``make connect``: the Kafka Connect worker with Debezium's PostgreSQL connector (started, or found running);
    its REST URL."""
    return connect_module().up(SimpleNamespace(**globals()))


def down() -> None:
    # The worker before the broker: stopped after it, it would wait for the gone broker to commit its offsets.
    connect_module().down(SimpleNamespace(**globals()))
    kafka_cluster_down()
    stop("Kafka", STACK / "kafka" / "kafka.pid")
    stop("MariaDB", STACK / "mariadb" / "mariadb.pid")
    stop("second MariaDB", SECOND_MARIADB / "mariadb.pid")
    # SIGINT: PostgreSQL's fast shutdown (SIGTERM waits for every client to disconnect).
    stop("PostgreSQL", POSTGRES_HOME / "postgres.pid", signal.SIGINT)
    stop("second PostgreSQL", SECOND_POSTGRES / "postgres.pid", signal.SIGINT)


def clean() -> None:
    """``down``, then remove ``.stack`` and the folders outside it that the stack's PostgreSQL kept its data in."""
    down()
    for root in postgres_roots():
        shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(STACK, ignore_errors=True)
    print(f"stack: removed {STACK}")


def status() -> None:
    for name, pid_file in (("Kafka", STACK / "kafka" / "kafka.pid"),
                           ("Kafka Connect", STACK / "connect" / "connect.pid"),
                           ("MariaDB", STACK / "mariadb" / "mariadb.pid"),
                           ("PostgreSQL", POSTGRES_HOME / "postgres.pid"),
                           ("second MariaDB", SECOND_MARIADB / "mariadb.pid"),
                           ("second PostgreSQL", SECOND_POSTGRES / "postgres.pid")):
        pid = pid_alive(pid_file)
        print(f"{name}: {f'running (pid {pid})' if pid else 'stopped'}")


# --------------------------------------------------------------------------- faults (tests)

SECOND_MARIADB = STACK / "mariadb-2"
SECOND_MARIADB_PORT = MARIADB_PORT + 1
SECOND_POSTGRES = STACK / "postgres-2"
SECOND_POSTGRES_PORT = POSTGRES_PORT + 1
PID_FILES = {"mariadb": STACK / "mariadb" / "mariadb.pid", "kafka": STACK / "kafka" / "kafka.pid",
             "postgres": POSTGRES_HOME / "postgres.pid"}


def kill(service: str) -> int:
    """SIGKILL the service's process group, as a crash of its machine would: no shutdown, no flush.

    Returns the killed pid; waits until it is gone (its ports and files are free for a restart).
    """
    pid = pid_alive(PID_FILES[service])
    if not pid:
        die(f"{service} is not running (no live pid in {PID_FILES[service]})")
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and running(pid):
        time.sleep(0.05)
    return pid


def pid_file_of(service: str) -> Path:
    """``mariadb``, ``kafka``, or ``kafka-node-N`` (a node of the three-node cluster)."""
    if service.startswith("kafka-node-"):
        return kafka_cluster_node(int(service.rsplit("-", 1)[1]))[0] / "kafka.pid"
    return PID_FILES[service]


def start(service: str) -> None:
    """Start a killed service again on its data (crash recovery: InnoDB's redo log, Kafka's log
    recovery); returns once it answers (a cluster node: once it runs, it rejoins on its own)."""
    if service == "mariadb":
        mariadb_up(STACK / "mariadb", MARIADB_PORT)
    elif service == "postgres":
        postgres_up()
    elif service.startswith("kafka-node-"):
        kafka_cluster_start(int(service.rsplit("-", 1)[1]))
    else:
        local_kafka_up()


def restart(service: str) -> None:
    if pid_alive(PID_FILES[service]):
        kill(service)
    start(service)


# Kafka's LogManager writes its first log-start checkpoint 30s after the broker starts, then every
# log.flush.start.offset.checkpoint.interval.ms (1s here).
KAFKA_FIRST_CHECKPOINT_S = 30


def wait_until_deleted_records_stay_deleted() -> None:
    """Wait until records deleted with DeleteRecords stay deleted across a SIGKILL of the stack's broker.

    DeleteRecords moves a partition's start in memory only; a broker killed before its next log-start
    checkpoint comes back with the deleted records readable again (seen here: 500 deleted records back).
    """
    started = PID_FILES["kafka"].stat().st_mtime
    time.sleep(max(0.0, started + KAFKA_FIRST_CHECKPOINT_S - time.time()) + 2)


def second_mariadb_up() -> dict:
    """A second MariaDB server (``.stack/mariadb-2``, next port): store and sink on two servers."""
    return mariadb_up(SECOND_MARIADB, SECOND_MARIADB_PORT)


def second_mariadb_down() -> None:
    stop("second MariaDB", SECOND_MARIADB / "mariadb.pid")


def second_postgres_up() -> dict:
    """A second PostgreSQL server (``.stack/postgres-2``, next port, the first's settings): store and sink on two
    servers. Also starts it again after a SIGKILL (:func:`postgres_up` waits until the killed one is reaped)."""
    return postgres_up(SECOND_POSTGRES, SECOND_POSTGRES_PORT)


def second_postgres_down() -> None:
    stop("second PostgreSQL", SECOND_POSTGRES / "postgres.pid", signal.SIGINT)


# --------------------------------------------------------------------------- replicated Kafka (tests)

KAFKA_CLUSTER = STACK / "kafka-cluster"
# Below the kernel's ephemeral ports (32768+), which a client socket may hold when a node restarts.
KAFKA_CLUSTER_PORT = int(os.environ.get("EO_STACK_KAFKA_CLUSTER_PORT", "29192"))
KAFKA_CLUSTER_PORTS = {n: KAFKA_CLUSTER_PORT + 2 * (n - 1) for n in (1, 2, 3)}  # controllers one above


def kafka_cluster_node(node_id: int) -> tuple[Path, int]:
    return KAFKA_CLUSTER / f"node-{node_id}", KAFKA_CLUSTER_PORTS[node_id]


def kafka_cluster_start(node_id: int) -> str:
    """Start (again) one node of the three-node cluster; the first start formats all with one cluster id."""
    KAFKA_CLUSTER.mkdir(parents=True, exist_ok=True)
    id_file = KAFKA_CLUSTER / "cluster.id"
    if not id_file.exists():
        id_file.write_text(cluster_id())
    home, port = kafka_cluster_node(node_id)
    voters = {n: p + 1 for n, p in KAFKA_CLUSTER_PORTS.items()}
    return kafka_node_up(home, node_id, port, voters, replicas=3, heap="512m", cluster=id_file.read_text())


def kafka_cluster_up() -> str:
    """A three-node KRaft cluster on loopback (``.stack/kafka-cluster``): every node a broker and a
    controller, topics and the transaction state log replicated three times with ``min.insync.replicas=2``.
    Not part of ``up``; returns the bootstrap servers."""
    bootstrap = ",".join(kafka_cluster_start(n) for n in KAFKA_CLUSTER_PORTS)
    wait_for("the Kafka cluster", lambda: kafka_cluster_ready(bootstrap), 120, KAFKA_CLUSTER / "node-1" / "server.log")
    print(f"stack: three-node Kafka cluster ready at {bootstrap}")
    return bootstrap


def kafka_cluster_ready(bootstrap: str) -> bool:
    from confluent_kafka.admin import AdminClient

    try:
        return len(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=3).brokers) == 3
    except Exception:
        return False


def kafka_cluster_down() -> None:
    stop_together({f"Kafka cluster node {node_id}": kafka_cluster_node(node_id)[0] / "kafka.pid"
                   for node_id in KAFKA_CLUSTER_PORTS})


if __name__ == "__main__":
    commands = {"up": up, "down": down, "status": status, "clean": clean, "connect": connect}
    services = ("mariadb", "postgres", "kafka")
    args = sys.argv[1:]
    if len(args) == 1 and args[0] in commands:
        commands[args[0]]()
    elif len(args) == 2 and args[0] in ("kill", "restart") and args[1] in services:
        (kill if args[0] == "kill" else restart)(args[1])
        print(f"stack: {args[1]} {args[0]}ed")
    elif args == ["kill", "connect"]:  # started again by `connect`
        connect_module().kill(SimpleNamespace(**globals()))
        print("stack: connect killed")
    elif args in (["second-mariadb", "up"], ["second-mariadb", "down"]):
        second_mariadb_up() if args[1] == "up" else second_mariadb_down()
    elif args in (["postgres", "up"], ["postgres", "down"]):  # the stack's PostgreSQL alone
        postgres_up() if args[1] == "up" else stop("PostgreSQL", POSTGRES_HOME / "postgres.pid", signal.SIGINT)
    elif args in (["second-postgres", "up"], ["second-postgres", "down"]):
        second_postgres_up() if args[1] == "up" else second_postgres_down()
    elif args in (["kafka-cluster", "up"], ["kafka-cluster", "down"]):
        kafka_cluster_up() if args[1] == "up" else kafka_cluster_down()
    else:
        die("usage: stack.py up|down|status|clean|connect | kill|restart mariadb|postgres|kafka | kill connect "
            "| postgres up|down "
            "| second-mariadb up|down | second-postgres up|down | kafka-cluster up|down")
