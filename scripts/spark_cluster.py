"""Local Spark cluster for airflow_eo, on loopback: a standalone master, two workers, two Spark Connect servers.

Usage: ``python scripts/spark_cluster.py up|down|status`` (``make spark-cluster`` / ``make spark-cluster-down``).

Started from the installed pyspark's jars (``pyspark/bin/spark-class``, ``spark-submit``), each part in its own
JVM and process group:

- master ``spark://127.0.0.1:27077`` (web UI on 127.0.0.1:27080, whose ``/json`` the script polls);
- two workers (127.0.0.1:27078 and :27079, UIs :27081 and :27082), 1 core and 1g each
  (``EO_SPARK_WORKER_CORES``, ``EO_SPARK_WORKER_MEMORY``); executors run in processes of their own, with
  ``SPARK_WORKER_DIR`` and local dirs under ``.stack/spark/``;
- a Spark Connect server ``sc://127.0.0.1:25002`` (its own driver, ``local[2]`` unless
  ``EO_SPARK_CONNECT_MASTER`` says otherwise: a long-lived Connect application on the standalone cluster
  would hold its executors, and so the cluster's two cores, for as long as it runs) with Spark's Kafka
  connector on its classpath;
- a second Connect server on 25003 that requires a pre-shared token (``spark.connect.authenticate.token``,
  passed in its environment as ``SPARK_CONNECT_AUTHENTICATE_TOKEN`` so that ``ps`` does not show it).
  pyspark's client sends a token over TLS unless the host is literally ``localhost`` (then gRPC's local
  credentials, plaintext on loopback), so its URL is ``sc://localhost:25003/;token=...``.

Executors and Connect's Python workers run the Python of a second environment,
``.stack/spark-worker-venv`` (pyspark at the driver's version, pyarrow, pandas, pymysql, psycopg; no airflow_eo,
no Airflow), created by ``up``. A classic session started from a running Python (an Airflow worker)
takes its executors' Python from ``PYSPARK_PYTHON`` in the driver's environment when the session starts:
pyspark's SparkContext ignores ``spark.pyspark.python`` (read by spark-submit and the Connect server only).

Every JVM gets ``SPARK_LOCAL_IP=127.0.0.1``; nothing listens on another address. Ports are overridable:
``EO_SPARK_MASTER_PORT``, ``EO_SPARK_MASTER_UI_PORT``, ``EO_SPARK_WORKER_PORT`` / ``EO_SPARK_WORKER_UI_PORT``
(first worker; the second uses the next port), ``EO_SPARK_CONNECT_PORT``, ``EO_SPARK_CONNECT_TOKEN_PORT``
(each Connect driver's RPC and block manager ports are the Connect port + 10 and + 20).

``up`` is idempotent (running parts are reused) and writes ``.stack/spark/env`` (mode 0600: it holds the
token), a file to ``source`` that exports ``EO_SPARK_*`` and the Airflow connections ``spark_cluster``,
``spark_connect`` and ``spark_connect_token``. ``down`` stops every part and any executor or Python worker
left running under ``.stack/spark/``.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spark_parts import SPARK, Part, die, launch, leftovers, ready_or_start_again, say, spark_pid, terminate, wait_until
from stack import REPO, STACK, port_open, require, shell_quote

WORKER_VENV = STACK / "spark-worker-venv"
WORKER_PYTHON = WORKER_VENV / "bin" / "python"
TOKEN_FILE = SPARK / "connect-token"
HOST = "127.0.0.1"


def _port(name: str, default: int) -> int:
    return int(os.environ.get(name, str(default)))


MASTER_PORT = _port("EO_SPARK_MASTER_PORT", 27077)
MASTER_UI_PORT = _port("EO_SPARK_MASTER_UI_PORT", 27080)
WORKER_PORT = _port("EO_SPARK_WORKER_PORT", 27078)
WORKER_UI_PORT = _port("EO_SPARK_WORKER_UI_PORT", 27081)
CONNECT_PORT = _port("EO_SPARK_CONNECT_PORT", 25002)
CONNECT_TOKEN_PORT = _port("EO_SPARK_CONNECT_TOKEN_PORT", 25003)
MASTER_URL = f"spark://{HOST}:{MASTER_PORT}"
CONNECT_MASTER = os.environ.get("EO_SPARK_CONNECT_MASTER", "local[2]")
WORKER_CORES = os.environ.get("EO_SPARK_WORKER_CORES", "1")
WORKER_MEMORY = os.environ.get("EO_SPARK_WORKER_MEMORY", "1g")
EXECUTOR_MEMORY = "512m"
WORKERS = 2


CONNECT_READY_SECONDS = 150  # a Connect server listens within ~10 s here; a loaded CI machine may take longer

MASTER = Part("master", (MASTER_PORT, MASTER_UI_PORT))
WORKER_PARTS = [Part(f"worker{i + 1}", (WORKER_PORT + i, WORKER_UI_PORT + i)) for i in range(WORKERS)]
CONNECT = Part("connect", (CONNECT_PORT,))
CONNECT_TOKEN = Part("connect-token", (CONNECT_TOKEN_PORT,))
PARTS = [MASTER, *WORKER_PARTS, CONNECT, CONNECT_TOKEN]


# --------------------------------------------------------------------------- helpers

def pyspark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def pyspark_version() -> str:
    import pyspark

    return pyspark.__version__


def base_env() -> dict[str, str]:
    """Environment of every JVM: loopback only, our conf dir (no user spark-env.sh), our local dirs."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SPARK_", "PYSPARK_")) and k not in ("HADOOP_CONF_DIR", "YARN_CONF_DIR")}
    conf_dir = SPARK / "conf"
    conf_dir.mkdir(parents=True, exist_ok=True)
    env.update({
        "SPARK_HOME": str(pyspark_home()),
        "SPARK_CONF_DIR": str(conf_dir),
        "SPARK_LOCAL_IP": HOST,
        "SPARK_LOCAL_HOSTNAME": HOST,
        "SPARK_DAEMON_MEMORY": "512m",
        "PYSPARK_PYTHON": str(WORKER_PYTHON),
        "PYSPARK_DRIVER_PYTHON": str(WORKER_PYTHON),
    })
    return env


def write_properties(name: str, props: dict[str, str]) -> Path:
    path = SPARK / "conf" / f"{name}.properties"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k} {v}\n" for k, v in props.items()))
    return path


def master_state() -> dict | None:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{MASTER_UI_PORT}/json/", timeout=2) as response:
            return json.load(response)
    except (OSError, ValueError):
        return None


def alive_worker_ports() -> set[int]:
    state = master_state() or {}
    return {w.get("port") for w in state.get("workers", []) if w.get("state") == "ALIVE"}


def alive_workers() -> int:
    return len(alive_worker_ports())


def check_free(part: Part) -> None:
    for port in part.ports:
        if port_open(port):
            die(f"port {port} ({part.name}) is taken by another process; set the EO_SPARK_*_PORT variables "
                "(see scripts/spark_cluster.py) to other ports")


# --------------------------------------------------------------------------- worker Python

def worker_venv() -> Path:
    """The executors' Python: pyspark at the driver's version, pyarrow, pandas, pymysql, psycopg; no airflow_eo."""
    from importlib.metadata import PackageNotFoundError, version

    stamp = WORKER_VENV / ".installed"
    wanted = [f"pyspark=={pyspark_version()}"]
    for package in ("pyarrow", "pandas", "PyMySQL", "psycopg", "psycopg-binary"):
        try:
            wanted.append(f"{package}=={version(package)}")  # the driver's version
        except PackageNotFoundError:
            wanted.append(package)
    if stamp.exists() and stamp.read_text().split() == wanted and WORKER_PYTHON.exists():
        return WORKER_PYTHON
    say(f"creating the executors' Python environment {WORKER_VENV} ({' '.join(wanted)})")
    python3 = require("python3", "install Python 3 (with the venv module)")
    if not WORKER_PYTHON.exists():
        subprocess.run([python3, "-m", "venv", str(WORKER_VENV)], check=True)
    subprocess.run([str(WORKER_PYTHON), "-m", "pip", "install", "-q", "-c", str(REPO / "constraints.txt"), *wanted],
                   check=True)
    stamp.write_text("\n".join(wanted))
    return WORKER_PYTHON


# --------------------------------------------------------------------------- parts

#: The master and the workers have neighbouring ports: one that finds its port taken must fail, not take the next
#: (Spark's default), which is another part's.
ONE_PORT_EACH = {"spark.port.maxRetries": "0"}


def master_up(env: dict[str, str]) -> None:
    if spark_pid(MASTER):
        wait_until(MASTER, lambda: master_state() is not None, 60)
        say(f"master already running at {MASTER_URL}")
        return
    check_free(MASTER)
    props = write_properties("master", {"spark.ui.showConsoleProgress": "false", "spark.master.rest.enabled": "false",
                                        **ONE_PORT_EACH})
    spark_class = str(pyspark_home() / "bin" / "spark-class")
    launch([spark_class, "org.apache.spark.deploy.master.Master", "--host", HOST, "--port", str(MASTER_PORT),
            "--webui-port", str(MASTER_UI_PORT), "--properties-file", str(props)], MASTER, env)


def worker_up(part: Part, env: dict[str, str]) -> None:
    if spark_pid(part):
        say(f"{part.name} already running")
        return
    check_free(part)
    port, ui_port = part.ports
    work, local = SPARK / "work" / part.name, SPARK / "local" / part.name
    work.mkdir(parents=True, exist_ok=True)
    local.mkdir(parents=True, exist_ok=True)
    props = write_properties(part.name, {
        **ONE_PORT_EACH,
        "spark.local.dir": str(local),
        # Remove finished applications' directories (executor logs, fetched jars) after a day.
        "spark.worker.cleanup.enabled": "true",
        "spark.worker.cleanup.appDataTtl": "86400",
    })
    spark_class = str(pyspark_home() / "bin" / "spark-class")
    launch([spark_class, "org.apache.spark.deploy.worker.Worker", MASTER_URL, "--host", HOST,
            "--port", str(port), "--webui-port", str(ui_port), "--cores", WORKER_CORES, "--memory", WORKER_MEMORY,
            "--work-dir", str(work), "--properties-file", str(props)],
           part, {**env, "SPARK_WORKER_DIR": str(work), "SPARK_LOCAL_DIRS": str(local)})


def connect_conf(part: Part, port: int, worker_python: Path) -> dict[str, str]:
    local = SPARK / "local" / part.name
    local.mkdir(parents=True, exist_ok=True)
    conf = {
        "spark.master": CONNECT_MASTER,
        "spark.app.name": f"airflow_eo {part.name}",
        "spark.connect.grpc.binding.address": HOST,
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": HOST,
        "spark.driver.bindAddress": HOST,
        "spark.driver.port": str(port + 10),
        "spark.blockManager.port": str(port + 20),
        "spark.driver.memory": "1g",
        "spark.executor.memory": EXECUTOR_MEMORY,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.local.dir": str(local),
        "spark.sql.warehouse.dir": str(SPARK / "warehouse"),
        "spark.pyspark.python": str(worker_python),
        "spark.pyspark.driver.python": str(worker_python),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
    }
    if CONNECT_MASTER.startswith("spark://"):
        conf["spark.cores.max"] = "1"
    return conf


def connect_up(part: Part, port: int, worker_python: Path, env: dict[str, str], token: str | None) -> None:
    if spark_pid(part):
        say(f"{part.name} already running on {HOST}:{port}")
        return
    check_free(part)
    from airflow_eo.delta.specs import DELTA_SPARK_CONF
    from airflow_eo.iceberg.specs import ICEBERG_EXTENSIONS, ICEBERG_PACKAGE
    from airflow_eo.spark.jars import kafka_connector_jars, pinned_package_jars

    jars = kafka_connector_jars()
    if not jars:
        die("Spark's Kafka connector could not be resolved (is Maven installed? `make maven`)")
    # The lakehouse sinks' jars and SQL extensions: static conf, which a Connect client cannot add to the server.
    for package in (DELTA_SPARK_CONF["spark.jars.packages"], ICEBERG_PACKAGE):
        jars += [j for j in pinned_package_jars(package) or [] if j not in jars]
    conf = {**connect_conf(part, port, worker_python),
            "spark.sql.extensions": f"{DELTA_SPARK_CONF['spark.sql.extensions']},{ICEBERG_EXTENSIONS}",
            "spark.sql.catalog.spark_catalog": DELTA_SPARK_CONF["spark.sql.catalog.spark_catalog"]}
    props = write_properties(part.name, conf)
    env = {**env, "SPARK_LOCAL_DIRS": str(SPARK / "local" / part.name)}
    if token:
        env["SPARK_CONNECT_AUTHENTICATE_TOKEN"] = token
    spark_submit = str(pyspark_home() / "bin" / "spark-submit")
    launch([spark_submit, "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--name", f"airflow_eo {part.name}", "--properties-file", str(props), "--jars", ",".join(jars)],
           part, env)


def connect_token() -> str:
    if TOKEN_FILE.exists() and TOKEN_FILE.read_text().strip():
        return TOKEN_FILE.read_text().strip()
    token = secrets.token_urlsafe(24)
    TOKEN_FILE.touch(mode=0o600)
    TOKEN_FILE.write_text(token)
    return token


# --------------------------------------------------------------------------- env file

def cluster_env(worker_python: Path, token: str) -> dict[str, str]:
    cluster_conn = {
        "conn_type": "spark", "host": f"spark://{HOST}", "port": MASTER_PORT,
        "extra": {"deploy-mode": "client", "conf": {
            "spark.pyspark.python": str(worker_python),
            "spark.executor.memory": EXECUTOR_MEMORY,
            "spark.executor.cores": "1",
            "spark.cores.max": "2",
            # The driver (the Airflow worker) listens for its executors on loopback only.
            "spark.driver.host": HOST,
            "spark.driver.bindAddress": HOST,
        }},
    }
    return {
        "EO_SPARK_MASTER": MASTER_URL,
        "EO_SPARK_CONNECT": f"sc://{HOST}:{CONNECT_PORT}",
        "EO_SPARK_CONNECT_TOKEN_URL": f"sc://localhost:{CONNECT_TOKEN_PORT}",
        "EO_SPARK_CONNECT_TOKEN": token,
        "EO_SPARK_WORKER_PYTHON": str(worker_python),
        "AIRFLOW_CONN_SPARK_CLUSTER": json.dumps(cluster_conn),
        "AIRFLOW_CONN_SPARK_CONNECT": json.dumps({"conn_type": "spark_connect", "host": HOST, "port": CONNECT_PORT}),
        "AIRFLOW_CONN_SPARK_CONNECT_TOKEN": json.dumps(
            {"conn_type": "spark_connect", "host": "localhost", "port": CONNECT_TOKEN_PORT, "password": token}),
    }


def write_env(lines: dict[str, str]) -> Path:
    env_file = SPARK / "env"
    env_file.touch(mode=0o600)
    env_file.chmod(0o600)
    env_file.write_text("".join(f"export {k}={shell_quote(v)}\n" for k, v in lines.items()))
    return env_file


# --------------------------------------------------------------------------- commands

def up() -> None:
    started = time.monotonic()
    require("java", "install a Java 17+ runtime (`make java`)")
    for folder in ("logs", "conf", "run", "work", "local"):
        (SPARK / folder).mkdir(parents=True, exist_ok=True)
    worker_python = worker_venv()
    token = connect_token()
    env = base_env()
    # The master first (workers register with it); the workers and both Connect servers start in parallel.
    master_up(env)
    ready_or_start_again(MASTER, lambda: master_up(env), lambda: master_state() is not None, 90)
    for part in WORKER_PARTS:
        worker_up(part, env)
    connect_up(CONNECT, CONNECT_PORT, worker_python, env, None)
    connect_up(CONNECT_TOKEN, CONNECT_TOKEN_PORT, worker_python, env, token)
    for part in WORKER_PARTS:
        ready_or_start_again(part, lambda part=part: worker_up(part, env),
                             lambda part=part: part.ports[0] in alive_worker_ports(), 90)
    for part, port, part_token in ((CONNECT, CONNECT_PORT, None), (CONNECT_TOKEN, CONNECT_TOKEN_PORT, token)):
        ready_or_start_again(part, lambda part=part, port=port, part_token=part_token: connect_up(
            part, port, worker_python, env, part_token), lambda port=port: port_open(port), CONNECT_READY_SECONDS)
    env_file = write_env(cluster_env(worker_python, token))
    say(f"up in {time.monotonic() - started:.1f}s: master {MASTER_URL} ({alive_workers()} workers), "
        f"Connect sc://{HOST}:{CONNECT_PORT} and sc://localhost:{CONNECT_TOKEN_PORT} (token; {CONNECT_MASTER}); "
        f"settings in {env_file} (source it)")


def down() -> None:
    running = {part: pid for part in PARTS if (pid := spark_pid(part))}
    survivors = terminate(list(running.values()), group=True)  # a worker's group holds its executors
    for part in running:
        say(f"{part.name} stopped")
    for part in PARTS:
        part.pid_file.unlink(missing_ok=True)
    survivors += terminate(leftovers(), group=False)
    if survivors:
        die(f"processes {survivors} did not stop")


def status() -> None:
    for part in PARTS:
        pid = spark_pid(part)
        ports = ", ".join(f"{HOST}:{p}{'' if port_open(p) else ' (closed)'}" for p in part.ports)
        print(f"{part.name}: {f'running (pid {pid}); {ports}' if pid else 'stopped'}")
    if spark_pid(MASTER):
        print(f"workers alive: {alive_workers()} of {WORKERS}")
    parts = {spark_pid(part) for part in PARTS}
    others = [pid for pid in leftovers() if pid not in parts]
    if others:
        print(f"executors and Python workers under {SPARK}: {others}")


if __name__ == "__main__":
    commands = {"up": up, "down": down, "status": status}
    if len(sys.argv) != 2 or sys.argv[1] not in commands:
        die("usage: spark_cluster.py up|down|status")
    commands[sys.argv[1]]()
