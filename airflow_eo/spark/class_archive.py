"""A class-data-sharing archive for the Spark driver's JVM: an Airflow task starts a new driver for every batch, and
most of its start is the JVM loading and verifying Spark's classes. With the classes a driver loads kept in a CDS
archive (JDK 17's ``-XX:ArchiveClassesAtExit`` / ``-XX:SharedArchiveFile``), a local session and its first job start
in ~3.4 s instead of ~6.3 s (measured on two cores, pyspark 4.0, OpenJDK 17).

The archive is made once per pyspark, Spark home (with its jars' sizes and times) and Java, in the cache folder, by
a process of its own (``python -m airflow_eo.spark.class_archive``) started in the background the first time a
session finds none; a session uses it from then on. A JVM crashes on a half-written archive, so it is written under
another name, checked by a JVM and only then renamed into place. The JVM maps an archive's classes without verifying
their bytecode: it is used only from a folder made ``0700`` and a file no other user can write
(:mod:`airflow_eo.spark.private_files`); a folder that fails the check is not used, a file is built again. A JVM
ignores an archive that does not match it
(another Java build, other jars), so a stale one costs nothing but the speed-up. ``EO_CLASS_ARCHIVE=off`` turns it off.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from airflow_eo.spark.private_files import UntrustedPathError, check_private, private_folder

log = logging.getLogger(__name__)

#: Logging of the JVM's CDS off: an archive it cannot use (another Java) is a warning on every start otherwise, and
#: making one warns for each class it leaves out (signed jars, classes of ``spark.jars``).
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
#: A lock older than this is a builder that died (SIGKILL, a reboot): another may start.
STALE_LOCK_SECONDS = 600
#: Archives kept in the cache folder, the newest first.
KEPT = 4


def java_binary() -> Path | None:
    """The ``java`` that Spark's launcher runs (``$JAVA_HOME/bin/java``, else the one on the PATH)."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def archive_path(cache: Path) -> Path | None:
    """Where this pyspark's, Spark home's and Java's archive is kept; None when there is no Java to key it by."""
    import pyspark

    java = java_binary()
    if java is None:
        return None
    stat = java.stat()
    spark_home = Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent).resolve()
    # The JVM maps an archive only if each jar on the class path has the size and time it had when the archive was
    # made; a venv made again at the same path (a CI clone) has new times: keyed by them, it gets an archive of its
    # own instead of one the JVM silently refuses.
    jars = sorted((jar.name, jar.stat().st_size, jar.stat().st_mtime_ns) for jar in (spark_home / "jars").glob("*.jar"))
    key = "|".join((pyspark.__version__, str(spark_home), str(java), str(stat.st_size), str(stat.st_mtime_ns),
                    repr(jars)))
    return cache / "class-archives" / f"spark-{pyspark.__version__}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


def enabled() -> bool:
    return os.environ.get("EO_CLASS_ARCHIVE", "on").lower() not in ("off", "0", "false", "no")


def with_class_archive(java_options: str, cache: Path) -> str:
    """``java_options`` of a driver with the archive in them when it exists; when it does not, the builder is
    started in the background (this session starts as it would without). Options that already choose a CDS archive
    or turn sharing off are the user's: left as they are."""
    if not enabled() or "SharedArchiveFile" in java_options or "ArchiveClassesAtExit" in java_options \
            or "-Xshare:off" in java_options:
        return java_options
    try:
        path = archive_path(cache)
        if path is None:
            return java_options
        private_folder(path.parent)  # another user's folder: not used (the warning below)
        if path.exists():
            try:
                check_private(path)
                return " ".join(o for o in (java_options.strip(), f"-XX:SharedArchiveFile={path}", QUIET) if o)
            except UntrustedPathError as exc:
                log.warning("Spark driver class archive: %s; building it again", exc)
                path.unlink()
        start_builder(path)
    except OSError as exc:  # a cache folder it cannot write (a read-only home): only the speed-up is lost
        log.warning("Spark driver class archive: %s; sessions start without it", exc)
    return java_options


def start_builder(path: Path) -> None:
    """Start ``python -m airflow_eo.spark.class_archive PATH`` detached (its own session: a task's end or kill does
    not stop it), unless one holds the lock."""
    if not _lock(path):
        return
    subprocess.Popen([sys.executable, "-m", "airflow_eo.spark.class_archive", str(path)], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _lock(path: Path) -> bool:
    lock = path.with_suffix(".lock")
    private_folder(lock.parent)
    try:
        if time.time() - lock.stat().st_mtime > STALE_LOCK_SECONDS:
            lock.unlink(missing_ok=True)
    except FileNotFoundError:
        pass
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    return True


def build(path: Path) -> bool:
    """Run a local driver that loads what a batch's driver loads (a session, SQL, a Python worker, Arrow), let its
    JVM write the archive at exit, check the archive with a JVM and rename it into place. True when it is there."""
    from pyspark.sql import SparkSession

    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    options = f"-XX:ArchiveClassesAtExit={partial} {QUIET}"
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    session = (SparkSession.builder.master("local[1]").appName("airflow_eo class archive")
               .config("spark.ui.enabled", "false").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.extraJavaOptions", options)
               .getOrCreate())
    try:
        frame = session.range(1000).selectExpr("id", "CAST(id AS STRING) AS text", "id % 7 AS key")
        frame.groupBy("key").count().collect()
        frame.mapInArrow(lambda batches: batches, frame.schema).count()
        session.sql("SELECT from_json('{\"a\": 1}', 'a INT') AS parsed").collect()
    finally:
        gateway = session.sparkContext._gateway
        session.stop()
        # The archive is written as the JVM exits, which it does once its launcher's stdin closes.
        process = getattr(gateway, "proc", None)
        if process is not None:
            process.stdin.close()
            process.wait(timeout=300)
    try:
        if not usable(partial):
            return False
        partial.chmod(0o644)  # the JVM wrote it under the umask: writable by its owner only, or never used
        partial.replace(path)
        _prune(path.parent, keep=path)
        return True
    finally:
        partial.unlink(missing_ok=True)


def _prune(folder: Path, keep: Path, newest: int = KEPT) -> None:
    """Remove all but the ``newest`` archives (~140 MB each): every clone, venv or Java update keys one of its own."""
    archives = sorted(folder.glob("*.jsa"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in [a for a in archives if a != keep][newest - 1:]:
        old.unlink(missing_ok=True)


def usable(archive: Path) -> bool:
    """Whether a JVM starts with ``archive`` (one cut short makes it crash, not fall back)."""
    java = java_binary()
    if java is None or not archive.exists():
        return False
    with tempfile.TemporaryDirectory(prefix="airflow_eo_cds_check_") as scratch:
        # A JVM refusing a broken archive crashes: its hs_err_pid*.log goes here, not into the caller's folder.
        check = subprocess.run([str(java), f"-XX:ErrorFile={scratch}/hs_err_pid%p.log",
                                f"-XX:SharedArchiveFile={archive}", "-Xshare:auto", "-version"],
                               capture_output=True, timeout=120, cwd=scratch)
    return check.returncode == 0


def ensure(cache: Path) -> Path | None:
    """Build the archive now unless it is there (or another process is building it: then wait for that one, up to
    :data:`STALE_LOCK_SECONDS`); its path, or None when there is none to use."""
    path = archive_path(cache)
    if path is None or not enabled():
        return None
    deadline = time.monotonic() + STALE_LOCK_SECONDS
    while not path.exists() and time.monotonic() < deadline:
        if _lock(path):
            try:
                build(path)
            finally:
                path.with_suffix(".lock").unlink(missing_ok=True)
            break
        time.sleep(1)
    return path if path.exists() else None


def main(argv: list[str]) -> int:
    """``--cache FOLDER``: :func:`ensure` the archive of that cache folder now; ``PATH``: build it, holding the lock
    its starter took (:func:`start_builder`)."""
    if argv[:1] == ["--cache"]:
        found = ensure(Path(argv[1]))
        print(f"Spark driver class archive: {found or 'none (no Java found, or EO_CLASS_ARCHIVE=off)'}")
        return 0
    path = Path(argv[0])
    try:
        return 0 if build(path) else 1
    finally:
        path.with_suffix(".lock").unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
