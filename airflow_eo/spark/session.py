"""Spark sessions for airflow_eo, with Spark's Kafka connector at the installed pyspark version."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus, unquote

from airflow_eo.core.errors import ConfigurationError
from airflow_eo.core.failpoints import executor_env
from airflow_eo.core.spark_conf import SECRET_CONF_PATTERN, SPARK_SQL_REDACTION_DEFAULT, with_secret_redaction
from airflow_eo.spark.class_archive import with_class_archive
from airflow_eo.spark.private_files import UntrustedPathError, check_private, private_folder

log = logging.getLogger(__name__)

SCALA_BINARY = "2.13"  # Spark 4.x is built for Scala 2.13 only

#: Defaults for a micro-batch; any of them can be overridden by the user's conf.
DEFAULT_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "1g",
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


def kafka_connector_coordinates(pyspark_version: str | None = None) -> str:
    if pyspark_version is None:
        import pyspark

        pyspark_version = pyspark.__version__
    return f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_BINARY}:{pyspark_version}"


_MAVEN_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>airflow-eo</groupId><artifactId>jars-of-{artifact}</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies><dependency>
    <groupId>{group}</groupId><artifactId>{artifact}</artifactId><version>{version}</version>
  </dependency></dependencies>
</project>
"""


#: SHA-256 of every jar Maven resolves for Spark's Kafka connector, spark-avro and PostgreSQL's JDBC driver, per folder
#: (``<artifact>-<version>``): a mismatch (a tampered cache, a compromised mirror) is refused. Taken from jars whose
#: SHA-1 matched the repository's published ``.sha1`` files; a new pyspark version needs its own.
JAR_SHA256: dict[str, dict[str, str]] = {
    # Delta Lake for Spark 4.0 (the Delta sink, ``airflow_eo/delta``).
    "delta-spark_2.13-4.0.0": {
        "antlr4-runtime-4.13.1.jar": "54665d2838cc66458343468efc539e454fc95b46a8a04b13c6ac43fc9be63505",
        "delta-spark_2.13-4.0.0.jar": "538511702aae0ef6973a6a70af3d4543c9009f8edbed786a00737e2d3cd7f04e",
        "delta-storage-4.0.0.jar": "9bdb9fb450f1e119eba53feb427f331b0d09072d26485b8273883ad72c9a2e1d",
        "scala-library-2.13.13.jar": "b58b223f9b59f88d04c9dc9ec26f4b463e93e6f296de5663dbd710a7dfce2743",
    },
    # Apache Iceberg's Spark runtime for Spark 4.0 (the Iceberg sink, ``airflow_eo/iceberg``): one shaded jar.
    "iceberg-spark-runtime-4.0_2.13-1.10.0": {
        "iceberg-spark-runtime-4.0_2.13-1.10.0.jar": "0480f1248e0a8b50ae2a730d7ad3e1a727351c362ca63f4a0c35182087a49323",
    },
    "spark-sql-kafka-0-10_2.13-4.0.0": {
        "commons-pool2-2.12.0.jar": "6d3bd18df8410f3e31b031aca582cc109342358a62a2759ebd0c4cdf30d06f8b",
        "hadoop-client-api-3.4.1.jar": "a964d4daa054c9615bbafb4553efbb140fa7fb9ac6f358a24393f183a5703438",
        "hadoop-client-runtime-3.4.1.jar": "f6a800a159f918670db533606d33560d6c13b7e13f14eda493280ae33b9eeb2f",
        "jsr305-3.0.0.jar": "bec0b24dcb23f9670172724826584802b80ae6cbdaba03bdebdef9327b962f6a",
        "kafka-clients-3.9.0.jar": "15c1e137f2c2c94398e27abc4060a03b6bde10bf9fac15e8f70c02320b202f18",
        "lz4-java-1.8.0.jar": "d74a3334fb35195009b338a951f918203d6bbca3d1d359033dc33edd1cadc9ef",
        "scala-library-2.13.15.jar": "8e4dbc3becf70d59c787118f6ad06fab6790136a0699cd6412bc9da3d336944e",
        "scala-parallel-collections_2.13-1.2.0.jar": "4eae6e68cf44e9f709970355590ae981883edf6484608d747376a56cbb285432",
        "slf4j-api-1.7.36.jar": "d3ef575e3e4979678dc01bf1dcce51021493b4d11fb7f1be8ad982877c16a1c0",
        "snappy-java-1.1.10.5.jar": "0f3f1857ed33116583f480b4df5c0218836c47bfbc9c6221c0d73f356decf37b",
        "spark-sql-kafka-0-10_2.13-4.0.0.jar": "33a3b8b04df4a2e43c9d5bf8ca5972936a1ac662f2714e014d00ef6f27468bf3",
        "spark-tags_2.13-4.0.0.jar": "dd54f5f1513b515ff79b29eb12755acd325a9ced65f506994a4b9dc513020f36",
        "spark-token-provider-kafka-0-10_2.13-4.0.0.jar":
            "f2be3b76f9e6cbe63379d4e4e0dc14f59dbf056ae2ad16ff15ac108004c86767",
    },
    "spark-avro_2.13-4.0.0": {
        "scala-library-2.13.16.jar": "1ebb2b6f9e4eb4022497c19b1e1e825019c08514f962aaac197145f88ed730f1",
        "scala-parallel-collections_2.13-1.2.0.jar": "4eae6e68cf44e9f709970355590ae981883edf6484608d747376a56cbb285432",
        "spark-avro_2.13-4.0.0.jar": "083fb13d7a1091025b135eff216e2009b42c9724bb8bc597d2f28b1207ef4709",
        "spark-tags_2.13-4.0.0.jar": "dd54f5f1513b515ff79b29eb12755acd325a9ced65f506994a4b9dc513020f36",
        "xz-1.10.jar": "95c63c1a55b22dd6453890a419cc1a640f790bbf7d8ae82db1e30aefefb08888",
    },
    # PostgreSQL's JDBC driver (scripts/benchmark.py's Spark JDBC peer on PostgreSQL).
    "postgresql-42.7.8": {
        "checker-qual-3.49.5.jar": "508c83c62c344f6f7ee28f47b88a8797d6116d043bfd1ca0576c828dd1df2880",
        "postgresql-42.7.8.jar": "2a32a9dcbc42d67a50ad3a0de5efd102c8d2be46720045f2cbd6689f160ab7c7",
    },
}
_PINNED_ARTIFACTS = ("spark-sql-kafka-0-10_", "spark-avro_", "postgresql-", "delta-spark_", "iceberg-spark-runtime-")


def verify_jars(folder: Path, jars: list[Path]) -> None:
    """Refuse jars of Spark's Kafka connector or spark-avro whose SHA-256 is not the pinned one
    (:data:`JAR_SHA256`), or that the pins do not know; other artifacts, and versions without pins (warned), pass.

    :param folder: the artifact's cache folder (``<artifact>-<version>``).
    :param jars: the jars resolved into it.
    """
    import hashlib

    if not folder.name.startswith(_PINNED_ARTIFACTS):
        return
    pins = JAR_SHA256.get(folder.name)
    if pins is None:
        log.warning("no SHA-256 pins for %s (pins exist for %s): its jars are used unverified", folder.name,
                    ", ".join(sorted(JAR_SHA256)))
        return
    problems = []
    for jar in jars:
        digest = hashlib.sha256(jar.read_bytes()).hexdigest()
        expected = pins.get(jar.name)
        if expected is None:
            problems.append(f"{jar.name} is not one of the pinned jars")
        elif digest != expected:
            problems.append(f"{jar.name} has SHA-256 {digest}, pinned {expected}")
    missing = sorted(set(pins) - {j.name for j in jars})
    if missing:
        problems.append(f"missing {', '.join(missing)}")
    if problems:
        raise ConfigurationError(f"the jars resolved for {folder.name} in {folder} are not the pinned ones: "
                                 f"{'; '.join(problems)}. Check the Maven repository or mirror this machine uses, "
                                 "then delete the folder to resolve again")


def connector_cache_dir() -> Path:
    return Path(os.environ.get("EO_CACHE_DIR", Path.home() / ".cache" / "airflow-eo"))


def maven_jars(group: str, artifact: str, version: str, resolve: bool = True) -> list[str] | None:
    """Jars of one Maven artifact and its runtime dependencies, resolved once from Maven Central into the cache.

    Maven, not Spark's Ivy (``spark.jars.packages``): Ivy also asks for test-jars that are not published, and
    fails. Returns None when Maven is not installed (or ``resolve`` is false and nothing is cached).
    """
    folder = connector_cache_dir() / f"{artifact}-{version}"
    if not (folder / ".complete").exists():
        mvn = shutil.which("mvn")
        if not resolve or mvn is None:
            return None
        folder.mkdir(parents=True, exist_ok=True)
        pom = folder / "pom.xml"
        pom.write_text(_MAVEN_POM.format(group=group, artifact=artifact, version=version))
        done = subprocess.run(
            [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies", "-DincludeScope=runtime",
             f"-DoutputDirectory={folder / 'jars'}"],
            capture_output=True, text=True,
        )
        if done.returncode != 0:
            raise ConfigurationError(f"could not resolve {group}:{artifact}:{version} from Maven Central; Maven said: "
                                     f"{done.stdout[-500:]}")
        verify_jars(folder, sorted((folder / "jars").glob("*.jar")))  # before the folder counts as resolved
        (folder / ".complete").touch()
    jars = sorted((folder / "jars").glob("*.jar"))
    verify_jars(folder, jars)  # every use: a cached jar may have changed since
    return [str(j) for j in jars]


def kafka_connector_jars(resolve: bool = True) -> list[str] | None:
    """Jars of Spark's Kafka connector (and its runtime dependencies), resolved once with Maven (:func:`maven_jars`).

    Returns None when Maven is not installed.
    """
    import pyspark

    version = pyspark.__version__
    try:
        return maven_jars("org.apache.spark", f"spark-sql-kafka-0-10_{SCALA_BINARY}", version, resolve)
    except ConfigurationError as exc:
        raise ConfigurationError(
            f"could not resolve Spark's Kafka connector {kafka_connector_coordinates(version)} from Maven "
            f"Central (is it published for pyspark {version}?); install a pyspark version whose connector "
            f"is published, or put the connector jars in spark.jars. {exc}"
        ) from exc


def format_jars(resolve: bool = True) -> list[str] | None:
    """Jars of Spark's Avro functions (``from_avro``) at pyspark's version, without those pyspark already ships.

    Resolved like the Kafka connector (:func:`maven_jars`); None when Maven is not installed. Always added to a
    classic session: a session is shared by the batches of a process, and its jars cannot change once it runs.
    """
    import pyspark

    shipped = {p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    try:
        jars = maven_jars("org.apache.spark", f"spark-avro_{SCALA_BINARY}", pyspark.__version__, resolve)
    except ConfigurationError as exc:
        raise ConfigurationError(f"could not resolve Spark's Avro functions {avro_coordinates()} from Maven Central; "
                                 f"put the spark-avro jar in spark.jars. {exc}") from exc
    return None if jars is None else [j for j in jars if Path(j).name not in shipped]


def _artifact(jar: str) -> str:
    """A jar file's artifact name without its version (``scala-library`` of ``scala-library-2.13.13.jar``)."""
    return re.sub(r"-\d[\w.]*\.jar$", "", Path(jar).name)


def pinned_package_jars(coordinates: str) -> list[str] | None:
    """Jars of ``group:artifact:version`` when its SHA-256 pins are known (:data:`JAR_SHA256`), resolved with Maven
    (:func:`maven_jars`) and without the artifacts pyspark already ships at another version (a second Scala library
    on the class path breaks Spark); None for a package without pins, or without Maven here (Spark's Ivy resolves it
    then, unverified).

    :param coordinates: a ``spark.jars.packages`` entry.
    """
    import pyspark

    group, artifact, version = coordinates.strip().split(":")
    if f"{artifact}-{version}" not in JAR_SHA256:
        return None
    jars = maven_jars(group, artifact, version)
    if jars is None:
        return None
    shipped = {_artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [j for j in jars if _artifact(j) not in shipped]


def avro_coordinates() -> str:
    import pyspark

    return f"org.apache.spark:spark-avro_{SCALA_BINARY}:{pyspark.__version__}"


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
    return _resolve_pinned_packages(merged)


def _resolve_pinned_packages(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` with every ``spark.jars.packages`` entry that has SHA-256 pins (a sink's package, e.g. Delta's)
    resolved by Maven and checked against them, moved to ``spark.jars`` (:func:`pinned_package_jars`)."""
    packages = [p.strip() for p in conf.get("spark.jars.packages", "").split(",") if p.strip()]
    left, jars = [], [j for j in conf.get("spark.jars", "").split(",") if j]
    for package in packages:
        found = pinned_package_jars(package) if package.count(":") == 2 else None
        if found is None:
            left.append(package)
        else:
            jars += [j for j in found if j not in jars]
    if jars:
        conf["spark.jars"] = ",".join(jars)
    if left:
        conf["spark.jars.packages"] = ",".join(left)
    else:
        conf.pop("spark.jars.packages", None)
    return conf


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
        if remote:
            session.version  # noqa: B018 - one round trip: a wrong URL or token fails here, not mid-batch
    except Exception as exc:  # surface a message that says what to fix
        if remote:
            # Never chained (``from None``): pyspark's errors may echo the URL, its token percent-encoded, a form
            # Airflow's secret masker does not know.
            said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigurationError(f"cannot open a Spark Connect session at {_without_secrets(remote)}: "
                                     f"{_redacted(said, remote)}") from None
        if "spark-sql-kafka" in str(exc) or "unresolved dependency" in str(exc):
            raise ConfigurationError(
                f"could not resolve Spark's Kafka connector {kafka_connector_coordinates()} from Maven "
                "Central; install a pyspark version whose connector is published, or put the connector "
                "jar in spark.jars"
            ) from exc
        raise
    if not local:
        ship_package(session, remote=remote is not None)
    log.info("Spark session on %s (%s)", _without_secrets(remote) if remote else master or "local[*]",
             "Spark Connect" if remote else "classic, client mode")
    return session


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


def refuse_master_for_connect(conf: Mapping[str, str]) -> None:
    """A Spark Connect session runs on the server's master: a ``spark.master`` in the conf, or ``MASTER`` in this
    process's environment, makes pyspark refuse it with an error that quotes the URL, token included. Refused here
    first, saying what to remove."""
    if "spark.master" in conf:
        raise ConfigurationError(
            "spark.master is set in the Spark conf of a Spark Connect session (the connection's extra 'conf' or the "
            "operator's spark_conf): the Spark Connect server decides where the work runs; remove spark.master, "
            "or use a 'spark' connection (its host is the master URL) to run the driver here")
    if "MASTER" in os.environ:
        raise ConfigurationError(
            "the MASTER environment variable is set in this worker, and pyspark refuses a Spark Connect session "
            "then: unset MASTER in the worker's environment, or use a 'spark' connection to run the driver here")


def connect_url(host: str, port: int | None = None, user_id: str | None = None, token: str | None = None,
                use_ssl: Any = None) -> str:
    """A Spark Connect URL (``sc://host:port/;user_id=..;token=..;use_ssl=..``) that pyspark reads back exactly.

    Every parameter is percent-encoded with no character left as is: pyspark splits the parameters on ``;`` and
    ``=`` and parses the URL's path, so a ``/``, ``;`` or ``=`` of a token (base64 has ``/`` and ``=``) left
    unencoded makes it refuse the URL and echo it, token and all, in its error.

    :param host: ``host``, ``host:port`` or ``sc://host[:port]``.
    :param port: the port (None: the one in ``host``, else pyspark's default).
    :param user_id: the user id sent to the server.
    :param token: the bearer token (pyspark then uses TLS).
    :param use_ssl: TLS without a token (None: pyspark's default).
    """
    netloc = host.split("://", 1)[-1].rstrip("/")
    if "/" in netloc or ";" in netloc:
        raise ConfigurationError(f"Spark Connect host {_without_secrets(host)!r} must be host or host:port")
    if port:
        netloc = f"{netloc}:{int(port)}"
    params = [f"{name}={quote(str(value), safe='')}" for name, value in
              (("user_id", user_id), ("token", token), ("use_ssl", use_ssl)) if value not in (None, "")]
    return f"sc://{netloc}/" + (f";{';'.join(params)}" if params else "")


def _without_secrets(url: str) -> str:
    """A Spark Connect URL without its parameters (the token must not reach logs)."""
    return url.split(";", 1)[0]


def spellings(secret: str) -> set[str]:
    """The forms a secret takes in a Spark Connect URL and in pyspark's errors: as is and percent-encoded (ours
    encodes every character, the Spark provider's leaves ``/``, a form may use ``+`` for a blank)."""
    return {secret, quote(secret), quote(secret, safe=""), quote_plus(secret)} - {""}


def _redacted(text: str, url: str) -> str:
    """``text`` without the URL's parameter values in any spelling, nor anything after a ``;`` up to a blank or
    quote (a URL's parameters)."""
    for param in url.split(";")[1:]:
        name, _, given = param.partition("=")
        if name == "use_ssl":  # "true" is no secret, and blanking it would blank ordinary words
            continue
        for form in sorted(spellings(unquote(given)) | {given}, key=len, reverse=True):
            if form:
                text = text.replace(form, "***")
    return re.sub(r";[^\s'\"]+", ";***", text)


def is_connect(session: Any) -> bool:
    """True for a Spark Connect session (no SparkContext, no JVM in this process)."""
    return type(session).__module__.startswith("pyspark.sql.connect")


_SHIPPED: set[str] = set()  # sessions of this process that already have the package


def package_archive() -> Path:
    """A zip of the ``airflow_eo`` package as installed here, cached by content (for executors' ``sys.path``)."""
    import hashlib
    import zipfile

    import airflow_eo

    root = Path(airflow_eo.__file__).resolve().parent
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    # Executors import from it first: kept only in a folder of this user's (0700) and used only while its files
    # are exactly the installed package's (a zip written there by anyone else is made again).
    archive = private_folder(connector_cache_dir()) / f"airflow_eo-{digest.hexdigest()[:16]}.zip"
    members = {(Path("airflow_eo") / path.relative_to(root)).as_posix(): path for path in files}
    if archive.exists():
        try:
            check_private(archive)
            with zipfile.ZipFile(archive) as zipped:
                if set(zipped.namelist()) == set(members) and all(
                        zipped.read(name) == path.read_bytes() for name, path in members.items()):
                    return archive
        except (UntrustedPathError, zipfile.BadZipFile, OSError) as exc:
            log.warning("the package zip %s is not used (%s): made again", archive, exc)
        else:
            log.warning("the package zip %s differs from the installed package: made again", archive)
    partial = archive.with_suffix(f".{os.getpid()}.tmp")
    partial.unlink(missing_ok=True)
    with os.fdopen(os.open(partial, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644), "wb") as raw, \
            zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as zipped:
        for name, path in members.items():
            zipped.write(path, name)
    partial.replace(archive)  # atomic: concurrent tasks never see half a zip
    return archive


def ship_package(session: Any, remote: bool) -> None:
    """Put this package on the executors' ``sys.path``: a py-file of the classic session, or an
    artifact of the Spark Connect session (the server's Python workers get it)."""
    key = str(getattr(session, "session_id", None) or id(session))
    if key in _SHIPPED:
        return
    archive = str(package_archive())
    if remote:
        session.addArtifacts(archive, pyfile=True)
    else:
        session.sparkContext.addPyFile(archive)
    _SHIPPED.add(key)
