"""
GPT-2's shapes with random weights, saved as local Hugging Face directories (save_pretrained: config.json +
model.safetensors), for the GPU check where nothing can be downloaded: time and memory depend on the
shapes, not the weights, so every quality figure made with them means nothing.

    python bench/gpu_models.py --out_dir /tmp/gpt2s                      # gpt2 (124M) and gpt2-medium (355M)
    python bench/gpu_models.py --out_dir /tmp/gpt2s --names gpt2,gpt2-large
"""
import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SHAPES = {"gpt2": (12, 12, 768), "gpt2-medium": (24, 16, 1024), "gpt2-large": (36, 20, 1280),
          "tiny": (2, 2, 64)}  # (n_layer, n_head, n_embd); 'tiny' has GPT-2's vocabulary, for smoke runs

ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
ap.add_argument("--out_dir", required=True, help="one subdirectory per model goes here")
ap.add_argument("--names", default="gpt2,gpt2-medium", help=f"comma-separated, of {', '.join(SHAPES)}")
ap.add_argument("--seed", type=int, default=0, help="seed of the random weights")


def main():
    args = ap.parse_args()
    from transformers import GPT2Config, GPT2LMHeadModel  # optional: this tool needs it, the project does not
    for name in args.names.split(","):
        if name not in SHAPES:
            ap.error(f"--names: unknown {name!r}; choose from {', '.join(SHAPES)}")
        path = os.path.join(args.out_dir, name)
        if os.path.exists(os.path.join(path, "config.json")):
            print(f"{path}: exists")
            continue
        L, H, C = SHAPES[name]
        torch.manual_seed(args.seed)
        GPT2LMHeadModel(GPT2Config(n_layer=L, n_head=H, n_embd=C)).save_pretrained(path)
        print(f"{path}: {name} shapes ({L} layers, {H} heads, {C} wide), random weights")


if __name__ == "__main__":
    main()
