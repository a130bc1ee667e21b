"""
Blind pairwise human evaluation of generators: make a rating page, then score the ratings.

$ python human_eval.py make --gen adv=out-cycles/adv/ckpt.pt --gen control=out-cycles/control/ckpt.pt@0.8 \
      --data_dir data/shakespeare_char --n_items 30 --prompt_len 64 --sample_len 200 --out_dir heval-1
  -> heval-1/index.html (the page: open it in any browser, from file://, no network needed)
     heval-1/key.json   (the unblinding key: keep it, do not send it to raters)
$ python human_eval.py score --key heval-1/key.json --ratings ratings-XXXX.json [more.json ...] --out score.json

make: N prompts of P tokens at fixed random positions of the corpus' val split (seeded); every
generator continues every prompt by L tokens with the same random numbers (measures.
generated_blocks), at its own temperature (full distribution, no top-k). --natural adds the val
text's own continuation as an arm named 'natural'. The page shows every pair of arms for every
prompt, A/B sides balanced and shuffled, arm names hidden (experiment/rating.py's doc has the details).
The rater presses a / b / t (A better, B better, tie); ratings stay in the browser until
downloaded with the page's Download ratings button.

score: per pair of arms, wins / losses / ties of the first arm, its win rate with ties counted
as half a win, and a 95% Wilson interval.
"""
import argparse
import json
import os

from core.cli import check_flag_ranges, run_cli
from core.devices import resolve_device
from core.errors import ProjectError
from core.files import atomic_write_text, check_writable_dir, check_writable_file
from experiment import rating
from experiment.measures import corpus_tokenizer, decode_rows, generated_blocks, natural_blocks, val_tokens
from lib.checkpoint import load_model


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{make,score}")
    mk = sub.add_parser("make", help="sample every generator and write the rating page and its key",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    mk.add_argument("--gen", action="append", default=[], metavar="NAME=CKPT[@T]",
                    help="a generator arm: its name (hidden from raters; letters, digits, _ . -), its checkpoint, "
                         "and optionally @TEMPERATURE; repeat for every arm")
    mk.add_argument("--natural", action="store_true",
                    help="add an arm 'natural': the val text's own continuation of each prompt")
    mk.add_argument("--temperature", type=float, default=1.0, help="temperature of a --gen without @T")
    mk.add_argument("--data_dir", required=True,
                    help="the prepared corpus the generators were trained on (val.bin, meta.pkl for char)")
    mk.add_argument("--n_items", type=int, default=20,
                    help="number of prompts; the page holds n_items * k(k-1)/2 items for k arms")
    mk.add_argument("--prompt_len", type=int, default=32, help="prompt length in tokens (taken from val.bin)")
    mk.add_argument("--sample_len", type=int, default=128, help="continuation length in tokens")
    mk.add_argument("--seed", type=int, default=0,
                    help="seeds the prompts' positions, the sampling noise and the page order")
    mk.add_argument("--question", default="Which continuation of the prompt reads more like real text "
                                          "(fluent, coherent, in the style of the prompt)?",
                    help="the question shown to raters")
    mk.add_argument("--out_dir", required=True, help="writes OUT_DIR/index.html and OUT_DIR/key.json")
    mk.add_argument("--overwrite", action="store_true",
                    help="replace an existing OUT_DIR/key.json (ratings made on the old page can then no "
                         "longer be scored)")
    mk.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    mk.add_argument("--batch_size", type=int, default=64, help="prompts per generation batch")
    sc = sub.add_parser("score", help="win rates per pair of arms from downloaded ratings",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sc.add_argument("--key", required=True, help="the key.json that make wrote beside the page")
    sc.add_argument("--ratings", required=True, nargs="+", metavar="RATINGS.json",
                    help="ratings file(s) downloaded from the page; several raters' files are pooled")
    sc.add_argument("--out", default=None, help="also write the score as JSON to this file")
    return ap


def check_make_args(args):
    check_flag_ranges(args, "human_eval.py make", [(flag, getattr(args, flag) >= 1, ">= 1")
                                                   for flag in ("n_items", "prompt_len", "sample_len", "batch_size")])
    if not os.path.isfile(os.path.join(args.data_dir, "val.bin")):  # else the tokenizer check names the wrong cause
        what = "holds no val.bin" if os.path.isdir(args.data_dir) else "is not a directory"
        raise ProjectError(f"--data_dir {args.data_dir} {what}",
                           "pass the corpus the generators were trained on, as prepare_data.py wrote it "
                           "(val.bin, and meta.pkl for characters)")
    key_path = os.path.join(args.out_dir, "key.json")
    if os.path.exists(key_path) and not args.overwrite:
        raise ProjectError(f"{key_path} already exists: ratings made on that page need it",
                           "choose another --out_dir, or pass --overwrite to replace the page and its key")
    arms = [rating.parse_gen_spec(s, args.temperature) for s in args.gen]
    rating.check_arm_names([a[0] for a in arms], args.natural)
    check_writable_dir(args.out_dir, "--out_dir")  # before the sampling, not after it
    return arms


def load_generators(arms, data_dir, total_len, device):
    """(models, arms_info, corpus tokenizer): every checkpoint loaded, sharing the corpus' tokenizer
    (a total_len past a block_size is sampled with a sliding window). (torch is imported here, so
    that `score` starts fast.)"""
    corpus_tok = corpus_tokenizer(data_dir)
    corpus = rating.tokenizer_identity(corpus_tok)
    named, models, info = [], {}, []
    for name, path, temperature in arms:
        model, ckpt, _ = load_model(path, device=device, require_mode="generator")
        named.append((f"generator {name} ({path})", rating.checkpoint_tokenizer(ckpt, path)))
        if total_len > model.config.block_size:  # as sample.py: model.generate slides the context window
            print(f"note: generator {name}: prompt_len + sample_len = {total_len} tokens exceed its block_size "
                  f"{model.config.block_size}; it samples with a sliding window (when the context is full, it "
                  f"goes on from the last {model.config.block_size // 2} tokens), as sample.py does")
        models[name] = model
        info.append({"name": name, "checkpoint": os.path.abspath(path), "sha256": rating.file_sha256(path),
                     "temperature": temperature})
    rating.check_same_tokenizer(named)
    rating.check_same_tokenizer([named[0], (f"the corpus {data_dir}", corpus)])
    return models, info, corpus_tok


def make(args):
    arms = check_make_args(args)
    device = resolve_device(args.device)
    P, L, n = args.prompt_len, args.sample_len, args.n_items
    models, arms_info, tok = load_generators(arms, args.data_dir, P + L, device)
    val = val_tokens(args.data_dir)
    natural = natural_blocks(val, n, P + L, args.seed)
    prompts = decode_rows(tok, natural[:, :P])
    texts = {}
    for name, path, temperature in arms:
        print(f"sampling {n} continuations of {L} tokens from {name} ({path}, temperature {temperature})")
        rows = generated_blocks(models[name], val, n, P + L, args.seed, device, temperature, args.batch_size, P)
        texts[name] = decode_rows(tok, rows[:, P:])
    if args.natural:
        texts[rating.NATURAL] = decode_rows(tok, natural[:, P:])
        arms_info.append({"name": rating.NATURAL, "checkpoint": None, "sha256": None, "temperature": None})
    items = rating.make_items(n, [a["name"] for a in arms_info], args.seed)
    page_id = rating.page_id_of(items, prompts, texts, args.seed)
    settings = {"seed": args.seed, "n_prompts": n, "prompt_len": P, "sample_len": L,
                "data_dir": os.path.abspath(args.data_dir), "tokenization": tok.method, "question": args.question}
    key = rating.make_key(page_id, items, arms_info, settings)
    page = rating.render_page(page_id, args.question, items, prompts, texts)
    key_path, page_path = os.path.join(args.out_dir, "key.json"), os.path.join(args.out_dir, "index.html")
    atomic_write_text(key_path, json.dumps(key, indent=1) + "\n")  # the key first: a page without it is useless
    atomic_write_text(page_path, page)
    print(f"wrote {page_path} ({len(items)} items, page id {page_id}): give this file to the raters")
    print(f"wrote {key_path}: the unblinding key; keep it, do not send it with the page")
    print(f"then: python human_eval.py score --key {key_path} --ratings ratings-{page_id}.json")


def score(args):
    check_flag_ranges(args, "human_eval.py score")
    if args.out is not None:
        check_writable_file(args.out, "--out")
    key = rating.read_json(args.key, "--key", "key.json written by human_eval.py make")
    rating.check_key(key, args.key)
    if len({os.path.abspath(p) for p in args.ratings}) < len(args.ratings):
        raise ProjectError("--ratings lists the same file twice", "pass each rater's file once")
    rated = []
    for path in args.ratings:
        r = rating.read_json(path, "--ratings", "ratings file downloaded from the page")
        rows = rating.check_ratings(r, path, key, args.key)
        print(f"{path}: {len(rows)} of {len(key['items'])} items rated")
        rated += rows
    result = rating.score(key, rated, len(args.ratings))
    print(rating.format_table(result))
    if args.out:
        atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.cmd == "make":
        make(args)
    else:
        score(args)


if __name__ == "__main__":
    run_cli(main)
