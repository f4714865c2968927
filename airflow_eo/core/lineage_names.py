"""Where a sink writes, as OpenLineage's dataset naming spec names it (https://openlineage.io/docs/spec/naming).

Databases and topics are named as their Airflow Assets are (``mysql://host:port`` + ``database.table``,
``postgres://host:port`` + ``database.schema.table``, ``kafka://host:port`` + topic). A table of files (Delta,
Iceberg) is named by its location, as OpenLineage's Spark integration names the tables it sees, so that both join
in a lineage backend: a local folder is namespace ``file`` and its absolute path; a Hadoop file system URI is its
scheme and authority (``hdfs://namenode:8020``) and its path; object stores are their bucket (``s3://bucket``,
``gs://bucket``, ``s3a``/``s3n`` spelled ``s3``) and the key without a leading slash. An Iceberg table of a Hadoop
catalog also carries its logical name as a ``symlinks`` identifier of type ``TABLE``: namespace the warehouse
location, name ``namespace.table`` (the Spark integration's ``IcebergHandler``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit

#: Object stores whose authority is a bucket (and whose names drop the key's leading slash); ``s3a``/``s3n`` are
#: Hadoop's spellings of ``s3``.
_BUCKET_SCHEMES = {"s3": "s3", "s3a": "s3", "s3n": "s3", "gs": "gs", "gcs": "gs"}


@dataclass(frozen=True)
class LineageSymlink:
    """Another name of the same dataset (OpenLineage's ``symlinks`` dataset facet)."""

    namespace: str
    name: str
    type: str = "TABLE"


@dataclass(frozen=True)
class LineageDataset:
    """A sink's output in OpenLineage's naming.

    :param namespace: the data source (``file``, ``s3://bucket``, ``mysql://host:port``).
    :param name: the dataset within it.
    :param symlinks: other names of the same dataset (a catalog table's logical name).
    :param storage_layer: ``delta`` or ``iceberg`` (the ``storage`` dataset facet), None for others.
    """

    namespace: str
    name: str
    symlinks: tuple[LineageSymlink, ...] = ()
    storage_layer: str | None = None


#: Why a location with a password in it is refused, and what to do instead.
CREDENTIALS_IN_LOCATION = (
    "holds a password in its authority (user:password@): it would be kept in lineage, Asset URIs and logs. Give the "
    "file system's credentials in spark_conf (spark.hadoop.fs.s3a.access.key / secret.key, set on the running "
    "session), a credential provider or the environment, and the location without them")


def credentials_in(location: str) -> bool:
    """Whether ``location`` (a table's folder or URI) holds a password in its authority
    (``s3a://KEY:SECRET@bucket/...``): it would be kept in lineage namespaces, Asset URIs and logs like the rest of
    the location. ``abfss://container@account...`` names a container, no password: not one."""
    if "://" not in location:
        return False
    authority = location.split("://", 1)[1].split("/", 1)[0]
    userinfo, at, _ = authority.rpartition("@")
    return bool(at) and ":" in userinfo


def _local_path(path: str) -> str:
    # Spark resolves a relative path against the driver's working folder, which is the task's.
    trimmed = os.path.abspath(path).rstrip("/")
    return trimmed or "/"


def location_dataset(location: str) -> tuple[str, str]:
    """``(namespace, name)`` of the files at ``location`` (a local path, ``file:`` URI or Hadoop file system URI)."""
    parts = urlsplit(location)
    scheme = parts.scheme.lower()
    if not scheme or len(scheme) == 1:  # no scheme, or a Windows drive letter
        return "file", _local_path(location)
    if scheme == "file":
        host = parts.netloc if parts.netloc not in ("", "localhost") else ""
        return (f"file://{host}" if host else "file"), _local_path(parts.path)
    if scheme in _BUCKET_SCHEMES:
        return f"{_BUCKET_SCHEMES[scheme]}://{parts.netloc}", parts.path.strip("/") or "/"
    return f"{scheme}://{parts.netloc}", parts.path.rstrip("/") or "/"


def location_namespace(location: str) -> str:
    """A location as a namespace of its own (a Hadoop catalog's warehouse, which names its tables ``ns.table``):
    ``file:/abs/path`` for a local folder, else the URI (``s3a``/``s3n`` spelled ``s3``) without a trailing slash."""
    namespace, name = location_dataset(location)
    if namespace == "file":
        return f"file:{name}"
    if namespace.split("://")[0] in ("s3", "gs"):
        return f"{namespace}/{name}" if name != "/" else namespace
    return f"{namespace}{name}" if name != "/" else namespace
