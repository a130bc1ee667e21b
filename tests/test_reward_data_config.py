"""reward_data_config.py: every validation error, the ERROR/SUGGESTION report, named exceptions."""
import os
import pickle
import shutil
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from helpers import make_reward_checkpoint, run_script  # noqa: E402
from reward_data_config import (BinaryFileError, ConfigError, MetaFileError, RewardDataConfig,  # noqa: E402
                                TokenizationInfo, TokenizationMismatchError, check_tokenization_match)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))



@pytest.fixture(scope="module")
def base(tmp_path_factory, tiny_char_ckpt):
    return {"root": tmp_path_factory.mktemp("cfg"), **tiny_char_ckpt}


def good(base, tmp_path, **kw):
    d = dict(model_path=base["ckpt"], data_path=base["text"], meta_path=base["meta"],
             output_dir=str(tmp_path / "out"), device="cpu")
    d.update(kw)
    return RewardDataConfig(**d)


def errors(cfg):
    return [p.error for p in cfg.validate(report=False)]


def test_reexports_and_named_exceptions():
    info = TokenizationInfo("char", 65, "data/shakespeare_char/meta.pkl")
    assert TokenizationInfo.from_dict(info.to_dict()) == info
    assert issubclass(TokenizationMismatchError, ValueError)
    with pytest.raises(ValueError, match=r"^Tokenization method mismatch: dataset uses 'char' but expected 'bpe'$"):
        check_tokenization_match(TokenizationInfo("char", 65), TokenizationInfo("bpe", 50257), "dataset")
    from core import errors
    assert MetaFileError is errors.MetaFileError and BinaryFileError is errors.BinaryFileError


def test_a_good_config_passes_and_writes_nothing(base, tmp_path):
    cfg = good(base, tmp_path)
    assert errors(cfg) == []
    assert cfg.checkpoint is not None and cfg.resolved_tokenization == ("char", base["meta"])
    assert not os.path.exists(tmp_path / "out")
    # auto-detection: char from the meta.pkl beside the data (binary mode)
    d = base["data_dir"]
    cfg = good(base, tmp_path, data_path=None, meta_path=None, input_mode="binary",
               train_bin=os.path.join(d, "train.bin"), val_bin=os.path.join(d, "val.bin"))
    assert errors(cfg) == [] and cfg.resolved_tokenization[0] == "char"


def test_model_file_not_found(base, tmp_path):
    assert f"Model file not found: {tmp_path}/nope.pt" in errors(good(base, tmp_path, model_path=str(tmp_path / "nope.pt")))
    assert "--model_path is required" in errors(good(base, tmp_path, model_path=None))
    assert RewardDataConfig.from_args(["--data_path", "x.txt"]).model_path is None  # reported by validate()


def test_meta_path_required_for_char(base, tmp_path):
    # no meta.pkl beside the text and no 'char' in the directory name
    assert "meta_path is required when tokenization is 'char'" in errors(
        good(base, tmp_path, tokenization="char", meta_path=None))
    # ... but 'char' auto-detected from a directory name without a meta.pkl is also an error
    d = tmp_path / "my_char_corpus"
    d.mkdir()
    shutil.copy(base["text"], d / "input.txt")
    assert "meta_path is required when tokenization is 'char'" in errors(good(base, tmp_path, data_path=str(d),
                                                                            meta_path=None))
    # unless auto-detection finds one beside the data
    shutil.copy(base["meta"], d / "meta.pkl")
    assert errors(good(base, tmp_path, data_path=str(d), meta_path=None, tokenization="char")) == []
    # a meta.pkl that is not there / not valid
    assert f"Meta file not found: {tmp_path}/m.pkl" in errors(good(base, tmp_path, meta_path=str(tmp_path / "m.pkl")))
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(pickle.dumps({"vocab_size": 3}))
    assert any("is not a char meta.pkl" in e for e in errors(good(base, tmp_path, meta_path=str(bad))))


def test_binary_mode_errors(base, tmp_path):
    d = base["data_dir"]
    cfg = good(base, tmp_path, input_mode="binary", train_bin=str(tmp_path / "tr.bin"),
               val_bin=str(tmp_path / "va.bin"))
    errs = errors(cfg)
    assert "--data_path is ignored in binary mode" in errs
    assert f"Train binary file not found: {tmp_path}/tr.bin" in errs
    assert f"Val binary file not found: {tmp_path}/va.bin" in errs
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x00\x01\x02")
    errs = errors(good(base, tmp_path, input_mode="binary", data_path=None, train_bin=os.path.join(d, "train.bin"),
                       val_bin=str(odd)))
    assert errs == [f"Val binary file {odd} has 3 bytes, not a whole number of uint16 tokens"]
    assert "--train_bin is required in binary mode" in errors(good(base, tmp_path, input_mode="binary", data_path=None))


def test_text_file_missing_empty_or_too_short(base, tmp_path):
    assert f"Data file not found: {tmp_path}/x.txt" in errors(good(base, tmp_path, data_path=str(tmp_path / "x.txt")))
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert f"Data file is empty: {empty}" in errors(good(base, tmp_path, data_path=str(empty)))
    short = tmp_path / "short.txt"
    short.write_text("the king\n")
    assert f"Data file {short} is shorter than one block: 9 characters < block_size 32" in errors(
        good(base, tmp_path, data_path=str(short)))
    assert "--data_path is required in text mode" in errors(good(base, tmp_path, data_path=None))


def test_out_of_range_settings(base, tmp_path):
    errs = errors(good(base, tmp_path, temperature=0.0, top_k=0, train_split=1.0, samples_per_chunk=0,
                       gen_batch_size=0, seed=-1, max_blocks_per_split=0))
    for e in ("--temperature must be > 0, got 0.0", "--top_k must be >= 1, got 0", "--train_split must be in (0, 1), got 1.0",
              "--samples_per_chunk must be >= 1, got 0", "--gen_batch_size must be >= 1, got 0", "--seed must be >= 0, got -1",
              "--max_blocks_per_split must be >= 1, got 0"):
        assert e in errs, e
    assert len(errs) == 7  # all of them at once
    assert "--temperature must be > 0, got -1.0" in errors(good(base, tmp_path, temperature=-1.0))
    assert "--train_split must be in (0, 1), got 0.0" in errors(good(base, tmp_path, train_split=0.0))


def test_output_dir_cannot_be_created(base, tmp_path):
    f = tmp_path / "a_file"
    f.write_text("x")
    assert any(e.startswith(f"Output directory cannot be created: {f}/sub") for e in
               errors(good(base, tmp_path, output_dir=str(f / "sub"))))
    assert any(e.startswith(f"Output directory cannot be created: {f}") for e in
               errors(good(base, tmp_path, output_dir=str(f))))


def test_unavailable_device(base, tmp_path):
    assert "Device 'cuda:99' is not available on this machine" in errors(good(base, tmp_path, device="cuda:99"))
    if not torch.cuda.is_available():
        assert "Device 'cuda' is not available on this machine" in errors(good(base, tmp_path, device="cuda"))


def test_model_compatibility(base, tmp_path):
    assert "--block_size 64 exceeds the model's block_size 32" in errors(good(base, tmp_path, block_size=64))
    rm = make_reward_checkpoint(base["ckpt"], str(tmp_path / "rm.pt"))
    errs = errors(good(base, tmp_path, model_path=rm))
    assert any("is a reward checkpoint, but the base model must be a generator" in e for e in errs)
    # BPE data for a char model: the named mismatch (and the vocab sizes)
    errs = errors(good(base, tmp_path, tokenization="bpe", meta_path=None))
    assert "Tokenization method mismatch: dataset uses 'bpe' but expected 'char'" in errs
    assert any("exceeds the model's vocab_size" in e for e in errs)
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    assert any(e.startswith(str(bad)) for e in errors(good(base, tmp_path, model_path=str(bad))))  # read_checkpoint's error


def test_vocab_beyond_uint16(base, tmp_path):
    chars = [chr(0x3400 + i) for i in range(70000)]
    big = tmp_path / "big_meta.pkl"
    big.write_bytes(pickle.dumps({"vocab_size": len(chars), "itos": dict(enumerate(chars)),
                                  "stoi": {c: i for i, c in enumerate(chars)}}))
    errs = errors(good(base, tmp_path, meta_path=str(big)))
    assert any("70000 tokens, beyond the uint16 range" in e for e in errs)


def test_partial_output_needs_resume(base, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "train_x.bin.tmp").write_bytes(b"")
    errs = errors(good(base, tmp_path))
    assert any("holds an unfinished run" in e for e in errs)
    assert errors(good(base, tmp_path, resume=True)) == []


def test_check_raises_config_error_with_all_problems(base, tmp_path):
    cfg = good(base, tmp_path, model_path=str(tmp_path / "no.pt"), temperature=0)
    with pytest.raises(ConfigError) as e:
        cfg.check(report=False)
    assert len(e.value.problems) == 2 and "Model file not found" in str(e.value)


@pytest.mark.slow  # a command line run in a subprocess
def test_command_line_report(base, tmp_path):
    out = tmp_path / "never"
    r = run_script(["prepare_reward_data.py", "--model_path", str(tmp_path / "missing.pt"),
                    "--input_mode", "binary", "--data_path", base["text"], "--train_bin", str(tmp_path / "t.bin"),
                    "--val_bin", str(tmp_path / "v.bin"), "--temperature", "0", "--output_dir", str(out)],
                   cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=120)
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith(("ERROR: ", "SUGGESTION: "))]
    kinds = [ln.split(":")[0] for ln in lines]
    assert kinds == sorted(kinds)  # all ERROR lines, then all SUGGESTION lines
    for e in (f"ERROR: Model file not found: {tmp_path}/missing.pt", "ERROR: --data_path is ignored in binary mode",
              f"ERROR: Train binary file not found: {tmp_path}/t.bin", f"ERROR: Val binary file not found: {tmp_path}/v.bin",
              "ERROR: --temperature must be > 0, got 0.0"):
        assert e in lines, e
    assert kinds.count("SUGGESTION") >= 3
    assert "Traceback" not in r.stderr
    assert not os.path.exists(out)


def test_temperatures_list_is_validated(base, tmp_path):
    assert good(base, tmp_path, temperatures="0.7,1.0,1.3").temperature_list() == [0.7, 1.0, 1.3]
    assert good(base, tmp_path).temperature_list() is None
    for bad in ("0.7,0,1.3", "0.7,-1", "a,b", "", "0.7,,1", "nan"):
        errs = errors(good(base, tmp_path, temperatures=bad))
        assert len(errs) == 1 and "--temperatures must be a comma list of numbers > 0" in errs[0], (bad, errs)
    cfg = RewardDataConfig.from_args(["--model_path", "m.pt", "--temperatures", "0.5,1.5"])
    assert cfg.temperatures == "0.5,1.5" and cfg.temperature_list() == [0.5, 1.5]
