"""
Turn a text file, or a directory of text files, into nanoGPT-style training data:

  out_dir/train.bin, out_dir/val.bin   uint16 token ids (first / last part of the text)
  out_dir/meta.pkl                     char vocabulary (char tokenization only)
  out_dir/prepare_info.json            how the split was made, sizes and sha256 hashes

A single file is split as nanoGPT does: the TEXT is cut at int(len(text) * train_split)
characters and both parts are encoded separately. prepare_reward_data.py repeats exactly
this rule in text mode, and checkpoints record the hashes, so data leakage is detected.
A directory is a corpus of documents (every *.txt file below it, in sorted order; --glob
chooses others): whole documents go to train or val, the last ones in order to val (see
plan_documents).

    python prepare_data.py --input my_corpus.txt --tokenization char --out_dir data/my_corpus_char
    python prepare_data.py --input corpus_dir/ --tokenization bpe --out_dir data/corpus_bpe

The input is streamed, never held in memory: a first pass checks the UTF-8, counts the
characters (to place the cut) and collects the char vocabulary; the second tokenizes chunks
on --num_proc processes and appends them to train.bin / val.bin. Chunks are cut only where
tokenizing the pieces separately gives exactly the tokens of the whole (safe_cut), so the
output does not depend on the chunk size or the number of processes.

A local Hugging Face dataset (a save_to_disk directory, or parquet / JSON-lines files) is read
with the optional `datasets` package: the records' --text_field values, joined with "\n\n",
are prepared exactly as that text given as a file (lib/hf_corpus.py).

    python prepare_data.py --input my_hf_dataset/ --text_field text --out_dir data/my_hf_char

This script is the command line only: the preparation is the library module lib/prepare.py
(prepare.prepare_corpus), which data/shakespeare_char/prepare.py and data/shakespeare/prepare.py
call after fetching the Shakespeare text (data/shakespeare_text.py), and lib/hf_corpus.py.
"""
import argparse

from core.cli import check_flag_ranges, run_cli
from lib.corpus import DEFAULT_GLOB
from lib.hf_corpus import RECORD_SEPARATOR, hf_dataset_kind, prepare_hf_dataset
from lib.prepare import DEFAULT_CHUNK_BYTES, prepare_corpus


def main():
    ap = argparse.ArgumentParser(description="Tokenize a UTF-8 text file, or a directory of text files, into "
                                 "train.bin/val.bin (nanoGPT format) with a 'char' or GPT-2 'bpe' tokenizer; "
                                 "streamed, so the corpus may be larger than memory.")
    ap.add_argument("--input", required=True,
                    help="UTF-8 text file, or a directory: every file below it matching --glob is a document, "
                         "in sorted order of relative path (a directory holding one such file is that file); or "
                         "a local Hugging Face dataset: a save_to_disk directory, or parquet / JSON-lines files "
                         "(a file, or a directory of them), read with the `datasets` package")
    ap.add_argument("--out_dir", required=True, help="directory for train.bin, val.bin, meta.pkl, prepare_info.json")
    ap.add_argument("--tokenization", choices=["char", "bpe"], default="char",
                    help="'char': a character vocabulary built from the text (meta.pkl); 'bpe': GPT-2 BPE")
    ap.add_argument("--meta_path", default=None,
                    help="char only: reuse this existing meta.pkl instead of building a new vocabulary")
    ap.add_argument("--train_split", type=float, default=0.9,
                    help="a file: fraction of the text (by characters, from the start) used for training; "
                         "a directory: the first whole documents with the closest share of characters are train")
    ap.add_argument("--glob", default=DEFAULT_GLOB,
                    help="directory input: file-name pattern of the documents (fnmatch, case-sensitive; "
                         "'*' for every file); hidden files and directories are skipped")
    ap.add_argument("--num_proc", type=int, default=None,
                    help="processes that tokenize in parallel (default: all cores, os.cpu_count())")
    ap.add_argument("--chunk_bytes", type=int, default=DEFAULT_CHUNK_BYTES,
                    help="advanced: bytes of text per task (the output does not depend on it; memory grows with it)")
    ap.add_argument("--text_field", default="text",
                    help="Hugging Face dataset: the field holding each record's text; the records are joined "
                         f"with {RECORD_SEPARATOR!r} into one text, split and hashed as that text in a file")
    ap.add_argument("--hf_split", default="train",
                    help="Hugging Face save_to_disk DatasetDict: the split to read (the train/val split is made "
                         "from its text)")
    args = ap.parse_args()
    check_flag_ranges(args, "prepare_data.py")
    kind = hf_dataset_kind(args.input, args.glob)
    if kind is not None:
        prepare_hf_dataset(args.input, args.out_dir, kind, args.tokenization, args.train_split, args.meta_path,
                           args.text_field, args.hf_split, num_proc=args.num_proc, chunk_bytes=args.chunk_bytes)
        return
    prepare_corpus(args.input, args.out_dir, args.tokenization, args.train_split, args.meta_path,
                   num_proc=args.num_proc, chunk_bytes=args.chunk_bytes, pattern=args.glob)


if __name__ == "__main__":
    run_cli(main)
