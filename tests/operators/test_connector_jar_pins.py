"""The jars of Spark's Kafka connector and spark-avro are used only with their pinned SHA-256 (issue 23, item 12)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_eo.core.errors import ConfigurationError
from airflow_eo.spark import jars
from airflow_eo.spark.jars import JAR_SHA256, connector_cache_dir, maven_jars


def _cached(cache: Path, name: str, jars: dict[str, bytes]) -> None:
    folder = cache / name / "jars"
    folder.mkdir(parents=True)
    for jar, content in jars.items():
        (folder / jar).write_bytes(content)
    (cache / name / ".complete").touch()


def test_a_jar_other_than_the_pinned_one_is_refused_with_its_name_and_digests(tmp_path, monkeypatch):
    monkeypatch.setenv("EO_CACHE_DIR", str(tmp_path))
    name = "spark-sql-kafka-0-10_2.13-4.0.0"
    _cached(tmp_path, name, {jar: b"not the jar" for jar in JAR_SHA256[name]})
    with pytest.raises(ConfigurationError, match="kafka-clients-3.9.0.jar has SHA-256 [0-9a-f]{64}, pinned "
                                                 + JAR_SHA256[name]["kafka-clients-3.9.0.jar"]):
        maven_jars("org.apache.spark", "spark-sql-kafka-0-10_2.13", "4.0.0", resolve=False)
    # An extra jar in the set (the cache was added to) is refused too; other artifacts are not pinned.
    _cached(tmp_path, "spark-avro_2.13-4.0.0", {"evil.jar": b"x"})
    with pytest.raises(ConfigurationError, match="evil.jar is not one of the pinned jars"):
        maven_jars("org.apache.spark", "spark-avro_2.13", "4.0.0", resolve=False)
    _cached(tmp_path, "mariadb-java-client-3.5.3", {"mariadb-java-client-3.5.3.jar": b"x"})
    assert maven_jars("org.mariadb.jdbc", "mariadb-java-client", "3.5.3", resolve=False)


def test_the_jars_resolved_on_this_machine_match_the_pins(monkeypatch):
    monkeypatch.delenv("EO_CACHE_DIR", raising=False)
    if not (connector_cache_dir() / "spark-sql-kafka-0-10_2.13-4.0.0" / ".complete").exists():
        pytest.skip("Spark's Kafka connector is not resolved here yet (make up resolves it)")
    assert len(jars.kafka_connector_jars(resolve=False) or []) == len(JAR_SHA256["spark-sql-kafka-0-10_2.13-4.0.0"])
    assert jars.format_jars(resolve=False) is not None


def test_a_jar_changed_after_it_was_verified_is_refused_even_with_its_size_and_times_put_back(tmp_path, monkeypatch):
    import hashlib
    import os
    import time

    # Digests are kept per file identity (every batch verifies its jars): a rewrite must still be seen.
    name = "spark-avro_2.13-9.9.9"
    monkeypatch.setitem(JAR_SHA256, name, {"spark-avro.jar": hashlib.sha256(b"good").hexdigest()})
    folder = tmp_path / name
    _cached(tmp_path, name, {"spark-avro.jar": b"good"})
    jar = folder / "jars" / "spark-avro.jar"
    jars.verify_jars(folder, [jar])
    assert not [key for key in jars._DIGESTS if key[0] == str(jar)]  # changed just now: hashed every time
    monkeypatch.setattr(jars, "_SETTLED_NS", 0)
    jars.verify_jars(folder, [jar])
    assert [key for key in jars._DIGESTS if key[0] == str(jar)]  # kept
    before = jar.stat()
    time.sleep(0.05)  # past the kernel's file clock tick (what _SETTLED_NS guards against in use)
    jar.write_bytes(b"evil")  # the same size
    os.utime(jar, ns=(before.st_atime_ns, before.st_mtime_ns))  # and the same modification time
    with pytest.raises(ConfigurationError, match="spark-avro.jar has SHA-256 " + hashlib.sha256(b"evil").hexdigest()):
        jars.verify_jars(folder, [jar])
