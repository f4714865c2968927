"""The cache folder's trust (``spark/private_files.py``): the driver's class archive (mapped by the JVM without
bytecode verification) and the executors' package zip are used only from a folder and a file no other user can
write, and the zip only while it is exactly the installed package. No JVM here: the builder is held off by its lock."""

from __future__ import annotations

import os
import stat
import zipfile
from pathlib import Path

import pytest

from airflow_eo.spark.class_archive import archive_path, with_class_archive
from airflow_eo.spark.private_files import UntrustedPathError, check_private, private_folder


def planted(cache: Path, folder_mode: int, file_mode: int = 0o644) -> Path:
    """An archive at the path a session looks for, in a folder of ``folder_mode``; its builder's lock held."""
    path = archive_path(cache)
    assert path is not None, "a java is needed to key the archive"
    path.parent.mkdir(parents=True)
    path.parent.chmod(folder_mode)
    path.write_bytes(b"not an archive of ours")
    path.chmod(file_mode)
    path.with_suffix(".lock").touch()  # a builder is at work: none is started here
    return path


def test_a_class_archive_another_user_could_have_written_is_not_mapped(tmp_path):
    shared = planted(tmp_path / "shared", 0o777)
    assert with_class_archive("-Xmx1g", tmp_path / "shared") == "-Xmx1g"  # its folder: anyone may write it
    assert shared.exists()  # not ours to remove

    writable = planted(tmp_path / "writable", 0o700, 0o666)
    assert with_class_archive("-Xmx1g", tmp_path / "writable") == "-Xmx1g"
    assert not writable.exists()  # removed, to be built again

    foreign = planted(tmp_path / "foreign", 0o700)
    os.chown(foreign.parent, 4321, 4321)  # another user's folder (the tests run as root)
    assert with_class_archive("-Xmx1g", tmp_path / "foreign") == "-Xmx1g"

    ours = planted(tmp_path / "ours", 0o700)
    assert with_class_archive("-Xmx1g", tmp_path / "ours") == f"-Xmx1g -XX:SharedArchiveFile={ours} " \
                                                               "-Xlog:cds=off -Xlog:cds+dynamic=off"


def test_cache_folders_are_made_private_and_links_are_refused(tmp_path):
    made = private_folder(tmp_path / "cache" / "class-archives")
    assert [stat.S_IMODE(p.stat().st_mode) for p in (made.parent, made)] == [0o700, 0o700]
    (tmp_path / "link").symlink_to(made)
    with pytest.raises(UntrustedPathError, match="symbolic link"):
        check_private(tmp_path / "link")
    check_private(Path("/tmp"))  # root's sticky folder: others write in it, but cannot replace what is ours


def test_the_package_zip_is_made_again_when_it_is_not_the_installed_package(tmp_path, monkeypatch):
    from airflow_eo.spark.package_shipping import package_archive

    monkeypatch.setenv("EO_CACHE_DIR", str(tmp_path / "cache"))
    archive = package_archive()
    assert stat.S_IMODE(archive.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(archive.stat().st_mode) & 0o022 == 0
    with zipfile.ZipFile(archive) as zipped:
        good = {name: zipped.read(name) for name in zipped.namelist()}
    with zipfile.ZipFile(archive, "w") as zipped:  # a planted zip under the expected name
        for name, data in good.items():
            zipped.writestr(name, b"import os; os.system('touch /tmp/owned')\n" if name.endswith("core/xid.py")
                            else data)
        zipped.writestr("pyarrow/__init__.py", b"raise SystemExit\n")
    assert package_archive() == archive
    with zipfile.ZipFile(archive) as zipped:
        assert {name: zipped.read(name) for name in zipped.namelist()} == good
