"""The cache folder's trust: code this process runs from it (the driver's class archive, which the JVM maps without
verifying its bytecode; the package zip on the executors' ``sys.path``) is used only from a folder and a file that
no other user can write. The folders are made ``0700``; one made before (under the umask) passes when only its owner
can write it. The jars there are SHA-256-checked on every use (``jars.verify_jars``; a file's digest is computed again
whenever its identity, change time included, differs), the package zip against the installed package
(``session.package_archive``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path


class UntrustedPathError(PermissionError):
    """A cache folder or file another user could have written: not used."""


def private_folder(folder: Path) -> Path:
    """``folder``, made ``0700`` (with any parent it makes) when missing, and checked (:func:`check_private`)."""
    if not folder.exists():
        missing = [p for p in (folder, *folder.parents) if not p.exists()]
        for path in reversed(missing):
            try:
                path.mkdir(mode=0o700)
            except FileExistsError:  # another process made it at the same time: checked below like any other
                pass
    for path in (folder.parent, folder):
        check_private(path)
    return folder


def check_private(path: Path) -> None:
    """Refuse ``path`` (a folder or file, not followed if a link) unless it is owned by this user (or root) and no
    group or other user can write it."""
    found = os.lstat(path)
    if stat.S_ISLNK(found.st_mode):
        raise UntrustedPathError(f"{path} is a symbolic link; the cache keeps code only in real folders and files")
    owners = {os.geteuid(), 0}
    writable_by_others = stat.S_IMODE(found.st_mode) & (stat.S_IWGRP | stat.S_IWOTH)
    sticky_folder = stat.S_ISDIR(found.st_mode) and found.st_mode & stat.S_ISVTX
    if found.st_uid not in owners or (writable_by_others and not (sticky_folder and found.st_uid == 0)):
        raise UntrustedPathError(
            f"{path} is owned by uid {found.st_uid} with mode {stat.S_IMODE(found.st_mode):o}: another user could have "
            f"put code there. Make it yours and writable by you only (chown {os.geteuid()}, chmod go-w), or point "
            "EO_CACHE_DIR at a folder of your own")
