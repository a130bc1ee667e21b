"""
Export a checkpoint to the Hugging Face format, loadable with transformers.

$ python export_hf.py --ckpt out/ckpt.pt --out_dir hf-model
>>> from transformers import AutoTokenizer, GPT2LMHeadModel
>>> model, tok = GPT2LMHeadModel.from_pretrained("hf-model"), AutoTokenizer.from_pretrained("hf-model")

A generator (train.py, train_grpo.py or nanoGPT checkpoint) becomes
  model.safetensors, config.json, generation_config.json   GPT2LMHeadModel; the embedding is cropped
                                                           to the tokenizer's vocabulary (BPE: the 47
                                                           padding rows no token id reaches)
  tokenizer.json, tokenizer_config.json                    AutoTokenizer: GPT-2's BPE (+ vocab.json,
                                                           merges.txt), or the char vocabulary (+ meta.pkl)
A reward model (train_reward_model.py) becomes
  model.safetensors, config.json                           GPT2Model: the trunk (hidden states after ln_f)
  reward_head.safetensors, reward_config.json              the head's tensors (project names) and the
                                                           whole GPTConfig; see docs for the few lines
                                                           that turn them into P(natural)
  the same tokenizer files.
Such directories are also accepted wherever the project takes a checkpoint (--init_from, --model_path,
--ckpt, ...). The export is built in a temporary directory, checked against the project's own model
with transformers (when it is installed), then renamed to --out_dir: a failed export leaves nothing.
"""
import argparse
import json
import os
import shutil
import tempfile

import torch

from core.cli import check_flag_ranges, run_cli
from core.errors import ProjectError
from core.files import check_writable_dir
from lib.checkpoint import checkpoint_mode, model_from_checkpoint, read_checkpoint, tokenizer_for
from lib.hf_interop import REWARD_CONFIG, REWARD_HEAD, generator_to_hf, reward_to_hf
from tokenization_manager import GPT2_VOCAB_SIZE, gpt2_bpe_files

# every name an export may contain: an existing --out_dir holding anything else is not replaced
EXPORT_NAMES = {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                "tokenizer_config.json", "vocab.json", "merges.txt", "meta.pkl", REWARD_CONFIG, REWARD_HEAD}
EOT = "<|endoftext|>"
MAX_LOGIT_DIFF = 1e-4  # float32
CHECK_TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\n  It is the east; 1595 \u2014 caf\u00e9.\n"


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def write_safetensors(path, tensors, metadata=None):
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise ProjectError("writing model.safetensors needs the package 'safetensors'",
                           "pip install safetensors (or pip install -r requirements.txt)") from None
    save_file(tensors, path, metadata={"format": "pt", **(metadata or {})})


def write_tokenizer(tok, out_dir, block_size):
    """tokenizer.json (+ tokenizer_config.json) that AutoTokenizer loads, with the project's ids."""
    try:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    except ImportError:
        raise ProjectError("writing the tokenizer needs the package 'tokenizers'",
                           "pip install tokenizers (or pip install -r requirements.txt)") from None
    if tok.method == "bpe":
        # GPT-2's byte-level BPE from the same encoder.json / vocab.bpe tiktoken's encoding is built from
        files = gpt2_bpe_files()
        t = Tokenizer(models.BPE.from_file(files["encoder.json"], files["vocab.bpe"]))
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        t.decoder = decoders.ByteLevel()
        t.post_processor = processors.ByteLevel(trim_offsets=False)
        t.add_special_tokens([AddedToken(EOT, special=True)])
        shutil.copyfile(files["encoder.json"], os.path.join(out_dir, "vocab.json"))  # for older transformers
        shutil.copyfile(files["vocab.bpe"], os.path.join(out_dir, "merges.txt"))
        config = {"tokenizer_class": "GPT2Tokenizer", "bos_token": EOT, "eos_token": EOT, "unk_token": EOT,
                  "add_prefix_space": False}
    else:
        # one token per character, newlines and spaces included: every character is its own
        # pre-token and a word-level vocabulary maps it to the project's id
        t = Tokenizer(models.WordLevel(vocab={tok.itos[i]: i for i in range(tok.vocab_size)}, unk_token=None))
        t.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        t.decoder = decoders.Fuse()  # decode joins the characters with nothing in between
        shutil.copyfile(tok.meta_path, os.path.join(out_dir, "meta.pkl"))  # read back by hf_interop
        config = {"tokenizer_class": "PreTrainedTokenizerFast"}
    t.save(os.path.join(out_dir, "tokenizer.json"))
    write_json(os.path.join(out_dir, "tokenizer_config.json"),
               {**config, "model_max_length": block_size, "clean_up_tokenization_spaces": False})


def export(model, mode, tok, out_dir, ckpt):
    """Write the files of one export into the (empty) directory out_dir."""
    c = model.config
    if mode == "generator":
        V = tok.vocab_size  # BPE: 50257 of the 50304 rows; char: all of them
        eos = GPT2_VOCAB_SIZE - 1 if tok.method == "bpe" else None
        tensors, config = generator_to_hf(model, V, eos_token_id=eos)
        write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors)
        write_json(os.path.join(out_dir, "config.json"), config)
        write_json(os.path.join(out_dir, "generation_config.json"),
                   {"bos_token_id": eos, "eos_token_id": eos})
    else:
        trunk, config, head, gpt_config = reward_to_hf(model)
        write_safetensors(os.path.join(out_dir, "model.safetensors"), trunk)
        write_json(os.path.join(out_dir, "config.json"), config)
        write_safetensors(os.path.join(out_dir, REWARD_HEAD), head)
        reward_data = ckpt.get("reward_data") or {}
        write_json(os.path.join(out_dir, REWARD_CONFIG), {
            "gpt_config": gpt_config,
            "outputs": ["P(natural)", "P(synthetic)"],
            "head": "softmax over the head applied to the hidden state (after ln_f) of the last token",
            "tokenization": {"method": tok.method, "vocab_size": tok.vocab_size},
            "reward_data": {"block_size": reward_data["block_size"]} if reward_data.get("block_size") else None,
        })
    write_tokenizer(tok, out_dir, c.block_size)


def check_export(model, mode, tok, out_dir):
    """Load the export with transformers and compare it with the project's model and tokenizer.
    Returns the measured figures; a ProjectError when they disagree."""
    import transformers
    from transformers import AutoTokenizer, GPT2LMHeadModel, GPT2Model
    from transformers.utils import logging as hf_logging
    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # quiet while loading: the loading info is checked instead
    hf_logging.disable_progress_bar()
    try:
        cls = GPT2LMHeadModel if mode == "generator" else GPT2Model
        hf, info = cls.from_pretrained(out_dir, output_loading_info=True)
        hf_tok = AutoTokenizer.from_pretrained(out_dir)
        # GPT-2's sample sentence, or every character of the vocabulary (longer than a block: not a warning)
        text = CHECK_TEXT if tok.method == "bpe" else "".join(tok.itos[i] for i in range(tok.vocab_size)) * 2
        hf_ids = hf_tok(text)["input_ids"]
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()
    bad = {k: v for k, v in info.items() if v}
    if bad:
        raise ProjectError(f"transformers {transformers.__version__} loaded {out_dir} with problems: {bad}",
                           "please report this with the checkpoint's config")
    hf.eval()
    model.eval()
    c = model.config
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, tok.vocab_size, (2, min(c.block_size, 128)), generator=g)
    with torch.no_grad():
        if mode == "generator":
            ours = model.lm_head(model.hidden_states(x))[..., :tok.vocab_size]
            theirs = hf(x).logits
            what = "logits"
        else:
            ours = model(x)[0]
            h = hf(x).last_hidden_state[:, -1]
            theirs = model.reward_head(h)  # the project's head on transformers' trunk
            what = "P(natural), P(synthetic)"
    diff = float((ours.float() - theirs.float()).abs().max())
    ids = tok.encode(text)
    if diff > MAX_LOGIT_DIFF or hf_ids != ids or hf_tok.decode(hf_ids) != text:
        raise ProjectError(f"the export in {out_dir} does not reproduce the model: max abs difference of the "
                           f"{what} {diff:.3g} (allowed {MAX_LOGIT_DIFF}), tokenizer ids "
                           f"{'equal' if hf_ids == ids else 'differ'}",
                           "please report this with the checkpoint's config")
    return {"what": what, "max_abs_diff": diff, "tokens_compared": len(ids)}


def main():
    ap = argparse.ArgumentParser(description="Export a generator or reward checkpoint to the Hugging Face "
                                             "format (safetensors, config.json, tokenizer).")
    ap.add_argument("--ckpt", required=True,
                    help="checkpoint to export: a generator (train.py, train_grpo.py, nanoGPT) or a reward model "
                         "(train_reward_model.py); a model directory works too")
    ap.add_argument("--out_dir", required=True,
                    help="directory to create; an existing one is replaced only if it holds nothing but "
                         "files an export writes")
    ap.add_argument("--tokenization", default=None, choices=["bpe", "char"],
                    help="override the checkpoint's tokenization (needed for nanoGPT checkpoints)")
    ap.add_argument("--meta_path", default=None, help="char vocabulary meta.pkl (overrides the checkpoint's)")
    ap.add_argument("--skip_check", action="store_true",
                    help="do not load the export with transformers to compare its outputs and tokenizer with "
                         "the project's (the check is skipped anyway, with a note, without transformers)")
    args = ap.parse_args()
    check_flag_ranges(args, "export_hf.py")

    out_dir = os.path.normpath(args.out_dir)
    if os.path.exists(out_dir):
        if not os.path.isdir(out_dir):
            raise ProjectError(f"--out_dir {out_dir} exists and is a file", "pass a directory path to --out_dir")
        foreign = sorted(set(os.listdir(out_dir)) - EXPORT_NAMES)
        if foreign:
            raise ProjectError(f"--out_dir {out_dir} holds files an export does not write "
                               f"({', '.join(foreign[:5])}); it is not replaced", "choose a new or empty --out_dir")
    parent = os.path.dirname(os.path.abspath(out_dir))
    check_writable_dir(parent, "--out_dir's parent")

    ckpt = read_checkpoint(args.ckpt)
    mode = checkpoint_mode(ckpt)
    model, _ = model_from_checkpoint(ckpt, path=args.ckpt)
    model.eval()
    tok = tokenizer_for(ckpt, args.ckpt, args.tokenization, args.meta_path)
    if tok.vocab_size > model.config.vocab_size:
        raise ProjectError(f"the {tok.method} tokenizer has {tok.vocab_size} tokens but the model in "
                           f"{args.ckpt} only {model.config.vocab_size}",
                           "pass the --tokenization / --meta_path the model was trained with")

    tmp = tempfile.mkdtemp(dir=parent, prefix=os.path.basename(out_dir) + ".", suffix=".tmp")
    try:
        export(model, mode, tok, tmp, ckpt)
        try:
            import transformers  # noqa: F401
        except ImportError:
            transformers = None
        if args.skip_check or transformers is None:
            print("note: the export was not loaded with transformers to check it" +
                  ("" if args.skip_check else " (the package 'transformers' is not installed)"))
        else:
            r = check_export(model, mode, tok, tmp)
            print(f"checked with transformers: no missing or unexpected weights; max abs difference of the "
                  f"{r['what']} {r['max_abs_diff']:.2e}; tokenizer ids equal on {r['tokens_compared']} tokens")
        if os.path.exists(out_dir):  # replace an earlier export: move it aside, then swap
            old = tempfile.mkdtemp(dir=parent, prefix=os.path.basename(out_dir) + ".", suffix=".old")
            os.rename(out_dir, os.path.join(old, "x"))
            os.rename(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    files = sorted(os.listdir(out_dir))
    kind = "GPT2LMHeadModel" if mode == "generator" else "GPT2Model trunk + reward head"
    print(f"wrote {out_dir}/ ({kind}, tokenization {tok.info}): {', '.join(files)}")


if __name__ == "__main__":
    run_cli(main)
