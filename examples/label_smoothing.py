"""
A method of your own, judged by run_cycles.py as an arm: MLE with label smoothing (each target keeps 1 - eps of
its mass, the rest spread over the vocabulary), continued from the cycle's generator on the same budget as the
same-budget MLE control. It reads the generator and the corpus with this project's library, writes ckpt.pt in
train.py's format (so its tokenizer record travels with it) and flops.json (6 x parameters x tokens, the
usual count for a forward and backward pass). Any script that takes these words and writes those files will do:

    python run_cycles.py --preset quick --arm smooth='python examples/label_smoothing.py --init {generator}
        --data_dir {data_dir} --out_dir {out_dir} --seed {seed} --max_updates {updates}
        --batch_size {batch_size} --block_size {block_size} --learning_rate {learning_rate} --device {device}'
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository, from anywhere
from lib.checkpoint import load_model, make_checkpoint  # noqa: E402
from lib.corpus import Corpus  # noqa: E402


def parse_args():
    ap = argparse.ArgumentParser(description="MLE with label smoothing from a generator, for run_cycles --arm",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--init", required=True, help="the generator to start from (run_cycles: {generator})")
    ap.add_argument("--data_dir", required=True, help="the prepared corpus (train.bin, meta.pkl)")
    ap.add_argument("--out_dir", required=True, help="where ckpt.pt and flops.json go")
    ap.add_argument("--seed", type=int, default=0, help="the batches' and dropout's seed")
    ap.add_argument("--max_updates", type=int, required=True, help="optimizer updates")
    ap.add_argument("--batch_size", type=int, default=16, help="sequences per update")
    ap.add_argument("--block_size", type=int, default=64, help="tokens per sequence")
    ap.add_argument("--learning_rate", type=float, default=1e-4, help="AdamW's learning rate, constant")
    ap.add_argument("--smoothing", type=float, default=0.1, help="eps: the share of each target spread uniformly")
    ap.add_argument("--device", default="cpu", help="cpu or cuda ('auto': cuda where there is one)")
    return ap.parse_args()


def main():
    args = parse_args()
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    torch.manual_seed(args.seed)
    model, ckpt, _ = load_model(args.init, device=device, require_mode="generator")
    train = Corpus(args.data_dir).train  # a uint16 memmap of the train split
    rng = np.random.default_rng(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.1)
    T = min(args.block_size, model.config.block_size)
    model.train()
    for step in range(args.max_updates):
        ix = rng.integers(0, len(train) - T - 1, size=args.batch_size)
        xy = torch.from_numpy(np.stack([train[i:i + T + 1].astype(np.int64) for i in ix])).to(device)
        logits = model.lm_head(model.hidden_states(xy[:, :-1]))  # (B, T, V): fine at a char vocabulary
        loss = F.cross_entropy(logits.flatten(0, 1), xy[:, 1:].flatten(), label_smoothing=args.smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == args.max_updates - 1:
            print(f"step {step}: smoothed loss {loss.item():.4f}", flush=True)
    os.makedirs(args.out_dir, exist_ok=True)
    records = {k: ckpt[k] for k in ("tokenization", "data") if k in ckpt}  # the tokenizer and split it was trained on
    torch.save(make_checkpoint(model, None, vars(args), **records), os.path.join(args.out_dir, "ckpt.pt"))
    n_params = sum(p.numel() for p in model.parameters())
    with open(os.path.join(args.out_dir, "flops.json"), "w") as f:
        json.dump({"flops": 6.0 * n_params * args.max_updates * args.batch_size * T}, f)
    print(f"wrote {args.out_dir}/ckpt.pt and flops.json")


if __name__ == "__main__":
    main()
