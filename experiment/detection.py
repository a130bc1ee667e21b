"""
The measurements of a detector (`measure_detector`): the reward model's own val MAE / constant-0.5 MAE / corr
(reward_summary.json), the standard error of its val MAE, the learning curve (metrics.jsonl),
its AUROC of P(natural) separating n natural val blocks of N tokens from n blocks of the
generator (1 natural token + N-1 generated: K = 1), and the lexicon baseline on the same
reward data: feature = share of a block's words that never occur in the train split, a
least-squares line y0 = a + b * feature fitted on the reward train split, MAE on the reward
val split with predictions clipped to [0, 1]. And the mechanism (issue 78): P(natural) against the generator's
surprisal on its own train text, on natural val text and on its samples (`mechanism`).
"""
import hashlib
import json
import math
import os

import numpy as np
import torch

from core.errors import DataError
from core.files import read_jsonl, sha256_file
from experiment.measures import decode_rows, generated_blocks, natural_blocks, non_word_share, train_vocabulary
from lib.checkpoint import load_model, sequence_length
from lib.corpus import as_corpus
from lib.reward_head import cached_head_logits, frozen_features, sequence_p_natural
from model import head_input_width
from reward_dataset_loader import RewardDataset


def average_ranks(x):
    """1-based ranks of x, ties given the mean of the ranks they span."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    sx = x[order]
    starts = np.flatnonzero(np.r_[True, sx[1:] != sx[:-1]])
    ends = np.r_[starts[1:], len(sx)]
    ranks = np.empty(len(x))
    ranks[order] = np.repeat((starts + 1 + ends) / 2.0, ends - starts)
    return ranks



def auroc(pos_scores, neg_scores):
    """Area under the ROC curve = P(a positive scores above a negative), ties counting 1/2
    (the Mann-Whitney U statistic over n_pos * n_neg)."""
    pos = np.asarray(pos_scores, dtype=np.float64).ravel()
    neg = np.asarray(neg_scores, dtype=np.float64).ravel()
    if not len(pos) or not len(neg):
        raise ValueError("auroc needs at least one positive and one negative score")
    if not (np.isfinite(pos).all() and np.isfinite(neg).all()):
        raise ValueError("auroc needs finite scores")
    ranks = average_ranks(np.concatenate([pos, neg]))
    n1, n2 = len(pos), len(neg)
    return float((ranks[:n1].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n2))



def auroc_se(a, n_pos, n_neg):
    """Standard error of an AUROC (Hanley & McNeil 1982)."""
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    var = (a * (1 - a) + (n_pos - 1) * (q1 - a * a) + (n_neg - 1) * (q2 - a * a)) / (n_pos * n_neg)
    return float(math.sqrt(max(var, 0.0)))



@torch.no_grad()
def per_block(model, blocks, fn, device="cpu", batch_size=256):
    """fn(model, x) (one number per row) over the blocks in batches of batch_size rows, model in eval mode:
    float64 (n,)."""
    model.eval()
    out = []
    for s in range(0, len(blocks), batch_size):
        x = torch.as_tensor(np.asarray(blocks[s:s + batch_size], dtype=np.int64), device=device)
        out.append(fn(model, x).float().cpu())
    return torch.cat(out).numpy().astype(np.float64)


def detector_scores(model, blocks, device="cpu", batch_size=256):
    """P(natural) of each block: probs[:, 0] of `probs, _ = model(x)`."""
    return per_block(model, blocks, lambda m, x: m(x)[0][:, 0], device, batch_size)



def trunk_digest(model):
    """sha256 of the parameters the reward head's input is a function of (model.transformer: the
    embeddings, which also give the LM features, the blocks and ln_f; and the generator copy whose features it
    reads, if any): detectors on one frozen trunk (strong_trunk) share it."""
    h = hashlib.sha256()
    state = {**model.transformer.state_dict(),
             **({f"gen_lm.{k}": v for k, v in model.gen_lm.state_dict().items()} if hasattr(model, "gen_lm") else {})}
    for name, t in sorted(state.items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()



def block_surprisal(model, blocks, device="cpu", batch_size=256):
    """The generator's mean surprisal of each block, -log p(x_t | x_<t) over t >= 1, in nats per token."""
    return per_block(model, blocks, lambda m, x: -m.token_logprobs(x[:, :-1], x[:, 1:]).float().mean(dim=1),
                     device, batch_size)


MECHANISM_POINTS = 64  # blocks per kind kept for the figure


def mechanism(scores):
    """What the detector rewards, measured (issue 78). scores: {kind: (P(natural) per block, the generator's
    surprisal per block)} for kind in train (natural text the generator trained on), val (natural text it never
    saw) and generated (its own samples). Per kind: the means and their SEs, and the first MECHANISM_POINTS
    blocks as (surprisal, P(natural)) points. memorised_auroc: the AUROC of P(natural) separating the train text
    from the val text, natural both: 0.5 if the detector cannot tell memorised text from unseen text, above if
    it calls the memorised text more natural. corr_natural: P(natural)'s correlation with the surprisal over
    the natural blocks of both kinds (negative: it reads "low surprisal = natural")."""
    out = {}
    for kind, (p, s) in scores.items():
        p, s = np.asarray(p, dtype=np.float64), np.asarray(s, dtype=np.float64)
        out[kind] = {"p_natural": float(p.mean()), "p_natural_se": float(p.std(ddof=1) / math.sqrt(len(p))),
                     "surprisal": float(s.mean()), "surprisal_se": float(s.std(ddof=1) / math.sqrt(len(s))),
                     "points": [[round(float(a), 4), round(float(b), 4)] for a, b in
                                zip(s[:MECHANISM_POINTS], p[:MECHANISM_POINTS])]}
    (p_tr, s_tr), (p_va, s_va) = scores["train"], scores["val"]
    a = auroc(p_tr, p_va)
    p_nat, s_nat = np.concatenate([p_tr, p_va]), np.concatenate([s_tr, s_va])
    corr = float(np.corrcoef(p_nat, s_nat)[0, 1]) if p_nat.std() > 0 and s_nat.std() > 0 else 0.0
    return {**out, "memorised_auroc": a, "memorised_auroc_se": auroc_se(a, len(p_tr), len(p_va)),
            "corr_natural": corr}


FEATURE_CACHE_BYTES = 1 << 28  # natural_scores keeps at most this much, of one trunk's features only



@torch.no_grad()
def natural_scores(det, blocks, device="cpu", cache=None, key=None, batch_size=256):
    """detector_scores(det, blocks), with the head's input kept in `cache` under (key, the trunk's digest)
    and reused by a later detector on the same trunk (its frozen features of the same natural blocks):
    the same numbers (the head on cached features is what training evaluates). Only the latest trunk's
    are kept: detectors that train their trunk (per_position) never share, and must not pile up."""
    blocks = np.asarray(blocks, dtype=np.int64)
    width = head_input_width(det.config)
    if cache is None or 4 * blocks.size * width > FEATURE_CACHE_BYTES:
        return detector_scores(det, blocks, device, batch_size)
    det.eval()
    n_layer = len(det.transformer.h)
    k = (key, trunk_digest(det), head_input_width(det.config))
    if k not in cache:  # in detector_scores' batches, kept on the CPU
        cache.clear()
        cache[k] = [frozen_features(det, torch.as_tensor(blocks[s:s + batch_size], device=device), n_layer).cpu()
                    for s in range(0, len(blocks), batch_size)]
    out = [sequence_p_natural(cached_head_logits(det, f.to(device), n_layer)).float().cpu() for f in cache[k]]
    return torch.cat(out).numpy().astype(np.float64)



def fit_lexicon_baseline(train_features, train_y0, val_features, val_y0):
    """Least-squares line y0 = a + b * feature on train; (val MAE with predictions clipped to
    [0, 1], a, b)."""
    f = np.asarray(train_features, dtype=np.float64)
    A = np.stack([np.ones_like(f), f], axis=1)
    (a, b), *_ = np.linalg.lstsq(A, np.asarray(train_y0, dtype=np.float64), rcond=None)
    pred = np.clip(a + b * np.asarray(val_features, dtype=np.float64), 0.0, 1.0)
    return float(np.abs(pred - np.asarray(val_y0, dtype=np.float64)).mean()), float(a), float(b)



def lexicon_baseline(reward_data_dir, vocab, tok):
    """The lexicon baseline's val MAE on a reward dataset (see the module doc): (mae, a, b)."""
    feats = {}
    for split in ("train", "val"):
        ds = RewardDataset(reward_data_dir, split)
        if len(ds) == 0:
            raise DataError(f"{reward_data_dir}: the {split} split is empty", "regenerate the reward dataset")
        texts = decode_rows(tok, ds.x)
        feats[split] = (np.array([non_word_share(t, vocab) for t in texts]), np.asarray(ds.y[:, 0], np.float64))
    return fit_lexicon_baseline(*feats["train"], *feats["val"])



@torch.no_grad()
def detector_val_errors(model, reward_data_dir, device="cpu", batch_size=256, predictions=None, split="val",
                        limit=None):
    """|P(natural) - K/N| of every sample of the reward dataset's val split (split "train": of `limit` of its train
    samples, evenly spaced: what the detector learned from, against which its val errors show overfitting).
    predictions: a file of the model's P(natural) of every val sample in order (train_reward_model.py's
    val_predictions.npy), read instead of scoring the split again when it holds one per sample."""
    ds = RewardDataset(reward_data_dir, split)
    if limit is not None and len(ds) > limit:
        pick = np.linspace(0, len(ds) - 1, limit).round().astype(np.int64)
        y = np.asarray(ds.y[pick, 0], dtype=np.float64)
        return np.abs(detector_scores(model, np.asarray(ds.x[pick]), device, batch_size) - y)
    p = None
    if predictions is not None and os.path.exists(predictions):
        p = np.load(predictions, allow_pickle=False)
        p = p.astype(np.float64) if p.shape == (len(ds),) else None  # a partial eval (--eval_max_batches)
    if p is None:
        p = detector_scores(model, ds.x, device, batch_size)
    return np.abs(p - np.asarray(ds.y[:, 0], dtype=np.float64))



def autocast_precision(device):
    """The precision the caller's autocast gives `device`'s matmuls: 'bfloat16', 'float16' or 'float32'."""
    kind = torch.device(device).type
    return str(torch.get_autocast_dtype(kind)).removeprefix("torch.") if torch.is_autocast_enabled(kind) else "float32"



def learning_curve(metrics_path):
    """[(step, val_mae, const_mae)] of the reward model's evaluations, in order (one per step)."""
    by_iter = {}
    for r in read_jsonl(metrics_path):
        if r.get("kind") == "eval" and isinstance(r.get("val_mae"), (int, float)):
            step = int(r["step"] if "step" in r else r["iter"])  # "iter": the logs before the trainers' rename
            by_iter[step] = [step, float(r["val_mae"]), float(r.get("const_mae", 0.5))]
    return [by_iter[k] for k in sorted(by_iter)]



def measure_detector(reward_model_dir, reward_data_dir, generator_ckpt, data, device="cpu",
                     n_blocks=256, seed=0, known_blocks=None, feature_cache=None, lexicon_data=None, seen_data=None):
    """Everything run_cycles reports about one fresh detector of one generator. known_blocks: the
    generator's blocks already made by the caller, {(n, length, seed): generated_blocks(generator, val, n,
    length, seed)} (its sweep's T = 1 samples), used instead of sampling them again when the key matches.
    The val errors come from the reward model's own val predictions (val_predictions.npy) where it wrote them
    at the precision of this measurement (the caller's autocast, or float32).
    feature_cache: a dict kept across detectors, so those on one frozen trunk share the head's input for
    the natural blocks (natural_scores). lexicon_data: the corpus whose train split gives the lexicon's words (the
    arms' own text, whose val split is the reward data's dev slice: under --data_chars the D characters less their
    dev slice, never the text the baseline is scored on); default `data`. seen_data: the corpus whose train split the
    generator trained on, the mechanism's "train" text (the heldout arm's (1 - h) D); default lexicon_data."""

    with open(os.path.join(reward_model_dir, "reward_summary.json")) as f:
        rs = json.load(f)
    det, det_ckpt, _ = load_model(rs["checkpoint"], device=device, require_mode="reward")
    N = sequence_length(det_ckpt, rs["checkpoint"])
    corpus = as_corpus(data)
    val = corpus.val
    nat = natural_blocks(val, n_blocks, N, seed)
    gen, _, _ = load_model(generator_ckpt, device=device, require_mode="generator")
    syn = (known_blocks or {}).get((n_blocks, N, seed))
    if syn is None:
        syn = generated_blocks(gen, val, n_blocks, N, seed, device)
    p_nat, p_syn = natural_scores(det, nat, device, feature_cache, ("natural", n_blocks, N, seed)), \
        detector_scores(det, syn, device)
    a = auroc(p_nat, p_syn)
    lexicon_corpus = as_corpus(lexicon_data) if lexicon_data is not None else corpus
    # the generator's own train text: the arms' (under --data_chars, the D characters less their dev slice)
    seen_corpus = as_corpus(seen_data) if seen_data is not None else lexicon_corpus
    seen = natural_blocks(seen_corpus.train, n_blocks, N, seed)
    mech = mechanism({"train": (detector_scores(det, seen, device), block_surprisal(gen, seen, device)),
                      "val": (p_nat, block_surprisal(gen, nat, device)),
                      "generated": (p_syn, block_surprisal(gen, syn, device))})
    preds = rs.get("val_predictions")
    if preds and rs.get("val_predictions_x_sha256") != sha256_file(os.path.join(reward_data_dir, "val_x.bin")):
        preds = None  # made on other val samples than these
    if preds and rs.get("dtype", "float32") != autocast_precision(device):
        preds = None  # made at another precision than this measurement's (e.g. bfloat16 training, float32 here)
    err = detector_val_errors(det, reward_data_dir, device,
                              predictions=preds and os.path.join(reward_model_dir, preds))
    words = train_vocabulary(lexicon_corpus)
    lex, la, lb = lexicon_baseline(reward_data_dir, words, corpus.tokenizer)
    # its errors on (as many of) the samples it trained on: far below the val errors, it learned those by heart
    train_err = detector_val_errors(det, reward_data_dir, device, split="train", limit=len(err))
    return {"generator": os.path.abspath(generator_ckpt), "checkpoint": rs["checkpoint"],
            "val_mae": float(rs["val_mae"]), "train_mae": float(train_err.mean()), "const_mae": float(rs["const_mae"]),
            "val_corr": float(rs.get("val_corr") or 0.0), "val_loss": float(rs["val_loss"]),
            "iters": int(rs.get("iters", 0)), "best_iter": int(rs.get("best_iter", 0)),
            "val_samples": len(err), "val_mae_se": float(err.std(ddof=1) / math.sqrt(len(err))) if len(err) > 1 else 0.0,
            "auroc": a, "auroc_se": auroc_se(a, n_blocks, n_blocks), "auroc_blocks": n_blocks, "block_size": N,
            "lexicon_mae": lex, "lexicon_fit": [la, lb], "lexicon_text": os.path.abspath(lexicon_corpus.data_dir),
            "seen_text": os.path.abspath(seen_corpus.data_dir),
            "curve": learning_curve(os.path.join(reward_model_dir, "metrics.jsonl")), "mechanism": mech}
