"""XA transaction ids for our branches, and their codec.

``formatID`` marks a branch as ours. ``gtrid`` = a stable key of the pipeline (its id's whole
SHA-1, 160 bits: two pipelines sharing a key would recover, commit or roll back each other's
branches) + the batch id, so every branch of one batch shares it and recovery can find a
pipeline's branches by key. Before issue 23 the key was the SHA-1's first 12 hex digits (48
bits): such branches, prepared before an upgrade, are still recognised (:meth:`Xid.belongs_to`).
``bqual`` = epoch, Spark partition, stage attempt and task attempt, so branches of different
attempts never collide.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

FORMAT_ID = 0x454F31  # "EO1"
_MAX_PART = 64  # XA limits gtrid and bqual to 64 bytes each


_LEGACY_KEY_LENGTH = 12  # hex digits of the key before issue 23 (48 bits)


def pipeline_key(pipeline_id: str) -> str:
    """A stable, fixed-length key of the pipeline id (ids may be long; the gtrid has 64 bytes): its SHA-1.

    "eo:" + 40 hex digits + ":" + a batch id of up to 20 digits fits the gtrid's 64 bytes.
    """
    return hashlib.sha1(pipeline_id.encode()).hexdigest()


@dataclass(frozen=True, order=True)
class Xid:
    pipeline_key: str
    batch_id: int
    epoch: int
    partition: int
    stage_id: int = 0
    attempt_id: int = 0

    @property
    def gtrid(self) -> bytes:
        return f"eo:{self.pipeline_key}:{self.batch_id}".encode()

    @property
    def bqual(self) -> bytes:
        return f"{self.epoch}:{self.partition}:{self.stage_id}:{self.attempt_id}".encode()

    def belongs_to(self, pipeline_id: str) -> bool:
        """Whether this is a branch of ``pipeline_id``: its key, or (a branch prepared before the key was
        lengthened) the key's first 48 bits, as it was then."""
        key = pipeline_key(pipeline_id)
        return self.pipeline_key == key or (len(self.pipeline_key) == _LEGACY_KEY_LENGTH
                                            and key.startswith(self.pipeline_key))

    def sql(self) -> str:
        """The xid as it appears after ``XA START|END|PREPARE|COMMIT|ROLLBACK`` (hex literals)."""
        return f"X'{self.gtrid.hex()}',X'{self.bqual.hex()}',{FORMAT_ID}"

    def encode(self) -> str:
        """Compact text form stored in the batch row and reported by Spark tasks."""
        return f"{self.gtrid.decode()}/{self.bqual.decode()}"

    @classmethod
    def decode(cls, text: str) -> Xid:
        gtrid, bqual = text.split("/", 1)
        return cls.from_parts(gtrid.encode(), bqual.encode())

    @classmethod
    def from_parts(cls, gtrid: bytes, bqual: bytes) -> Xid:
        prefix, key, batch = gtrid.decode().split(":")
        if prefix != "eo":
            raise ValueError(f"not an airflow_eo gtrid: {gtrid!r}")
        epoch, partition, stage_id, attempt_id = (int(x) for x in bqual.decode().split(":"))
        return cls(key, int(batch), epoch, partition, stage_id, attempt_id)

    def __post_init__(self) -> None:
        if len(self.gtrid) > _MAX_PART or len(self.bqual) > _MAX_PART:
            raise ValueError(f"xid parts exceed {_MAX_PART} bytes: {self}")


def parse_recover_row(format_id: int, gtrid_length: int, bqual_length: int, data: bytes) -> Xid | None:
    """One row of ``XA RECOVER`` → our Xid, or None when the branch is not ours."""
    if format_id != FORMAT_ID:
        return None
    if isinstance(data, str):
        data = data.encode("latin-1")
    try:
        return Xid.from_parts(data[:gtrid_length], data[gtrid_length : gtrid_length + bqual_length])
    except (ValueError, UnicodeDecodeError):
        return None
