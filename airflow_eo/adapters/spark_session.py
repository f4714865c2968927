"""Spark sessions for airflow_eo, with Spark's Kafka connector at the installed pyspark version."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow_eo.core.errors import ConfigurationError

SCALA_BINARY = "2.13"  # Spark 4.x is built for Scala 2.13 only

#: Defaults for a micro-batch; any of them can be overridden by the user's conf.
DEFAULT_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "1g",
}


def kafka_connector_coordinates(pyspark_version: str | None = None) -> str:
    if pyspark_version is None:
        import pyspark

        pyspark_version = pyspark.__version__
    return f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_BINARY}:{pyspark_version}"


_CONNECTOR_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>airflow-eo</groupId><artifactId>spark-kafka-connector</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies><dependency>
    <groupId>org.apache.spark</groupId><artifactId>spark-sql-kafka-0-10_{scala}</artifactId><version>{version}</version>
  </dependency></dependencies>
</project>
"""


def connector_cache_dir() -> Path:
    return Path(os.environ.get("EO_CACHE_DIR", Path.home() / ".cache" / "airflow-eo"))


def kafka_connector_jars(resolve: bool = True) -> list[str] | None:
    """Jars of Spark's Kafka connector (and its runtime dependencies), resolved once with Maven.

    Maven, not Spark's Ivy (``spark.jars.packages``): Ivy also asks for test-jars that
    are not published, and fails. Returns None when Maven is not installed.
    """
    import pyspark

    version = pyspark.__version__
    folder = connector_cache_dir() / f"spark-sql-kafka-{SCALA_BINARY}-{version}"
    if not (folder / ".complete").exists():
        mvn = shutil.which("mvn")
        if not resolve or mvn is None:
            return None
        folder.mkdir(parents=True, exist_ok=True)
        pom = folder / "pom.xml"
        pom.write_text(_CONNECTOR_POM.format(scala=SCALA_BINARY, version=version))
        done = subprocess.run(
            [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies", "-DincludeScope=runtime",
             f"-DoutputDirectory={folder / 'jars'}"],
            capture_output=True, text=True,
        )
        if done.returncode != 0:
            raise ConfigurationError(
                f"could not resolve Spark's Kafka connector {kafka_connector_coordinates(version)} from Maven "
                f"Central (is it published for pyspark {version}?); install a pyspark version whose connector "
                f"is published, or put the connector jars in spark.jars. Maven said: {done.stdout[-500:]}"
            )
        (folder / ".complete").touch()
    return sorted(str(j) for j in (folder / "jars").glob("*.jar"))


def session_conf(conf: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Our defaults + the user's conf, with the Kafka connector added unless the user configured it."""
    merged = {**DEFAULT_CONF, **{k: str(v) for k, v in (conf or {}).items()}}
    packages, jars = merged.get("spark.jars.packages", ""), merged.get("spark.jars", "")
    if "spark-sql-kafka" in packages or "spark-sql-kafka" in jars:
        return merged
    connector = kafka_connector_jars()
    if connector:
        merged["spark.jars"] = ",".join(p for p in (jars, *connector) if p)
    else:  # no Maven here: let Spark resolve the package itself
        merged["spark.jars.packages"] = ",".join(p for p in (packages, kafka_connector_coordinates()) if p)
    return merged


def get_session(master: str | None = None, remote: str | None = None, conf: Mapping[str, Any] | None = None,
                app_name: str = "airflow_eo"):
    """Get (or create) the Spark session. ``remote`` selects Spark Connect (``sc://host:port``).

    The session is reused across batches of one process; conf of an existing session
    is not changed (Spark cannot change static conf at run time).
    """
    from pyspark.sql import SparkSession

    # Executors' Python must be the driver's (same packages: pyarrow, pymysql, airflow_eo).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if remote:
        builder = builder.remote(remote)
    else:
        builder = builder.master(master or "local[*]")
        # Local mode: bind the driver to loopback, never to a public interface.
        if (master or "local").startswith("local"):
            builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
    for key, value in session_conf(conf).items():
        if remote and key == "spark.jars.packages":
            continue  # a Spark Connect server brings its own jars
        builder = builder.config(key, value)
    try:
        return builder.getOrCreate()
    except Exception as exc:  # noqa: BLE001 - surface a message that says what to fix
        if "spark-sql-kafka" in str(exc) or "unresolved dependency" in str(exc):
            raise ConfigurationError(
                f"could not resolve Spark's Kafka connector {kafka_connector_coordinates()} from Maven "
                "Central; install a pyspark version whose connector is published, or put the connector "
                "jar in spark.jars"
            ) from exc
        raise
