"""
Sample text from a trained generator checkpoint (all samples in one batched call).

$ python sample.py --out_dir out-shakespeare-char-cpu
$ python sample.py --ckpt out/ckpt.pt --start "ROMEO:" --num_samples 5 --max_new_tokens 300
$ python sample.py --ckpt out/ckpt.pt --start FILE:prompt.txt --temperature 0.9 --top_k 50
$ python sample.py --out_dir=out-shakespeare-char --start="ROMEO:" --num_samples=3   # nanoGPT's form

The tokenizer comes from the checkpoint's 'tokenization' record. Checkpoints written by
nanoGPT have none: pass --tokenization (and --meta_path for char models).
"""
import argparse
import math
import os

import torch

from configurator import add_config_arguments, add_ignored_arguments, parse_args_with_config
from core.cli import check_flag_ranges, run_cli
from core.devices import add_dtype_arg, autocast_context, resolve_device, resolve_dtype
from core.errors import ProjectError
from engine import Engine
from lib.checkpoint import load_model, tokenizer_for
from lib.corpus import read_text


def main():
    ap = argparse.ArgumentParser(description="Sample text from a generator checkpoint.")
    add_config_arguments(ap)
    ap.add_argument("--ckpt", default=None, help="checkpoint file, or a local Hugging Face GPT-2 directory "
                                                  "(default: OUT_DIR/ckpt.pt)")
    ap.add_argument("--out_dir", default="out", help="training output directory, used when --ckpt is not given")
    ap.add_argument("--start", default="\n",
                    help="prompt text, or FILE:path to read the prompt from a file")
    ap.add_argument("--num_samples", type=int, default=10, help="number of samples")
    ap.add_argument("--max_new_tokens", type=int, default=500, help="tokens generated per sample")
    ap.add_argument("--temperature", type=float, default=0.8,
                    help="1.0 = the model's distribution, lower = more conservative, 0 = greedy")
    ap.add_argument("--top_k", type=int, default=200, help="sample only among the k most likely tokens (0 = all)")
    ap.add_argument("--seed", type=int, default=1337, help="random seed (same seed, same samples)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N | mps")
    add_dtype_arg(ap)
    ap.add_argument("--tokenization", default=None, choices=["bpe", "char"],
                    help="override the checkpoint's tokenization (needed for nanoGPT checkpoints)")
    ap.add_argument("--meta_path", default=None, help="char vocabulary meta.pkl (overrides the checkpoint's)")
    ap.add_argument("--init_from", default="resume", choices=["resume"],
                    help="nanoGPT's setting; 'resume' (sample the checkpoint in --out_dir) is the only value here, "
                         "use --ckpt for any other checkpoint")
    add_ignored_arguments(ap, {"compile": "sampling runs uncompiled"})
    args = parse_args_with_config(ap)
    if args.top_k < 0:
        raise ProjectError(f"--top_k must not be negative, got {args.top_k}",
                           "use --top_k 0 to sample from all tokens")
    check_flag_ranges(args, "sample.py", [("num_samples", args.num_samples >= 1, ">= 1"),
                                          ("max_new_tokens", args.max_new_tokens >= 0, ">= 0"),
                                          ("temperature", 0 <= args.temperature < math.inf, ">= 0 (0 = greedy)")])

    ckpt_path = args.ckpt or os.path.join(args.out_dir, "ckpt.pt")
    device = resolve_device(args.device)
    model, ckpt, _ = load_model(ckpt_path, device=device, require_mode="generator")
    model.eval()
    tok = tokenizer_for(ckpt, ckpt_path, args.tokenization, args.meta_path)
    if tok.vocab_size > model.config.vocab_size:
        raise ProjectError(f"the {tok.method} tokenizer has {tok.vocab_size} tokens but the model in "
                           f"{ckpt_path} only {model.config.vocab_size}",
                           "pass the --tokenization / --meta_path the model was trained with")

    start = args.start
    if start.startswith("FILE:"):  # read as every script reads one text file (a directory of one stands for it)
        start = read_text(start[len("FILE:"):], "--start FILE:")
    ids = tok.encode(start)
    if not ids:
        raise ProjectError("--start encodes to no tokens", "give at least one character of prompt")
    if len(ids) > model.config.block_size:
        print(f"note: the prompt has {len(ids)} tokens; only its last {model.config.block_size} "
              f"(block_size) are used as context")
        ids = ids[-model.config.block_size:]

    idx = torch.tensor([ids] * args.num_samples, dtype=torch.long, device=device)
    with autocast_context(device, resolve_dtype(args.dtype, device)):
        # uncompiled: a few hundred tokens repay no compile (on CUDA still captured as graphs)
        engine = Engine(model)
        decoder = engine.decoder(idx.device)
        out = engine.generate(idx, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k or None,
                              seed=args.seed, decoder="static" if decoder == "compiled" else decoder)
    for row in out.tolist():
        # the BPE model's vocabulary is padded to 50304; padding ids have no text
        print(tok.decode([t for t in row if t < tok.vocab_size]))
        print("---------------")


if __name__ == "__main__":
    run_cli(main)
