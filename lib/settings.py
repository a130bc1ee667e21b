"""
train.py's and train_reward_model.py's settings, defined once: each script's parser (its flags and their one
default; train.py's under nanoGPT config files) and its checks after parsing, read by the scripts and by run_cycles
(experiment/cli.py). GRPO's and SPIN's: lib/rl_settings.py.
"""
import argparse

from configurator import DatasetAction, add_config_arguments, add_unevaluated_default, parse_args_with_config
from core.cli import EPILOG, OneLineHelp, check_flag_ranges, str2bool
from core.devices import add_dtype_arg
from core.errors import ProjectError
from core.tracking import add_tracking_args


# ---------------------------------------------------------------- train.py

def add_train_io_flags(p):
    """train.py's flags of its files, evaluation and stopping."""
    a = p.add_argument
    a("--out_dir", default="out", help="directory for ckpt.pt (best val), last.pt (latest) and metrics.jsonl")
    a("--data_dir", default="data/shakespeare_char", help="directory holding train.bin and val.bin (uint16 tokens)")
    a("--dataset", default=None, action=DatasetAction,
      help="nanoGPT's dataset name: short for --data_dir data/DATASET (relative to the current directory); "
           "of --dataset and --data_dir the later one wins, and flags win over config files")
    a("--tokenization", default="auto", choices=["auto", "bpe", "char"],
      help="'auto': char if data_dir has a meta.pkl (or 'char' in its name), else GPT-2 bpe")
    a("--meta_path", default=None, help="char vocabulary meta.pkl (default: data_dir/meta.pkl)")
    a("--init_from", default="scratch", metavar="{scratch,resume,PATH}",
      help="'scratch': a new model from the model flags; 'resume': continue from out_dir/last.pt (or ckpt.pt "
           "if there is no last.pt); PATH: fine-tune pretrained weights, either a local Hugging Face GPT-2 "
           "directory (config.json + model.safetensors or pytorch_model.bin, as save_pretrained or export_hf.py "
           "write it) or a generator checkpoint .pt of this project or nanoGPT. With PATH the architecture flags "
           "come from the weights, --block_size can only crop the context, --dropout applies, and the data must "
           "use the weights' tokenization (GPT-2 weights: bpe). Nothing is downloaded: a hub name such as 'gpt2' "
           "is an error that says how to save the weights to a directory")
    a("--resume", action="store_true",
      help="continue from out_dir/last.pt (or ckpt.pt), as --resume does in every script; "
           "nanoGPT's --init_from resume is the same")
    a("--eval_interval", type=int, default=2000, help="evaluate train/val loss every this many iterations")
    a("--log_interval", type=int, default=1, help="print and log the training loss every this many iterations")
    a("--eval_iters", type=int, default=200, help="batches per split for each loss estimate")
    a("--eval_only", type=str2bool, nargs="?", const=True, default=False,
      help="evaluate once (the new or resumed model) and exit without writing anything")
    a("--always_save_checkpoint", type=str2bool, nargs="?", const=True, default=True,
      help="write last.pt at every evaluation (False: only when training ends); "
           "ckpt.pt is written whenever the val loss improves either way")
    a("--patience", type=int, default=5,
      help="stop after this many evaluations without a val-loss gain of --min_delta (early stopping; 0 = off)")
    a("--min_delta", type=float, default=0.001, help="smallest val-loss decrease that counts as a gain "
                                                     "(early stopping)")


def train_parser(parser_class=argparse.ArgumentParser):
    p = parser_class(
        prog="train.py",
        description="Train the base GPT language model (nanoGPT-equivalent).",
        formatter_class=OneLineHelp,
        epilog="Effective batch size per optimizer step = batch_size * block_size * "
               "gradient_accumulation_steps tokens (under torchrun the accumulation steps are divided "
               "among the processes, so the total stays the same). Early stopping: training stops when "
               "the val loss has not improved by at least --min_delta for --patience consecutive "
               "evaluations (defaults 5 and 0.001; --patience 0 disables it); ckpt.pt always holds "
               "the best val loss seen. " + EPILOG)
    a = p.add_argument
    add_config_arguments(p)
    add_train_io_flags(p)
    # data and batches
    a("--gradient_accumulation_steps", type=int, default=1,
      help="micro-batches per optimizer step (in total over all DDP processes)")
    a("--batch_size", type=int, default=12, help="sequences per micro-batch (per process)")
    a("--block_size", type=int, default=1024, help="context length in tokens")
    # model
    a("--n_layer", type=int, default=12, help="transformer blocks")
    a("--n_head", type=int, default=12, help="attention heads per block")
    a("--n_embd", type=int, default=768, help="embedding width")
    a("--dropout", type=float, default=0.0, help="dropout probability (0 for pretraining, 0.1+ for small data)")
    a("--bias", type=str2bool, nargs="?", const=True, default=False,
      help="biases in Linear and LayerNorm layers")
    # optimizer and schedule
    a("--learning_rate", type=float, default=6e-4, help="peak learning rate (AdamW)")
    a("--max_iters", type=int, default=600000, help="total optimizer steps")
    a("--weight_decay", type=float, default=1e-1, help="AdamW weight decay (matrices only)")
    a("--beta1", type=float, default=0.9, help="AdamW beta1")
    a("--beta2", type=float, default=0.95, help="AdamW beta2")
    a("--grad_clip", type=float, default=1.0, help="clip the gradient norm to this value (0 = no clipping)")
    a("--decay_lr", type=str2bool, nargs="?", const=True, default=True,
      help="linear warmup then cosine decay of the learning rate")
    a("--warmup_iters", type=int, default=2000, help="warmup steps")
    a("--lr_decay_iters", type=int, default=600000, help="step at which the cosine decay reaches min_lr (about "
                                                         "max_iters)")
    a("--min_lr", type=float, default=6e-5, help="final learning rate (about learning_rate / 10)")
    # system
    a("--device", default="auto", help="auto | cpu | cuda | cuda:N | mps")
    add_dtype_arg(p)
    a("--compile", type=str2bool, nargs="?", const=True, default=None,
      help="torch.compile the model (default: on for CUDA, as nanoGPT; off elsewhere, where it does not pay; "
           "the first steps then take a minute)")
    a("--seed", type=int, default=1337, help="random seed; the batch stream is the same for any number of processes, "
                                           "dropout noise is seeded per process (seed + rank)")
    a("--backend", default="auto", choices=["auto", "nccl", "gloo"],
      help="torch.distributed backend under torchrun ('auto': nccl on GPU, gloo on CPU)")
    add_tracking_args(p)  # nanoGPT's wandb_* settings, and TensorBoard
    add_unevaluated_default(p, {"wandb_run_name": "W&B picks a run name"})
    return p



def train_args(argv=None):
    # init_from is checked where the model is built (nanoGPT configs may say init_from = 'gpt2')
    args = parse_args_with_config(train_parser(), argv, free_choices=("init_from",))
    if args.resume:  # one spelling for every script; --init_from resume is nanoGPT's
        if args.init_from not in ("scratch", "resume"):
            raise ProjectError(f"--resume and --init_from {args.init_from} contradict each other",
                               "--resume continues this run from out_dir; drop one of the two")
        args.init_from = "resume"
    del args.resume
    check_flag_ranges(args, "train.py", [
        *((name, getattr(args, name) >= 1, ">= 1") for name in (
            "eval_interval", "log_interval", "eval_iters", "gradient_accumulation_steps", "batch_size", "block_size",
            "n_layer", "n_head", "n_embd")),
        *((name, getattr(args, name) >= 0, ">= 0") for name in ("max_iters", "patience"))])
    if args.n_embd % args.n_head:
        raise ProjectError(f"--n_embd {args.n_embd} is not divisible by --n_head {args.n_head}")
    if args.tokenization == "bpe" and args.meta_path is not None:
        raise ProjectError("--meta_path is a char vocabulary, but --tokenization is bpe",
                           "drop --meta_path, or use --tokenization char / auto")
    return args


# ---------------------------------------------------------------- train_reward_model.py

def reward_model_parser(parser_class=argparse.ArgumentParser):
    p = parser_class(prog="train_reward_model.py", formatter_class=OneLineHelp, epilog=EPILOG,
                     description="Train a reward model (P(natural) of a sequence) on a "
                                "reward dataset, starting from a generator checkpoint.")
    g = p.add_argument_group("model and data")
    g.add_argument("--model_path", required=True,
                   help="generator checkpoint whose trunk the reward model uses (train.py / train_grpo.py), "
                        "or a local Hugging Face GPT-2 directory")
    g.add_argument("--data_dir", default="data/reward_dataset",
                   help="reward dataset directory ({train,val}_x.bin, _y.bin, _metadata.txt)")
    g.add_argument("--out_dir", default="out-reward",
                   help="output directory for reward_ckpt.pt, metrics.jsonl and the plots")
    g.add_argument("--reward_head_hidden_dim", type=int, default=256, help="hidden width of the reward head MLP")
    g.add_argument("--unfreeze_last_n_blocks", type=int, default=0,
                   help="also train the last N transformer blocks (and the final LayerNorm); "
                        "0 = frozen trunk, only the head trains; -1 = the whole trunk, embeddings included")
    g.add_argument("--per_position", action="store_true",
                   help="score every position instead of the last one: position t is labelled natural iff "
                        "t < K (K recovered exactly from the stored K/N; inexact targets are refused) and the "
                        "sequence's P(natural) is the mean over positions. The design's last-token head "
                        "(the default) sees only the last position, which is synthetic in every sample, and "
                        "stays at chance on the default run")
    g.add_argument("--lm_features", action="store_true",
                   help="LM features for the head: at every position, the surprisal of the token and the entropy of "
                        "the trunk's own next-token prediction (via the tied embedding): with a trunk from a "
                        "stronger LM (--init_trunk_from) this is what tells a weaker generator's text apart")
    g.add_argument("--gen_features", action="store_true",
                   help="the head also reads the generator's surprisal and the trunk's log-ratio to it (with "
                        "--lm_features): the generator is --model_path, its surprisal of every token and log p_trunk - "
                        "log p_gen are read at every position (a frozen copy of the generator rides in the detector, "
                        "lib/reward_head.Detector); the statistic of the ideal detector on this trunk, which "
                        "the trunk's own features cannot form")
    g.add_argument("--init_trunk_from", default=None,
                   help="the detector's trunk: this generator checkpoint's instead of --model_path's "
                        "(same tokenization, block_size >= the dataset's N), e.g. a larger or longer-trained "
                        "model of the same data; --model_path still names the generator the data came from")
    g.add_argument("--dropout", type=float, default=0.0, help="dropout inside unfrozen blocks")
    g = p.add_argument_group("training")
    g.add_argument("--loss", choices=["mse", "ce"], default="mse",
                   help="mse: squared error of the probabilities (the design's choice); ce: soft-label "
                        "cross-entropy on the head's logits")
    g.add_argument("--optimizer", choices=["adamw", "adam"], default="adamw",
                   help="optimizer of the head and the unfrozen blocks")
    g.add_argument("--learning_rate", type=float, default=1e-4, help="learning rate")
    g.add_argument("--weight_decay", type=float, default=0.01, help="AdamW weight decay (matrices only)")
    g.add_argument("--grad_clip", type=float, default=1.0, help="clip the gradient norm to this (0 = off)")
    g.add_argument("--batch_size", type=int, default=32,
                   help="sequences per optimizer step, in total: under torchrun each of N processes takes "
                        "batch_size / N of them (must divide), so the run is the same for any N")
    g.add_argument("--max_iters", type=int, default=2000, help="maximum optimizer steps")
    g.add_argument("--max_epochs", type=float, default=None,
                   help="stop after this many passes over the train split (default: only --max_iters)")
    g.add_argument("--eval_interval", type=int, default=100, help="evaluate on the val split every N steps")
    g.add_argument("--eval_max_batches", type=int, default=None,
                   help="cap each evaluation at N val batches (default: the whole val split)")
    g.add_argument("--patience", type=int, default=5,
                   help="stop when val loss has not improved by --min_delta for N evaluations (0 = off)")
    g.add_argument("--min_delta", type=float, default=1e-4, help="smallest val-loss improvement that counts")
    g.add_argument("--log_interval", type=int, default=10, help="log the train loss every N steps")
    add_augment_flags(p)
    g = p.add_argument_group("system")
    g.add_argument("--resume", action="store_true",
                   help="continue from out_dir/reward_last.pt (a finished run just reports)")
    g.add_argument("--num_workers", type=int, default=0, help="DataLoader worker processes")
    g.add_argument("--seed", type=int, default=1337,
                   help="random seed: head init and the per-epoch shuffle (the same for any number of processes; "
                        "dropout noise is seeded per rank)")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    add_dtype_arg(g)
    g.add_argument("--cache_frozen", choices=["auto", "on", "off"], default="auto",
                   help="cache the frozen lower blocks' features: with --unfreeze_last_n_blocks n >= 0, compute the "
                        "frozen embeddings + lower blocks once "
                        "per sample (train and val) and train the top n blocks and the head on the cached "
                        "activations (same results up to float rounding; N x n_embd float32 per sample, kept "
                        "in memory, or in a temporary file in out_dir when memory is short; under torchrun "
                        "every process caches the train split, and rank 0, which evaluates, the val split too). "
                        "auto: on when something is frozen; on: required (refused with -1)")
    add_tracking_args(p)
    return p


def add_augment_flags(p):
    g = p.add_argument_group("augmentation (ADA for tokens, lib/reward_head.py)")
    g.add_argument("--augment_p", type=float, default=0.0,
                   help="share of training tokens replaced by uniform random ones, natural and generated alike "
                        "(0 = off; with --ada_target its start); turns --cache_frozen off")
    g.add_argument("--ada_target", type=float, default=None,
                   help="adapt --augment_p every 4 steps to keep the mean sign of the head's natural-minus-synthetic "
                        "logit over natural positions at this target (ADA: 0.6; default: a fixed --augment_p)")


def reward_model_args(argv=None):
    args = reward_model_parser().parse_args(argv)
    check_flag_ranges(args, "train_reward_model.py", [
        ("learning_rate", args.learning_rate > 0, "> 0"),
        ("reward_head_hidden_dim", args.reward_head_hidden_dim >= 1, ">= 1"),
        ("unfreeze_last_n_blocks", args.unfreeze_last_n_blocks >= -1, ">= 0, or -1 for the whole trunk"),
        ("batch_size", args.batch_size >= 1, ">= 1"),
        ("max_iters", args.max_iters >= 1, ">= 1"),
        ("max_epochs", args.max_epochs is None or args.max_epochs > 0, "> 0"),
        ("augment_p", 0 <= args.augment_p <= 0.8, "in [0, 0.8]"),
        ("ada_target", args.ada_target is None or -1 < args.ada_target < 1, "in (-1, 1)"),
        ("eval_interval", args.eval_interval >= 1, ">= 1"),
        ("log_interval", args.log_interval >= 1, ">= 1")])
    if args.gen_features and not args.lm_features:
        raise ProjectError("--gen_features compares the generator's surprisal with the trunk's, which --lm_features "
                           "gives", "add --lm_features")
    # the loss actually used: per-position labels always train with cross-entropy
    args.loss_name = "position_ce" if args.per_position else args.loss
    return args
