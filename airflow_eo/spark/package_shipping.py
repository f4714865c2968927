"""Shipping this package to where a session's code runs: a zip of ``airflow_eo`` as installed here, cached by content
in a folder of this user's, added to the executors' ``sys.path`` (a classic session's py-file, a Spark Connect
session's artifact) once per session.

Separate from the session (``session.py``) because it is about the package's files and their trust, not Spark's conf.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from airflow_eo.spark.jars import connector_cache_dir
from airflow_eo.spark.private_files import UntrustedPathError, check_private, private_folder

log = logging.getLogger(__name__)


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
