"""
The measurements run_cycles.py takes of every generator, as plain functions (run_cycles.py does the
orchestration, core/plots.py the figure; a detector's are experiment/detection.py's).

Generators (`evaluate_generator`), all on the same fixed samples for every generator:
  val loss / perplexity   one full pass over val.bin (heldout.evaluate_loss)
  real-word rate          share of the words in the samples that occur in the TRAIN split's
                          word vocabulary (computed on decoded text, so for BPE corpora too)
  distinct-2              unique / total word bigrams over all samples
  degenerate share        objectives.degenerate_mask with train_grpo.py's defaults
The samples: `n` prompts of ONE natural token at fixed positions of the val split, each
continued by the generator to L tokens with fixed uniforms (model.generate, KV cache,
temperature 1, full distribution). The natural reference is the same n windows of L val
tokens as written (`natural_reference`).

Words: maximal runs of letters, joined by inner apostrophes ("lov'd", "o'er"), lower-cased.
A word that touches either end of a block may be cut by the block boundary, so it is left
out (of the samples and of the natural reference alike). A set of samples without any word
has rate 0 and distinct-2 0.

"""
import functools
import math
import os
import re

import numpy as np
import torch

from core.errors import DataError, ProjectError
from core.objectives import degenerate_mask
from core.logprobs import logprobs_at_temperatures
from engine import Engine
from lib.checkpoint import load_model
from lib.corpus import as_corpus, open_tokens
from lib.heldout import evaluate_loss, make_eval_loader

WORD_RE = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)*")


# ----------------------------------------------------------------------------- words

def block_words(text):
    """Lower-cased words of one block of text, without the words cut by its two ends."""
    ms = list(WORD_RE.finditer(text))
    if ms and ms[0].start() == 0:
        ms = ms[1:]
    if ms and ms[-1].end() == len(text):
        ms = ms[:-1]
    return [m.group().lower() for m in ms]


def text_words(text):
    """Lower-cased words of a whole text (a corpus: its two ends are real ends)."""
    return [w.lower() for w in WORD_RE.findall(text)]


def real_word_rate(texts, vocab):
    """(share of the blocks' words that are in `vocab`, number of words); 0.0 without words."""
    n = hits = 0
    for t in texts:
        ws = block_words(t)
        n += len(ws)
        hits += sum(w in vocab for w in ws)
    return (hits / n if n else 0.0), n


def distinct_2(texts):
    """(unique word bigrams / all word bigrams over the blocks, number of bigrams); bigrams
    never cross from one block into the next. 0.0 without bigrams."""
    seen, total = set(), 0
    for t in texts:
        ws = block_words(t)
        pairs = list(zip(ws, ws[1:]))
        total += len(pairs)
        seen.update(pairs)
    return (len(seen) / total if total else 0.0), total


def non_word_share(text, vocab):
    """The lexicon baseline's feature: share of a block's words not in `vocab` (0.0 without words)."""
    ws = block_words(text)
    return sum(w not in vocab for w in ws) / len(ws) if ws else 0.0


def corpus_tokenizer(data):
    """The tokenizer of a prepared corpus (meta.pkl -> char, else GPT-2 BPE). `data`, here and
    in every function below that reads the corpus: a Corpus (opened once by the caller) or a
    data directory path."""
    return as_corpus(data).tokenizer


def decode_rows(tok, rows):
    """Decoded text of each row of token ids. Ids outside the tokenizer's vocabulary (BPE
    models pad 50257 up to 50304; a trained model practically never samples them) are dropped."""
    out = []
    for r in np.asarray(rows):
        r = r[r < tok.vocab_size]
        out.append(tok.decode(r.tolist()))
    return out


VOCAB_MAX_TOKENS = 50_000_000  # a larger train split contributes its first this many tokens
VOCAB_CHUNK = 1 << 20


@functools.lru_cache(maxsize=4)
def _vocab_cached(train_bin, size, mtime, data_dir):
    tok = corpus_tokenizer(data_dir)
    data = open_tokens(train_bin)[:VOCAB_MAX_TOKENS]
    vocab, carry = set(), ""
    for s in range(0, len(data), VOCAB_CHUNK):
        text = carry + decode_rows(tok, np.asarray(data[s:s + VOCAB_CHUNK], dtype=np.int64)[None])[0]
        ms = list(WORD_RE.finditer(text))
        carry = ""
        if ms and ms[-1].end() == len(text) and s + VOCAB_CHUNK < len(data):
            carry = text[ms[-1].start():]  # a word cut by the chunk's end continues in the next one
            ms = ms[:-1]
        vocab.update(m.group().lower() for m in ms)
    return frozenset(vocab)


def train_vocabulary(data):
    """The set of lower-cased words of the decoded train split (its first VOCAB_MAX_TOKENS
    tokens; kept in the Corpus, and cached per file version across Corpus objects)."""
    corpus = as_corpus(data)
    if "train_vocabulary" not in corpus.cache:
        path = corpus.train_bin
        if not os.path.exists(path):
            raise DataError(f"{path} not found", "pass the prepared corpus the generators were trained on")
        st = os.stat(path)
        corpus.cache["train_vocabulary"] = _vocab_cached(os.path.abspath(path), st.st_size, st.st_mtime_ns,
                                                         os.path.abspath(corpus.data_dir))
    return corpus.cache["train_vocabulary"]


# ----------------------------------------------------------------------------- samples

def val_tokens(data):
    """The val split's uint16 tokens (the Corpus's memmap)."""
    return as_corpus(data).val


def natural_blocks(val, n, length, seed):
    """n windows of `length` val tokens at fixed random positions (seeded): int64 (n, length)."""
    if len(val) < length:
        raise DataError(f"the val split has {len(val)} tokens, fewer than one block of {length}",
                        "use a larger corpus or shorter samples")
    starts = np.random.default_rng([seed, 0]).integers(0, len(val) - length + 1, size=n)
    return val[starts[:, None] + np.arange(length)[None, :]].astype(np.int64)


@torch.no_grad()
def copy_window(vocab_size):
    """The window a copy is counted in (issue 78): 32 characters of a char corpus, 16 tokens of a BPE one."""
    return 32 if vocab_size <= 256 else 16


def window_hashes(tokens, n):
    """A 64-bit polynomial hash of every n-token window along the last axis (n vectorised passes, 8 bytes a window:
    a corpus' windows fit where a set of them would not; two different windows share a hash with odds ~2^-64)."""
    t = np.asarray(tokens).astype(np.uint64)
    length = t.shape[-1] - n + 1
    h = np.zeros(t.shape[:-1] + (max(length, 0),), dtype=np.uint64)
    with np.errstate(over="ignore"):  # arithmetic mod 2^64 is the hash
        for k in range(n):
            h = h * np.uint64(1_000_003) + t[..., k:k + length] + np.uint64(1)
    return h


def train_windows(tokens, n):
    """The sorted hashes of every n-token window of a token stream (the text a generator may have memorised)."""
    return np.unique(window_hashes(tokens, n)) if len(tokens) >= n else np.zeros(0, dtype=np.uint64)


def copy_rate(rows, windows, n, prompt_len=1):
    """The share of the samples' generated n-token windows (past their prompt) found verbatim in `windows`
    (train_windows of the text the generator trained on): what it reproduces rather than writes."""
    g = np.asarray(rows)[:, prompt_len:]
    if g.shape[1] < n:
        return None
    h = window_hashes(g, n).ravel()
    at = np.minimum(np.searchsorted(windows, h), max(len(windows) - 1, 0))
    return float(np.mean(windows[at] == h)) if len(windows) else 0.0


def generated_blocks(model, val, n, length, seed, device="cpu", temperature=1.0, batch_size=128, prompt_len=1):
    """The generator's blocks: the first `prompt_len` tokens of each natural block (natural_blocks
    with the same seed) continued to `length` tokens, with seeded uniforms (one row each, the same
    for every generator): int64 (n, length)."""
    if not 1 <= prompt_len < length:
        raise ValueError("generated_blocks needs 1 <= prompt_len < length")
    prompts = torch.from_numpy(natural_blocks(val, n, length, seed)[:, :prompt_len])
    U = torch.rand((n, length), generator=torch.Generator().manual_seed(seed))
    model.eval()
    out, engine = [], Engine(model)  # one engine: its decoders serve every batch
    for s in range(0, n, batch_size):
        seqs = engine.generate(prompts[s:s + batch_size].to(device), length - prompt_len,
                               temperature=temperature, uniforms=U[s:s + batch_size].to(device))
        out.append(seqs.cpu())
    return torch.cat(out).numpy().astype(np.int64)


# ----------------------------------------------------------------------------- generators

@torch.no_grad()
def val_perplexity(ckpt_path, data, device, batch_size, block_size=None):
    """Full pass over the corpus's val.bin in windows of `block_size` (default: the model's):
    (loss, perplexity)."""
    model, _, _ = load_model(ckpt_path, device=device, require_mode="generator")
    return _val_perplexity(model, data, device, batch_size, block_size, ckpt_path)


def _val_perplexity(model, data, device, batch_size, block_size, what):
    block_size = block_size or model.config.block_size
    if block_size > model.config.block_size:
        raise ProjectError(f"{what}: block_size {model.config.block_size} is shorter than the evaluation "
                           f"window {block_size} every generator of the run is scored with",
                           "keep the cycle-0 generator's block_size for every generator")
    model.eval()
    loader = make_eval_loader(as_corpus(data).val_bin, block_size, batch_size)
    loss, _ = evaluate_loss(model, loader, device)
    return float(loss), float(math.exp(loss))


@torch.no_grad()
def val_perplexity_at_temperatures(model, data, device, batch_size, block_size=None, temps=(1.0,), items=0):
    """The full val split (evaluate.py's windows, as _val_perplexity) scored under
    softmax(logits / T) for every T, with ONE forward pass per batch:
    {T: {"val_loss", "val_ppl", "val_tokens", "val_nll_sd"}} (val_nll_sd: the per-token spread of
    the NLL). items > 0 adds "val_items": the mean NLL of each of `items` contiguous groups of
    windows (the same groups for every model: paired differences between models)."""
    temps = [float(t) for t in temps]
    if not temps or min(temps) <= 0:
        raise ValueError(f"temperatures must be > 0, got {temps}")
    block_size = block_size or model.config.block_size
    if block_size > model.config.block_size:
        raise ProjectError(f"evaluation window {block_size} is longer than the model's block_size "
                           f"{model.config.block_size}", "use the cycle-0 generator's block_size")
    model.eval()
    sums, sqs, counts = [], [], []  # per window: (len(temps),) NLL sums and squares; token count
    for x, y in make_eval_loader(as_corpus(data).val_bin, block_size, batch_size):
        x, y = x.to(device), y.to(device)
        scored = (y != -1).double()
        nll = -logprobs_at_temperatures(model.hidden_states(x), model.lm_head.weight, y.clamp(min=0), temps).double()
        nll = nll * scored  # (len(temps), B, T)
        sums.append(nll.sum(2).T.cpu())
        sqs.append((nll * nll).sum(2).T.cpu())
        counts.append(scored.sum(1).cpu())
    sums, sqs, counts = torch.cat(sums).numpy(), torch.cat(sqs).numpy(), torch.cat(counts).numpy()
    count = int(counts.sum())
    if count == 0:
        raise DataError("the evaluation data holds no tokens to score")
    groups = np.array_split(np.arange(len(counts)), min(items, len(counts))) if items else []
    out = {}
    for k, t in enumerate(temps):
        mean = float(sums[:, k].sum() / count)
        out[t] = {"val_loss": mean, "val_ppl": math.exp(mean), "val_tokens": count,
                  "val_nll_sd": math.sqrt(max(float(sqs[:, k].sum()) / count - mean * mean, 0.0))}
        if items:
            out[t]["val_items"] = [float(sums[g, k].sum() / counts[g].sum()) for g in groups]
    return out


@torch.no_grad()
def judge_nll(judge, rows, device="cpu", batch_size=128, prompt_len=1):
    """The judge's mean per-token NLL of each row's tokens after the prompt, each predicted from
    all the tokens before it: float64 (n,). The quality axis of the frontier."""
    rows = torch.as_tensor(np.asarray(rows), dtype=torch.long)
    if rows.size(1) > judge.config.block_size:
        raise ProjectError(f"samples of {rows.size(1)} tokens do not fit the judge's block_size "
                           f"{judge.config.block_size}", "use a judge with a longer context or shorter samples")
    judge.eval()
    out = []
    for s in range(0, rows.size(0), batch_size):
        r = rows[s:s + batch_size].to(device)
        logp = judge.token_logprobs(r[:, :-1], r[:, 1:])[:, prompt_len - 1:]
        out.append(-logp.double().mean(1).cpu())
    return torch.cat(out).numpy()


def sample_stats(rows, tok, vocab, prompt_len=1):
    """Real-word rate, distinct-2 and degenerate share of blocks of token ids."""
    texts = decode_rows(tok, rows)
    rate, n_words = real_word_rate(texts, vocab)
    d2, n_bigrams = distinct_2(texts)
    degen = degenerate_mask(torch.from_numpy(np.asarray(rows)[:, prompt_len:]))
    return {"real_word_rate": rate, "words": n_words, "distinct_2": d2, "bigrams": n_bigrams,
            "degenerate_share": float(degen.float().mean()), "samples": len(texts),
            "examples": texts[:2]}


def evaluate_generator(ckpt_path, data, device="cpu", n_samples=256, sample_len=None, seed=0,
                       eval_batch_size=64, eval_block_size=None):
    """Val loss/perplexity and sample quality of a generator checkpoint (see the module doc)."""
    model, _, _ = load_model(ckpt_path, device=device, require_mode="generator")
    corpus = as_corpus(data)
    loss, ppl = _val_perplexity(model, corpus, device, eval_batch_size, eval_block_size, ckpt_path)
    L = sample_len or model.config.block_size
    if not 2 <= L <= model.config.block_size:
        raise ProjectError(f"{ckpt_path}: samples of {L} tokens do not fit its block_size {model.config.block_size}",
                           "use a shorter sample length")
    rows = generated_blocks(model, corpus.val, n_samples, L, seed, device)
    stats = sample_stats(rows, corpus.tokenizer, train_vocabulary(corpus))
    return {"generator": os.path.abspath(ckpt_path), "val_loss": loss, "val_ppl": ppl, "sample_len": L,
            "seed": seed, **stats}


def natural_reference(data, n_samples, sample_len, seed=0):
    """The same statistics on the natural val windows the generators' prompts come from."""
    corpus = as_corpus(data)
    rows = natural_blocks(corpus.val, n_samples, sample_len, seed)
    return {"sample_len": sample_len, "seed": seed,
            **sample_stats(rows, corpus.tokenizer, train_vocabulary(corpus))}



# ----------------------------------------------------------------------------- verdicts

def verdict(measure, adv, ctl, better, noise, noise_text, fmt="{:.4f}", target=None):
    """One honest line comparing the adversarial and the control arm on one measure.

    better: 'lower', 'higher' or 'closer' (to `target`); noise: the largest difference (absolute,
    in the measure's units) that shows no difference, described by `noise_text` (not equivalence: no margin)."""
    a, c = float(adv), float(ctl)
    if better == "closer":
        da, dc = abs(a - target), abs(c - target)
        diff, adv_better = abs(da - dc), da < dc
        what = f"closer to {fmt.format(target)} is better"
    else:
        diff = abs(a - c)
        adv_better = a < c if better == "lower" else a > c
        what = f"{better} is better"
    vals = f"adversarial {fmt.format(a)} vs control {fmt.format(c)}"
    threshold = f"threshold {fmt.format(noise)} = {noise_text}"
    if diff <= noise:
        return f"{measure}: no difference past noise ({vals}; difference {fmt.format(diff)} <= {threshold})"
    winner = "adversarial" if adv_better else "control"
    return f"{measure}: {winner} arm better by {fmt.format(diff)} ({vals}; {what}; {threshold})"


def binomial_noise(p1, n1, p2, n2):
    """Two standard errors of the difference of two independent proportions, each p clipped to
    [1/(2n), 1 - 1/(2n)] so that a share of exactly 0 or 1 still has some uncertainty."""
    def var(p, n):
        n = max(n, 1)
        p = min(max(p, 0.5 / n), 1 - 0.5 / n)
        return p * (1 - p) / n
    return 2.0 * math.sqrt(var(p1, n1) + var(p2, n2))
