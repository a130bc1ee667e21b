"""
Held-out loss and perplexity of a generator checkpoint.

$ python evaluate.py --ckpt out-shakespeare-char-cpu/ckpt.pt              # the val.bin it was trained with
$ python evaluate.py --ckpt out/ckpt.pt --data_dir data/shakespeare_char  # another prepared dataset
$ python evaluate.py --ckpt out/ckpt.pt --bin path/to/val.bin

The whole file is scored: it is cut into consecutive windows of block_size + 1 tokens
that share one token at each boundary, so every token after the first is predicted
exactly once (with up to block_size tokens of context). Perplexity = exp(mean loss).

`calculate_perplexity`, `evaluate_loss` and `make_eval_loader` live in lib/heldout.py (the library).
"""
import argparse
import math
import os

from core.cli import check_flag_ranges, run_cli
from core.devices import add_dtype_arg, resolve_device, resolve_dtype
from core.errors import ProjectError
from lib.checkpoint import checkpoint_tokenization, load_model
from lib.corpus import check_token_bin, read_prepare_info
from lib.heldout import evaluate_loss, make_eval_loader
from tokenization_manager import TokenizationInfo, TokenizationManager, check_tokenization_match


def data_tokenization(data_dir, ckpt_info):
    """TokenizationInfo of the data in data_dir (prepare_info.json, else auto-detection)."""
    prep = read_prepare_info(data_dir)
    if prep and prep.get("tokenization"):
        return TokenizationInfo.from_dict(prep["tokenization"])
    meta = os.path.join(data_dir, "meta.pkl")
    if ckpt_info is not None and ckpt_info.method == "bpe" and not os.path.exists(meta):
        return TokenizationManager("bpe").info
    return TokenizationManager("auto", data_path=data_dir).info


def main():
    ap = argparse.ArgumentParser(description="Print a generator checkpoint's loss and perplexity on a token file.")
    ap.add_argument("--ckpt", required=True, help="generator checkpoint (train.py or train_grpo.py output), or a local Hugging Face "
                         "GPT-2 directory")
    ap.add_argument("--data_dir", default=None,
                    help="prepared dataset directory; its val.bin is scored (default: the data_dir "
                         "recorded in the checkpoint)")
    ap.add_argument("--bin", default=None, help="score this .bin file instead of DATA_DIR/val.bin")
    ap.add_argument("--block_size", type=int, default=None, help="window length (default: the model's block_size)")
    ap.add_argument("--batch_size", type=int, default=32, help="windows per forward pass")
    ap.add_argument("--max_batches", type=int, default=None, help="score only the first N batches (default: all)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N | mps")
    add_dtype_arg(ap)
    args = ap.parse_args()
    check_flag_ranges(args, "evaluate.py", [("batch_size", args.batch_size >= 1, ">= 1"),
                                            ("max_batches", args.max_batches is None or args.max_batches >= 1, ">= 1")])

    device = resolve_device(args.device)
    model, ckpt, _ = load_model(args.ckpt, device=device, require_mode="generator")
    block_size = model.config.block_size if args.block_size is None else args.block_size
    if not 1 <= block_size <= model.config.block_size:
        raise ProjectError(f"--block_size must be in [1, {model.config.block_size}] for this model, got {block_size}",
                           "omit --block_size to use the model's")
    ckpt_tok = checkpoint_tokenization(ckpt)

    data_dir = args.data_dir
    if args.bin is None:
        if data_dir is None:
            data_dir = (ckpt.get("data") or {}).get("data_dir")
            if data_dir is None:
                raise ProjectError(f"{args.ckpt} does not record its data directory",
                                   "pass --data_dir or --bin")
        if not os.path.isdir(data_dir):
            raise ProjectError(f"data directory not found: {data_dir}", "pass --data_dir or --bin")
        bin_path = os.path.join(data_dir, "val.bin")
    else:
        bin_path = args.bin
        data_dir = data_dir or os.path.dirname(os.path.abspath(bin_path))
    check_token_bin(bin_path, min_tokens=2)

    # refuse data tokenized differently from the model
    if ckpt_tok is not None and (os.path.exists(os.path.join(data_dir, "prepare_info.json"))
                                 or os.path.exists(os.path.join(data_dir, "meta.pkl"))):
        check_tokenization_match(data_tokenization(data_dir, ckpt_tok), ckpt_tok, what=f"data in {data_dir}")
    check_token_bin(bin_path, min_tokens=2,
                    vocab_size=ckpt_tok.vocab_size if ckpt_tok else model.config.vocab_size)

    loader = make_eval_loader(bin_path, block_size, args.batch_size)
    dtype = resolve_dtype(args.dtype, device)
    loss, n = evaluate_loss(model, loader, device, args.max_batches, dtype, progress=True)
    scope = "all" if args.max_batches is None or args.max_batches >= len(loader) else f"first {args.max_batches} batches"
    print(f"{bin_path}: {n:,} tokens scored ({scope}), block_size {block_size}")
    print(f"val loss {loss:.4f} | perplexity {math.exp(loss):.3f}")


if __name__ == "__main__":
    run_cli(main, report_peak=True)
