"""
A local Hugging Face dataset as prepare_data.py's input: a `save_to_disk` directory (a Dataset,
or a DatasetDict with --hf_split choosing the split), or parquet / JSON-lines files (one file, or
a directory of them, in sorted order), read with the optional `datasets` package. Nothing is
downloaded.

The records are streamed in order (a save_to_disk dataset is memory-mapped Arrow, data files are
read with streaming=True) and the --text_field values are joined with RECORD_SEPARATOR ("\\n\\n",
nothing after the last) into one text. That text is written once to a temporary file beside the
output and prepared exactly as the same text given as a file (prepare.prepare_corpus: nanoGPT's
character cut, the same train.bin / val.bin and hashes); the temporary file is removed afterwards,
and a killed run's leftover by the next run.
"""
import os
import tempfile
import time

from core.errors import DataError, ProjectError
from core.files import check_writable_dir, remove_stale_temps
from lib.corpus import DEFAULT_GLOB, text_files
from lib.prepare import DEFAULT_CHUNK_BYTES, check_prepare_args, prepare_corpus

RECORD_SEPARATOR = "\n\n"
DATA_FILE_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}
SAVED_MARKERS = ("dataset_dict.json", "state.json")  # what save_to_disk writes
TEMP_BASE = "hf_text"


def data_files(path):
    """Parquet / JSON-lines files of `path`: [path] for a file, else every such file below the
    directory (hidden ones skipped), in sorted order of relative path."""
    if not os.path.isdir(path):
        return [path] if path.endswith(tuple(DATA_FILE_BUILDERS)) else []
    found = []
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [os.path.join(root, f) for f in files if not f.startswith(".") and f.endswith(tuple(DATA_FILE_BUILDERS))]
    return sorted(found, key=lambda p: os.path.relpath(p, path))


def hf_dataset_kind(path, pattern=DEFAULT_GLOB):
    """'disk' (a save_to_disk directory), 'files' (parquet / JSON lines, and a directory of them
    holds no text file matching `pattern`), or None: text input, for prepare.prepare_corpus."""
    if not os.path.exists(path):
        return None
    if os.path.isdir(path):
        if any(os.path.exists(os.path.join(path, m)) for m in SAVED_MARKERS):
            return "disk"
        return "files" if data_files(path) and not text_files(path, pattern) else None
    return "files" if data_files(path) else None


def import_datasets(path):
    try:
        import datasets
    except ImportError:
        raise ProjectError(f"--input {path} is a Hugging Face dataset, and reading it needs the Python package "
                           "'datasets', which is not installed", "pip install datasets") from None
    datasets.disable_progress_bars()
    return datasets


def _check_field(columns, text_field, path):
    if columns is not None and text_field not in columns:
        raise DataError(f"--input {path} has no field {text_field!r} (its fields: {', '.join(columns)})",
                        "pass --text_field with the name of the field that holds the text")


def iter_texts(path, kind, text_field, hf_split):
    """The --text_field value of every record, in order, streamed."""
    datasets = import_datasets(path)
    if kind == "disk":
        ds = datasets.load_from_disk(path)
        if isinstance(ds, datasets.DatasetDict):
            if hf_split not in ds:
                raise DataError(f"--input {path} has no split {hf_split!r} (its splits: {', '.join(ds)})",
                                "pass --hf_split with one of them")
            ds = ds[hf_split]
        _check_field(ds.column_names, text_field, path)
        for batch in ds.iter(batch_size=1000):
            yield from batch[text_field]
        return
    files = data_files(path)
    builders = {DATA_FILE_BUILDERS[os.path.splitext(f)[1]] for f in files}
    if len(builders) != 1:
        raise DataError(f"--input {path} mixes parquet and JSON-lines files", "pass a directory of one kind")
    ds = datasets.load_dataset(builders.pop(), data_files=files, split="train", streaming=True)
    for record in ds:
        _check_field(list(record), text_field, path)
        yield record[text_field]


def write_joined_text(path, kind, text_field, hf_split, out_file):
    """Stream the records' texts, joined with RECORD_SEPARATOR, into out_file (UTF-8). Returns
    (records, characters)."""
    n = chars = 0
    with open(out_file, "w", encoding="utf-8", newline="") as f:
        for n, text in enumerate(iter_texts(path, kind, text_field, hf_split), 1):
            if not isinstance(text, str):
                raise DataError(f"--input {path}: record {n - 1}'s {text_field!r} is {type(text).__name__}, not text",
                                "pass --text_field with a field of strings")
            if n > 1:
                f.write(RECORD_SEPARATOR)
            f.write(text)
            chars += len(text)
    if chars == 0:
        raise DataError(f"--input {path} holds no text in field {text_field!r} ({n} records)",
                        "pass a dataset with text, or the right --text_field")
    return n, chars


def prepare_hf_dataset(input_path, out_dir, kind, tokenization="char", train_split=0.9, meta_path=None,
                       text_field="text", hf_split="train", log=print, num_proc=None,
                       chunk_bytes=DEFAULT_CHUNK_BYTES):
    """prepare.prepare_corpus on the dataset's joined text (see the module doc). Returns its info."""
    check_prepare_args(tokenization, meta_path, train_split, num_proc, chunk_bytes)
    check_writable_dir(out_dir, "--out_dir")
    remove_stale_temps(os.path.join(out_dir, TEMP_BASE), before=time.time())
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=TEMP_BASE + ".", suffix=".tmp")
    os.close(fd)
    try:
        n, _ = write_joined_text(input_path, kind, text_field, hf_split, tmp)
        source = (f"Hugging Face dataset ({'save_to_disk' if kind == 'disk' else 'data files'}"
                  f"{', split ' + hf_split if kind == 'disk' else ''}): field {text_field!r} of {n:,} records, "
                  f"joined with {RECORD_SEPARATOR!r}")
        log(f"{input_path}: {source}")
        return prepare_corpus(tmp, out_dir, tokenization, train_split, meta_path, source=source, log=log,
                              num_proc=num_proc, chunk_bytes=chunk_bytes, input_label=input_path)
    finally:
        os.remove(tmp)
