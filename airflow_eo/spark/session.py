"""Spark sessions for airflow_eo: our defaults and the user's conf (with the jars a classic session needs, Avro's
length limits, secrets kept off spark-submit's command line), and :func:`get_session`.

The jars are resolved and verified by ``jars.py``, a Spark Connect URL is made and redacted by ``spark_connect.py``,
and the package reaches the executors by ``package_shipping.py``.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.failpoints import executor_env
from airflow_eo.core.spark_conf import SECRET_CONF_PATTERN, SPARK_SQL_REDACTION_DEFAULT, with_secret_redaction
from airflow_eo.spark.class_archive import with_class_archive
from airflow_eo.spark.jars import (
    JAR_SHA256,
    avro_coordinates,
    connector_cache_dir,
    format_jars,
    kafka_connector_coordinates,
    kafka_connector_jars,
    pinned_package_jars,
    resolve_pinned_packages,
)
from airflow_eo.spark.package_shipping import ship_package
from airflow_eo.spark.spark_connect import redacted, refuse_master_for_connect, without_secrets

# Documented before the jars had their module (docs/how-to/delta.md, security.md named them here).
__all__ = ["JAR_SHA256", "get_session", "pinned_package_jars", "session_conf"]

log = logging.getLogger(__name__)

#: Idle Kafka consumers a session's JVM keeps (``spark.kafka.consumer.cache.capacity``; Spark's default is 64).
KAFKA_CONSUMERS_KEPT = 2

#: Defaults for a micro-batch; any of them can be overridden by the user's conf.
DEFAULT_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "1g",
    # Spark's Kafka source reads with consumers of the query's own group and keeps this many idle for five minutes:
    # a later query never uses them (its group is another), and each holds its topic's metadata and last fetch. At
    # Spark's 64, a batch over 1,000 partitions grew a local driver's JVM to 1.3-1.5 GiB, 2.3x a 3-partition batch's
    # (docs/explanation/benchmark.md, "Breadth").
    "spark.kafka.consumer.cache.capacity": str(KAFKA_CONSUMERS_KEPT),
    # Secrets a sink's catalog puts in the conf (an Iceberg REST credential, s3/adls keys): redacted in the UI and
    # the event log (a user's own regex gets this one added: session_conf).
    "spark.redaction.regex": SECRET_CONF_PATTERN,
    "spark.sql.redaction.options.regex": with_secret_redaction(SPARK_SQL_REDACTION_DEFAULT),
}

#: Avro's length limits (Avro 1.12, under spark-avro's ``from_avro``): Java system properties, read once per JVM.
#: Avro allocates a string, bytes or collection at the length its record claims before reading it, so a corrupt or
#: hostile record claiming ~2 GiB would exhaust the executor's heap (an ``OutOfMemoryError`` no parse mode catches);
#: over the limit it is a ``SystemLimitException``, which ``from_avro`` in PERMISSIVE mode makes a bad record.
AVRO_LIMIT_PROPERTIES = ("org.apache.avro.limits.string.maxLength", "org.apache.avro.limits.bytes.maxLength",
                         "org.apache.avro.limits.collectionItems.maxLength")
#: The limit our sessions set, unless the user's ``extraJavaOptions`` name the property: far above any Kafka record
#: (a topic's ``max.message.bytes`` is 1 MiB by default and bounds a *compressed* batch, so a record may be larger,
#: but not 64 MiB in practice), far below an executor's heap. One value per JVM: every topic a session reads shares it.
AVRO_MAX_LENGTH = 64 * 1024 * 1024


def session_conf(conf: Mapping[str, Any] | None = None, remote: bool = False) -> dict[str, str]:
    """Our defaults + the user's conf, with the Kafka connector added unless the user configured it.

    ``remote`` (Spark Connect): the server owns its static conf and jars; only our SQL defaults
    and the user's conf are sent.
    """
    user = {k: str(v) for k, v in (conf or {}).items()}
    for key in ("spark.redaction.regex", "spark.sql.redaction.options.regex"):
        if key in user:
            user[key] = with_secret_redaction(user[key])
    if remote:
        return {**{k: v for k, v in DEFAULT_CONF.items() if k.startswith("spark.sql.")}, **user}
    merged = {**DEFAULT_CONF, **user}
    for name, resolved, coordinates in (("spark-sql-kafka", kafka_connector_jars, kafka_connector_coordinates),
                                        ("spark-avro", format_jars, avro_coordinates)):
        packages, jars = merged.get("spark.jars.packages", ""), merged.get("spark.jars", "")
        if name in packages or name in jars:
            continue
        try:
            found = resolved()
        except ConfigurationError:
            if name == "spark-sql-kafka":
                raise
            # Only Avro pipelines need it: the others must not fail for it (from_avro then says what is missing).
            log.warning("Spark's Avro functions are not available: %s", coordinates(), exc_info=True)
            continue
        if found:
            merged["spark.jars"] = ",".join(p for p in (jars, *found) if p)
        else:  # no Maven here: let Spark resolve the package itself
            merged["spark.jars.packages"] = ",".join(p for p in (packages, coordinates()) if p)
    # The driver's JVM is the executor in local mode; a cluster's executors get theirs. Applied when the session's
    # JVM starts (pyspark passes the conf to spark-submit): a session already running keeps what it started with.
    for side in ("driver", "executor"):
        merged[f"spark.{side}.extraJavaOptions"] = with_avro_limits(merged.get(f"spark.{side}.extraJavaOptions", ""))
    return resolve_pinned_packages(merged)



def with_avro_limits(java_options: str, limit: int = AVRO_MAX_LENGTH) -> str:
    """``java_options`` with ``-D`` of Avro's length limits (:data:`AVRO_LIMIT_PROPERTIES`) it does not set."""
    added = [f"-D{name}={limit}" for name in AVRO_LIMIT_PROPERTIES if f"-D{name}=" not in java_options]
    return " ".join(o for o in (java_options.strip(), *added) if o)


def get_session(master: str | None = None, remote: str | None = None, conf: Mapping[str, Any] | None = None,
                app_name: str = "airflow_eo") -> Any:
    """Get (or create) the Spark session, with this package shipped to where its code runs.

    ``remote`` selects Spark Connect (``sc://host:port/;token=...``), else ``master`` a classic
    session in client mode (``local[*]``, ``spark://``, ``yarn``, ``k8s://``). The session is
    reused across batches of one process; conf of an existing session is not changed (Spark
    cannot change static conf at run time). Executors need pyspark, pyarrow and pymysql, never
    ``airflow_eo``: the partition writers reach them with the session (:func:`ship_package`).
    """
    from pyspark.sql import SparkSession

    user_conf = dict(conf or {})
    merged = session_conf(conf, remote=remote is not None)
    if remote:
        refuse_master_for_connect(merged)
    else:
        merged.update(executor_env())  # crash tests only: armed failpoints reach a cluster's executors
        merged["spark.driver.extraJavaOptions"] = with_class_archive(merged.get("spark.driver.extraJavaOptions", ""),
                                                                     connector_cache_dir())
    local = not remote and (master or "local").startswith("local")
    # Every builder call is inside the try: pyspark validates the URL at remote() and at each config(), and its
    # errors echo the URL, token included (percent-encoded: a spelling Airflow's masker does not know).
    try:
        builder = SparkSession.builder.appName(app_name)
        if remote:
            builder = builder.remote(remote)
        else:
            builder = builder.master(master or "local[*]")
            if local:
                # Local executors run this very Python (with airflow_eo installed), bound to loopback.
                os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
                # Nothing outside this machine talks to a local driver: its RPC and block manager listen on loopback
                # (by default on the address the host name resolves to, e.g. a LAN interface's).
                for key in ("spark.driver.bindAddress", "spark.driver.host"):
                    merged.setdefault(key, "127.0.0.1")
            elif "spark.pyspark.python" in merged:
                # A classic session started from a running Python tells executors PYSPARK_PYTHON, never
                # the conf (which only spark-submit's launcher reads): the cluster's Python must go there.
                os.environ["PYSPARK_PYTHON"] = merged["spark.pyspark.python"]
                builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
                    "spark.driver.host", "127.0.0.1")
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        # A classic session's conf is spark-submit's command line (--conf k=v), which every local user can read:
        # secrets that a running session takes are set on it instead (Spark Connect sends its conf over gRPC).
        launch, later = (merged, {}) if remote else split_secret_conf(merged)
        for key, value in launch.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        set_secret_conf(session, later)
        if not remote and "spark.kafka.consumer.cache.capacity" not in user_conf:
            quiet_kafka_consumer_pool(session)
        if remote:
            session.version  # noqa: B018 - one round trip: a wrong URL or token fails here, not mid-batch
    except Exception as exc:  # surface a message that says what to fix
        if remote:
            # Never chained (``from None``): pyspark's errors may echo the URL, its token percent-encoded, a form
            # Airflow's secret masker does not know.
            said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigurationError(f"cannot open a Spark Connect session at {without_secrets(remote)}: "
                                     f"{redacted(said, remote)}") from None
        if "spark-sql-kafka" in str(exc) or "unresolved dependency" in str(exc):
            raise ConfigurationError(
                f"could not resolve Spark's Kafka connector {kafka_connector_coordinates()} from Maven "
                "Central; install a pyspark version whose connector is published, or put the connector "
                "jar in spark.jars"
            ) from exc
        raise
    if not local:
        ship_package(session, remote=remote is not None)
    log.info("Spark session on %s (%s)", without_secrets(remote) if remote else master or "local[*]",
             "Spark Connect" if remote else "classic, client mode")
    return session


#: Spark's Kafka consumer pool, which warns at every read past its capacity (kept small on purpose:
#: :data:`KAFKA_CONSUMERS_KEPT`).
KAFKA_CONSUMER_POOL_LOGGER = "org.apache.spark.sql.kafka010.consumer.InternalKafkaConsumerPool"


def quiet_kafka_consumer_pool(session: Any) -> None:
    """Only the pool's errors in the driver's log (a local session's executors log there too): past our small
    capacity it warns "Pool exceeds its soft max size" at every partition read, which says nothing wrong."""
    try:
        log4j = session.sparkContext._jvm.org.apache.logging.log4j
        log4j.core.config.Configurator.setLevel(KAFKA_CONSUMER_POOL_LOGGER, log4j.Level.ERROR)
    except Exception:  # another logging backend: the warnings stay, nothing else changes
        log.debug("could not quiet %s", KAFKA_CONSUMER_POOL_LOGGER, exc_info=True)


#: Where a secret of the Spark conf may be set on a running session: Hadoop's (file systems: s3a, abfs, gs keys) and
#: Spark SQL's (a catalog's properties).
RUNTIME_SECRET_PREFIXES = ("spark.hadoop.", "spark.sql.")


def split_secret_conf(conf: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``conf`` as ``(launch, later)``: ``later`` the secrets (keys :data:`SECRET_CONF_PATTERN` matches) that a
    running session takes (:data:`RUNTIME_SECRET_PREFIXES`), kept off spark-submit's command line; another secret
    key (Spark's own, read at launch only) stays at launch, warned about by name."""
    import re

    secret = re.compile(SECRET_CONF_PATTERN)
    launch, later = {}, {}
    for key, value in conf.items():
        if key.startswith(("spark.redaction.", "spark.sql.redaction.")) or not secret.search(key):
            launch[key] = value
        elif key.startswith(RUNTIME_SECRET_PREFIXES):
            later[key] = value
        else:
            log.warning("Spark conf %s holds a secret that Spark reads only at launch: it is on spark-submit's "
                        "command line, which every local user can read", key)
            launch[key] = value
    return launch, later


def set_secret_conf(session: Any, secrets: Mapping[str, str]) -> None:
    """The secrets :func:`split_secret_conf` kept from the launch, on the running session: a ``spark.hadoop.*`` key
    in the context's Hadoop configuration (without the prefix, as Spark's launch would), others in its SQL conf."""
    for key, value in secrets.items():
        if key.startswith("spark.hadoop."):
            session.sparkContext._jsc.hadoopConfiguration().set(key.removeprefix("spark.hadoop."), value)
        else:
            session.conf.set(key, value)


