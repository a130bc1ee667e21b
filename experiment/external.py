"""
Generators made outside this project's arms, judged like them: a user's arm given as a command template
(run_cycles --arm NAME='...'), filled in each cycle and run as a step, and a finished checkpoint placed on a run's
frontier (compare.py). Both read back a checkpoint in this project's or nanoGPT's format or a Hugging Face
directory, refused where its tokenizer or context differs from the run's, and take the FLOPs the command reports
in flops.json beside it (else unknown).
"""
import json
import math
import os
import re
import shlex
import string

from core.errors import ProjectError, TokenizationMismatchError
from experiment.rating import check_same_tokenizer, checkpoint_tokenizer, describe_tokenizer, tokenizer_identity
from experiment.verdicts import NOT_ARMS
from lib.checkpoint import checkpoint_config, checkpoint_mode, checkpoint_tokenization, read_checkpoint

# what a command template may name: the entering generator, where to write, and the same-budget control's budget
FIELDS = {
    "generator": "the arm's generator entering the cycle (cycle 1: the base): the checkpoint to start from",
    "out_dir": "where the command writes its model: ckpt.pt, or a Hugging Face directory, and flops.json",
    "data_dir": "the run's prepared corpus (train.bin, val.bin, meta.pkl)",
    "seed": "the cycle's seed",
    "updates": "the same-budget control's optimizer updates",
    "tokens": "the control's training tokens in all (updates x batch_size x block_size)",
    "batch_size": "the control's sequences per update",
    "block_size": "the control's sequence length",
    "learning_rate": "the control's learning rate",
    "device": "the run's device",
    "detector": "the cycle's detector checkpoint (its reward model; an arm that reads it pays for it)",
    "resume": "--resume where {out_dir} holds an interrupted try's files, else nothing",
}
REQUIRED = ("generator", "out_dir")
FLOPS_FILE = "flops.json"


def split_named(spec, what, example, taken=()):
    """(name, value) of a NAME=VALUE word (run_cycles --arm, compare.py's generators): a lower-case name (letters,
    digits, _) of its own, not a control's, cycle 0's or one in `taken`."""
    name, sep, value = spec.partition("=")
    name = name.strip()
    if not sep or not value or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ProjectError(f"{spec!r} is not {what} with a lower-case NAME (letters, digits, _)", f"e.g. {example}")
    if name in NOT_ARMS or name in taken:
        raise ProjectError(f"{name}: the name is taken (by {'a control' if name in NOT_ARMS else 'another arm'})",
                           "give it a name of its own")
    return name, value


def parse_arm(spec, taken=()):
    """(name, template) of one --arm NAME='TEMPLATE', checked before anything runs: a name of its own, a
    template that splits into words and names only FIELDS, REQUIRED among them."""
    name, template = split_named(spec, "--arm NAME=TEMPLATE", "--arm smooth='python examples/label_smoothing.py "
                                 "--init {generator} --out_dir {out_dir} --max_updates {updates}'", taken)
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
        shlex.split(template)
    except ValueError as e:
        raise ProjectError(f"--arm {name}: its template cannot be read ({e})",
                           "quote it whole in the shell and balance its quotes and braces") from None
    unknown = sorted(fields - set(FIELDS))
    if unknown:
        raise ProjectError(f"--arm {name}: the template names {', '.join('{' + f + '}' for f in unknown)}, which "
                           f"run_cycles does not fill", "use only " + ", ".join("{" + f + "}" for f in FIELDS))
    missing = [f for f in REQUIRED if f not in fields]
    if missing:
        raise ProjectError(f"--arm {name}: the template lacks {', '.join('{' + f + '}' for f in missing)}",
                           "start the command from {generator} and write its model to {out_dir}: that is what "
                           "the arm is judged on")
    if not template.split():
        raise ProjectError(f"--arm {name}: the template is empty", "give the command that trains the arm")
    return name, template


NO_WORD = "\x00"  # a field filled with nothing ({resume} on a first try) leaves no word


def fill(template, values):
    """The template's words with values filled in, each value one word however it is spelt."""
    words = shlex.split(template.format(**{k: shlex.quote(str(v)) if v != "" else NO_WORD for k, v in values.items()}))
    return [w for w in words if w != NO_WORD]


def find_model(out_dir, what):
    """The model a command wrote: out_dir/ckpt.pt (this project's or nanoGPT's format) or out_dir as a Hugging Face
    directory (config.json beside its weights)."""
    ckpt = os.path.join(out_dir, "ckpt.pt")
    if os.path.isfile(ckpt):
        return os.path.abspath(ckpt)
    if os.path.isfile(os.path.join(out_dir, "config.json")):
        return os.path.abspath(out_dir)
    raise ProjectError(f"{what} wrote no model in {out_dir}: looked for ckpt.pt (this project's or nanoGPT's "
                       f"format) and config.json with its weights (a Hugging Face directory)",
                       "make the command save its model to {out_dir}/ckpt.pt (train.py's format, or nanoGPT's), or "
                       "save_pretrained({out_dir})")


def reported_flops(out_dir, what):
    """The FLOPs the command reported in out_dir/flops.json ({"flops": N}), else None (unknown)."""
    path = os.path.join(out_dir, FLOPS_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            value = json.load(f)["flops"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"flops = {value!r}")
    except (ValueError, KeyError, TypeError) as e:  # (json's decode error is a ValueError)
        raise ProjectError(f"{what}: {path} is not {{\"flops\": N}} with N >= 0 ({e})",
                           "write the FLOPs the method spent as a number, or no flops.json (then: unknown)") from None
    return float(value)


def check_generator(path, corpus, block_size, what):
    """Refuse a generator that is not one of the run's kind: a reward model, another tokenizer than the run's
    corpus (method, size, the char vocabulary), or another context than the run's generators (block_size), each
    saying which. A nanoGPT checkpoint records no tokenizer: its vocabulary size must be the corpus's, and it is
    taken to be the corpus's (said once)."""
    ckpt = read_checkpoint(path)
    if checkpoint_mode(ckpt) != "generator":
        raise ProjectError(f"{what}: {path} is a reward model, not a generator", "pass the generator's checkpoint")
    want = tokenizer_identity(corpus.tokenizer)
    if checkpoint_tokenization(ckpt) is None:
        size = checkpoint_config(ckpt, path).vocab_size
        if size != want["vocab_size"]:
            raise TokenizationMismatchError(
                f"{what}: {path} has a vocabulary of {size} tokens, the run's corpus {describe_tokenizer(want)}",
                "train it on the run's prepared corpus (its meta.pkl, or GPT-2 BPE)")
        print(f"note: {what}: {path} records no tokenizer (a nanoGPT checkpoint): its {size} tokens are taken to be "
              f"the run's {want['method']} vocabulary", flush=True)
    else:
        check_same_tokenizer([(f"the run's corpus {corpus.data_dir}", want),
                              (f"{what} ({path})", checkpoint_tokenizer(ckpt, path))])
    context = checkpoint_config(ckpt, path).block_size
    if context != block_size:
        raise ProjectError(f"{what}: {path} has a context of {context} tokens, the run's generators {block_size}",
                           f"train it with block_size {block_size}: every generator is scored in the same windows")
    return ckpt
