"""The jars a classic Spark session needs (Spark's Kafka connector, spark-avro, a sink's pinned package such as
Delta's or Iceberg's), resolved once by Maven into the cache and refused unless their SHA-256 are the pinned ones.

Separate from the session (``session.py``) because resolving and verifying jars is supply-chain code with its own
pins and cache, used also by scripts (the benchmark's and the cluster's jars) without starting a session.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from airflow_eo.core.errors import ConfigurationError

log = logging.getLogger(__name__)

SCALA_BINARY = "2.13"  # Spark 4.x is built for Scala 2.13 only


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
    if not folder.name.startswith(_PINNED_ARTIFACTS):
        return
    pins = JAR_SHA256.get(folder.name)
    if pins is None:
        log.warning("no SHA-256 pins for %s (pins exist for %s): its jars are used unverified", folder.name,
                    ", ".join(sorted(JAR_SHA256)))
        return
    problems = []
    for jar in jars:
        digest = _sha256(jar)
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


#: The digests this process computed, by the file's identity when it was read (device, inode, size, modification
#: and change times): every batch verifies its session's jars, and hashing 19 connector jars again took 45 ms of each.
#: Any write to a file changes its change time (no call can set that back), so a changed jar is read and hashed again.
_DIGESTS: dict[tuple[str, int, int, int, int, int], str] = {}
#: A file changed this recently is hashed every time: the kernel's file clock ticks in milliseconds, so a second write
#: within the tick of the first would keep the change time (git's "racily clean" entries, the same rule).
_SETTLED_NS = 2_000_000_000


def _sha256(jar: Path) -> str:
    status = jar.stat()
    identity = (str(jar), status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)
    digest = _DIGESTS.get(identity)
    if digest is None:
        digest = hashlib.sha256(jar.read_bytes()).hexdigest()
        if time.time_ns() - status.st_ctime_ns > _SETTLED_NS:
            _DIGESTS[identity] = digest
    return digest


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


def resolve_pinned_packages(conf: dict[str, str]) -> dict[str, str]:
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

