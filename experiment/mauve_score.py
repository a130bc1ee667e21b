"""MAUVE (Pillutla et al., 2021) between a generator's samples and natural text, with features
from a LOCAL Hugging Face GPT-2 directory (nothing is downloaded).

MAUVE embeds both sets of texts with a fixed language model (the final hidden state at each
text's last token), quantizes the joint embeddings with k-means, and measures how far the two
histograms are apart along the divergence curve between them: 1 means indistinguishable, near 0
very different. It sees quality and diversity at once: a generator that repeats one good sample
and one that writes varied noise both score low. The estimate is noisy with few samples (the
paper uses ~5000 per side; with a few hundred expect a spread of several hundredths between
seeds), so compare generators on the same samples and featurizer only (docs/design.md).

Optional: needs `pip install mauve-text` (with faiss-cpu and scikit-learn) and transformers;
`unavailable` says in one line why it cannot run, and run_cycles refuses the flag with it.
"""
import os

import numpy as np
import torch

from tokenization_manager import gpt2_encoding


def unavailable(model_dir):
    """None when MAUVE can run with features from model_dir, else the reason in one line."""
    try:
        import mauve  # noqa: F401
    except ImportError:
        return "the mauve-text package is not installed (pip install mauve-text)"
    try:
        import transformers  # noqa: F401
    except ImportError:
        return "transformers is not installed"
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        return f"{model_dir} is not a local Hugging Face model directory (no config.json)"
    return None


@torch.no_grad()
def featurize(texts, model_dir, device="cpu"):
    """(len(texts), hidden) float32: the featurizer's final hidden state at each text's last token,
    each text in GPT-2 BPE tokens cut to the model's context. One text at a time, so no padding can
    change a feature (a few hundred short texts: cheap next to the run's other measurements)."""
    from transformers import GPT2Model

    model = GPT2Model.from_pretrained(model_dir, local_files_only=True).to(device).eval()
    enc, ctx = gpt2_encoding(), int(model.config.n_positions)
    feats = []
    for text in texts:
        ids = enc.encode_ordinary(text)[-ctx:] or [enc.eot_token]  # an empty text: the end-of-text token
        out = model(torch.tensor([ids], device=device)).last_hidden_state
        feats.append(out[0, -1].float().cpu().numpy())
    return np.stack(feats)


def mauve_score(p_texts, q_texts, model_dir, device="cpu", seed=25):
    """MAUVE of the texts p (a generator's) against q (natural): {"mauve", "samples", "buckets",
    "featurizer"}. k-means over the joint features uses n/10 buckets (mauve's 'auto')."""
    import mauve
    feats = featurize(list(p_texts) + list(q_texts), model_dir, device)  # the featurizer loaded once
    p, q = feats[:len(p_texts)], feats[len(p_texts):]
    out = mauve.compute_mauve(p_features=p, q_features=q, num_buckets="auto", seed=seed, verbose=False)
    return {"mauve": float(out.mauve), "samples": len(p_texts), "buckets": int(out.num_buckets),
            "featurizer": os.path.abspath(model_dir)}
