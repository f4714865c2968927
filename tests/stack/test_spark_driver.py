"""The driver every batch starts: it listens on loopback only, and its JVM maps the class-data-sharing archive that
``make up`` made (:mod:`airflow_eo.spark.class_archive`), which is what makes it start ~3 s sooner."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import psutil

from airflow_eo.spark.class_archive import archive_path, usable, with_class_archive
from airflow_eo.spark.jars import connector_cache_dir
from airflow_eo.spark.session import get_session


def driver_jvm() -> psutil.Process:
    return psutil.Process(get_session().sparkContext._gateway.proc.pid)


def test_a_local_driver_listens_on_loopback_only():
    listening = [c.laddr for c in driver_jvm().net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert listening, "the driver's RPC and block manager listen somewhere"
    outside = [a for a in listening if not ipaddress.ip_address(a.ip.removeprefix("::ffff:")).is_loopback]
    assert outside == [], f"the driver listens beyond loopback: {outside}"


def test_the_driver_jvm_maps_the_class_archive_made_by_make_up():
    archive = archive_path(connector_cache_dir())
    assert archive is not None and archive.exists(), f"make up did not make {archive}"
    assert f"-XX:SharedArchiveFile={archive}" in get_session().sparkContext.getConf().get(
        "spark.driver.extraJavaOptions")
    mapped = {m.path for m in driver_jvm().memory_maps(grouped=True)}
    assert str(archive) in mapped, "the driver's JVM does not use the archive"


def test_an_archive_cut_short_is_not_usable_and_the_users_own_cds_options_are_kept(tmp_path: Path):
    archive = archive_path(connector_cache_dir())
    assert archive is not None and usable(archive)
    cut = tmp_path / "cut.jsa"
    cut.write_bytes(archive.read_bytes()[:1_000_000])
    assert not usable(cut), "a JVM must be seen to refuse a half-written archive (build() checks before renaming)"
    own = "-Xmx2g -XX:SharedArchiveFile=/opt/mine.jsa"
    assert with_class_archive(own, connector_cache_dir()) == own
    assert with_class_archive("-Xshare:off", connector_cache_dir()) == "-Xshare:off"


def test_a_cache_folder_that_cannot_be_written_only_costs_the_speed_up(tmp_path: Path):
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")  # the archive folder would be under a file: mkdir fails, as on a read-only home
    assert with_class_archive("-Xmx1g", blocked) == "-Xmx1g"


def test_a_spark_home_whose_jars_were_installed_again_gets_an_archive_of_its_own(tmp_path: Path, monkeypatch):
    """A JVM silently refuses an archive made with jars of other sizes or times (a venv made again at the same
    path, as a CI clone's is): the archive's name must change with them, or the driver starts without one."""
    jar = tmp_path / "jars" / "spark-core.jar"
    jar.parent.mkdir()
    jar.write_bytes(b"first install")
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))
    first = archive_path(tmp_path / "cache")
    os.utime(jar, ns=(jar.stat().st_atime_ns, jar.stat().st_mtime_ns + 1_000_000_000))
    assert archive_path(tmp_path / "cache") != first
