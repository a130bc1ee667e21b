"""
The step scripts' settings, defined once: each script's parser (its flags and their one default; train.py's under
nanoGPT config files) and its checks after parsing, read by the scripts and by run_cycles (experiment/extra_args.py).
"""
import argparse
import math

from configurator import DatasetAction, add_config_arguments, add_unevaluated_default, parse_args_with_config
from core.cli import EPILOG, OneLineHelp, check_flag_ranges, str2bool
from core.devices import add_dtype_arg
from core.errors import ProjectError
from core.tracking import add_tracking_args
from lib.finetune import add_optimizer_args


# ---------------------------------------------------------------- train.py

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
    # I/O
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
      help="early stopping: evaluations without a val-loss improvement of at least min_delta before stopping (0 = off)")
    a("--min_delta", type=float, default=0.001, help="early stopping: smallest val-loss decrease that counts as an improvement")
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
    a("--lr_decay_iters", type=int, default=600000, help="step at which the cosine decay reaches min_lr (about max_iters)")
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
                   help="with --lm_features: the head also reads the generator's (--model_path's) own surprisal of "
                        "every token and the trunk's log-ratio to it, log p_trunk - log p_gen (a frozen copy of the "
                        "generator rides in the detector): the statistic of the ideal detector on this trunk, which "
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
    g.add_argument("--optimizer", choices=["adamw", "adam"], default="adamw", help="optimizer")
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
                   help="cache the frozen lower blocks' features: with --unfreeze_last_n_blocks n >= 0, compute the frozen embeddings + lower blocks once "
                        "per sample (train and val) and train the top n blocks and the head on the cached "
                        "activations (same results up to float rounding; N x n_embd float32 per sample, kept "
                        "in memory, or in a temporary file in out_dir when memory is short; under torchrun "
                        "every process caches the train split, and rank 0, which evaluates, the val split too). "
                        "auto: on when something is frozen; on: required (refused with -1)")
    add_tracking_args(p)
    return p


def reward_model_args(argv=None):
    args = reward_model_parser().parse_args(argv)
    check_flag_ranges(args, "train_reward_model.py", [
        ("learning_rate", args.learning_rate > 0, "> 0"),
        ("reward_head_hidden_dim", args.reward_head_hidden_dim >= 1, ">= 1"),
        ("unfreeze_last_n_blocks", args.unfreeze_last_n_blocks >= -1, ">= 0, or -1 for the whole trunk"),
        ("batch_size", args.batch_size >= 1, ">= 1"),
        ("max_iters", args.max_iters >= 1, ">= 1"),
        ("max_epochs", args.max_epochs is None or args.max_epochs > 0, "> 0"),
        ("eval_interval", args.eval_interval >= 1, ">= 1"),
        ("log_interval", args.log_interval >= 1, ">= 1")])
    if args.gen_features and not args.lm_features:
        raise ProjectError("--gen_features compares the generator's surprisal with the trunk's, which --lm_features "
                           "gives", "add --lm_features")
    # the loss actually used: per-position labels always train with cross-entropy
    args.loss_name = "position_ce" if args.per_position else args.loss
    return args


# ---------------------------------------------------------------- train_grpo.py

GRPO_LEARNING_RATE = 5e-5  # (presets and TRL's arm read these two) AdamW's, constant: the CPU presets' step
GRPO_BETA = 0.04  # the KL leash's coefficient, DeepSeekMath's

def grpo_parser(parser_class=argparse.ArgumentParser):
    p = parser_class(prog="train_grpo.py", formatter_class=OneLineHelp, epilog=EPILOG,
                     description="GRPO fine-tuning of a generator checkpoint with a "
                                "reward model's P(natural), or its log-ratio, as the reward.")
    g = p.add_argument_group("models and data")
    g.add_argument("--model_path", required=True,
                   help="generator checkpoint to fine-tune (also the frozen KL reference); a local "
                        "Hugging Face GPT-2 directory works too")
    g.add_argument("--reward_model_path", default=None,
                   help="reward checkpoint written by train_reward_model.py (kept frozen), or its "
                        "export_hf.py directory (required unless --reward trunk_ratio)")
    g.add_argument("--trunk_path", default=None,
                   help="--reward trunk_ratio's LM (kept frozen): a generator checkpoint of the same tokenizer, e.g. "
                        "run_cycles' detector trunk, whose log-ratio to the reference is the reward")
    g.add_argument("--out_dir", default="out-grpo",
                   help="output directory: ckpt.pt, metrics.jsonl, grpo_curves.png, grpo_summary.json")
    g.add_argument("--data_dir", default=None,
                   help="directory with the base model's train.bin/val.bin (default: the data "
                        "record stored in --model_path); the step prompts come from train.bin only, the generator's own train "
                        "split, because val.bin is the held-out text every arm's perplexity is measured on")
    g.add_argument("--seq_len", type=int, default=None,
                   help="total length of every sequence (prompt + completion); default: the "
                        "length the reward model was trained on (its reward data's blocks, else its block_size), "
                        "at most the policy's block_size")
    g = p.add_argument_group("sampling")
    g.add_argument("--prompts_per_step", type=int, default=8,
                   help="prompts per step, in total: under torchrun each of N processes takes "
                        "prompts_per_step / N (must divide), so the run is the same for any N")
    g.add_argument("--group_size", type=int, default=8, help="completions sampled per prompt (G)")
    g.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature of the rollouts; the policy's, the sampling policy's and the "
                        "reference's log-probs (ratio and KL) are all taken at it too, softmax(logits / T), so "
                        "the policy gradient and the KL are those of the distribution actually sampled")
    g = p.add_argument_group("GRPO objective")
    g.add_argument("--clip_eps", type=float, default=0.2, help="PPO clipping epsilon of the importance ratio")
    g.add_argument("--beta", type=float, default=GRPO_BETA,
                   help="KL coefficient: of the k3 KL penalty in the loss (default), or with --kl_in_reward of the "
                        "summed log-ratio to the reference inside the sequence reward (optimum pi_ref * exp(r / "
                        "beta); with --reward logit, beta = 1 aims at the data distribution itself)")
    g.add_argument("--reward", choices=["p_natural", "logit", "trunk_ratio"], default="p_natural",
                   help="p_natural: the detector's P(natural) of the sequence (mean over positions), in [0, 1]; "
                        "logit: its log-ratio log p_data / p_generator of the completion, the sum over completion "
                        "positions of the per-token log-ratios the per-position logits give exactly for a "
                        "Bayes-optimal detector under the crossover labels (objectives.log_ratio_increments; needs a "
                        "per-position reward model); trunk_ratio: the ideal detector, --trunk_path's log-ratio to "
                        "the reference, sum_t log p_trunk(x_t) / p_ref(x_t) (objectives.trunk_ratio_rewards; no reward "
                        "model: with --kl_in_reward --beta 1 GRPO distils the trunk)")
    g.add_argument("--kl_in_reward", action="store_true",
                   help="the KL in the reward, not in the loss: put the KL to the reference (the generator --model_path, which made the detector's "
                        "negatives) into the sequence reward, r - beta * sum_t (log pi - log pi_ref) over the "
                        "completion tokens, instead of the k3 penalty in the loss (which is then off)")
    g.add_argument("--advantage", choices=["std", "mean"], default="std",
                   help="std: divided by the group's std, GRPO's (r - group mean) / group std; mean: r - group mean only "
                        "(Dr. GRPO, TRL's scale_rewards=False), so the reward's scale, and beta, keep their "
                        "meaning")
    g.add_argument("--ptx_coef", type=float, default=0.0,
                   help="adversarial plus MLE (PPO-ptx, Ouyang et al. 2022): add this times the mean NLL of "
                        "--ptx_rows natural train windows per step (at T = 1) to every update's loss, so the "
                        "detector's term rides on ordinary training (0: off)")
    g.add_argument("--ptx_rows", type=int, default=None,
                   help="natural windows of seq_len tokens per step for --ptx_coef (default: --prompts_per_step)")
    g.add_argument("--entropy_floor", type=float, default=0.0,
                   help="entropy floor: the coefficient of a penalty on the policy's per-token entropy falling below the reference's "
                        "on the completion tokens (objectives.entropy_floor_penalty): fooling the detector then has to "
                        "change WHICH text is likely, not how peaked the distribution is (0: off)")
    g.add_argument("--reward_level", choices=["sequence", "token"], default="sequence",
                   help="sequence: every completion token gets its sequence's advantage (P(natural) of the "
                        "whole sequence); token: needs a per-position reward model (train_reward_model.py "
                        "--per_position) and credits each completion token with the mean P(natural) of its "
                        "own and all later positions (with --reward logit: the summed log-ratio of its own and "
                        "all later tokens), group-relative per position")
    g.add_argument("--adv_eps", type=float, default=1e-4, help="added to the group std before dividing")
    g.add_argument("--shuffle_rewards", action="store_true",
                   help="the null arm: permute the rewards within each group (seeded per step) before the "
                        "advantages, so the run keeps GRPO's noise, step sizes and KL leash but no signal "
                        "from the detector")
    g.add_argument("--num_updates_per_batch", type=int, default=1,
                   help="optimizer steps (passes) per sampled batch; >1 reuses the batch with clipped importance "
                        "ratios")
    add_optimizer_args(p, GRPO_LEARNING_RATE)
    g = p.add_argument_group("stopping, evaluation, logging")
    g.add_argument("--max_steps", type=int, default=200, help="maximum number of GRPO steps")
    g.add_argument("--reward_window", type=int, default=10,
                   help="steps in the windowed mean completion reward (the reward of the generated positions): "
                        "the stop rules', the progress bar's 'completion reward (last N steps)' and the closing "
                        "line's")
    g.add_argument("--reward_threshold", type=float, default=None,
                   help="stop when the windowed mean completion reward (the generated positions only) reaches "
                        "this (0 = off; default: 0.9 with --reward p_natural, off with --reward logit, whose "
                        "scale is nats)")
    g.add_argument("--patience", type=int, default=30,
                   help="stop after this many steps without a --min_delta gain of the windowed completion reward "
                        "(0 = off)")
    g.add_argument("--min_delta", type=float, default=0.002, help="smallest improvement that resets --patience")
    g.add_argument("--kl_cap", type=float, default=0.5,
                   help="stop when the mean per-token KL to the reference exceeds this (0 = off)")
    g.add_argument("--eval_interval", type=int, default=25,
                   help="every this many steps: val loss/perplexity and decoded samples")
    g.add_argument("--eval_batch_size", type=int, default=32, help="batch size of the val-loss evaluation")
    g.add_argument("--eval_max_batches", type=int, default=None,
                   help="cap the val-loss evaluation at this many batches (default: whole val split)")
    g.add_argument("--eval_reward_samples", type=int, default=128,
                   help="eval prompts for the detector's score: at each eval, the frozen reward model's mean P(natural) on this many completions of "
                        "fixed val prompts with fixed sampling noise (0 = off): unlike the per-step training "
                        "reward, whose prompt length changes every step, this is comparable across the run")
    g.add_argument("--num_show", type=int, default=3, help="decoded samples printed and logged at each eval")
    g.add_argument("--save_interval", type=int, default=25, help="write out_dir/ckpt.pt every this many steps")
    g.add_argument("--no_save", action="store_true",
                   help="write no ckpt.pt, periodic or final (a benchmark of the steps alone, bench/bench_grpo_step.py: "
                        "metrics.jsonl and grpo_summary.json are written, nothing is left to --resume)")
    g.add_argument("--degenerate_share", type=float, default=0.5,
                   help="degenerate: a completion whose most frequent token has more than this share")
    g.add_argument("--degenerate_min_distinct", type=float, default=0.3,
                   help="degenerate: a completion with fewer distinct 4-grams than this fraction")
    g.add_argument("--no_degeneracy_guard", action="store_true",
                   help="let a degenerate completion (--degenerate_share, --degenerate_min_distinct) keep its reward; "
                        "by default it gets the lowest reward of its group (objectives.guard_degenerate): repetition, "
                        "which a detector can score as natural, never pays")
    g = p.add_argument_group("system")
    g.add_argument("--resume", action="store_true",
                   help="continue from out_dir/ckpt.pt (a finished run just reports and exits)")
    g.add_argument("--seed", type=int, default=1337,
                   help="random seed; each step's prompts and sampling noise are drawn for all ranks at once "
                        "and each rank takes its own slice (the same run for any number of processes); "
                        "dropout noise is seeded per rank (seed + rank)")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    add_dtype_arg(g)
    g.add_argument("--dropout", type=float, default=0.0,
                   help="dropout of the policy (0 keeps sampling and training distributions equal)")
    add_tracking_args(p)
    return p


def grpo_args(argv=None):
    args = grpo_parser().parse_args(argv)
    check_flag_ranges(args, "train_grpo.py", [
        ("learning_rate", args.learning_rate > 0, "> 0"),
        ("prompts_per_step", args.prompts_per_step >= 1, ">= 1"),
        ("group_size", args.group_size >= 2, ">= 2 (advantages compare completions of a prompt)"),
        ("temperature", args.temperature > 0, "> 0"),
        ("clip_eps", 0 < args.clip_eps < 1, "in (0, 1)"),
        ("beta", args.beta >= 0, ">= 0"),
        ("entropy_floor", args.entropy_floor >= 0, ">= 0"),
        ("ptx_coef", args.ptx_coef >= 0, ">= 0"),
        ("ptx_rows", args.ptx_rows is None or args.ptx_rows >= 1, ">= 1"),
        ("num_updates_per_batch", args.num_updates_per_batch >= 1, ">= 1"),
        ("max_steps", args.max_steps >= 0, ">= 0"),
        ("reward_window", args.reward_window >= 1, ">= 1"),
        ("eval_interval", args.eval_interval >= 1, ">= 1"),
        ("save_interval", args.save_interval >= 1, ">= 1"),
        ("eval_reward_samples", args.eval_reward_samples >= 0, ">= 0"),
        ("micro_batch_size", args.micro_batch_size >= 0, ">= 0"),
        ("adv_eps", args.adv_eps > 0, "> 0"),
        ("kl_cap", args.kl_cap >= 0, ">= 0 (0 = off)"),
        ("reward_threshold", not math.isnan(args.reward_threshold or 0), "a number"),
        ("degenerate_share", 0 < args.degenerate_share <= 1, "in (0, 1]"),
        ("degenerate_min_distinct", 0 <= args.degenerate_min_distinct <= 1, "in [0, 1]"),
        ("num_show", args.num_show >= 0, ">= 0")])
    if args.reward_threshold is None:
        args.reward_threshold = 0.9 if args.reward == "p_natural" else 0.0  # off for the log-ratios (nats)
    ratio = args.reward == "trunk_ratio"
    if ratio != (args.trunk_path is not None) or ratio == (args.reward_model_path is not None):
        raise ProjectError("--reward trunk_ratio takes --trunk_path (and no reward model); every other --reward "
                           "takes --reward_model_path", "give --reward_model_path PATH, or --reward trunk_ratio "
                           "--trunk_path PATH")
    if ratio:
        args.eval_reward_samples = 0  # no detector to score the fixed prompts' completions
    return args


# ---------------------------------------------------------------- train_spin.py (SPIN and DDO)

OBJECTIVES = ("spin", "ddo")



def spin_parser(parser_class=argparse.ArgumentParser):
    p = parser_class(
        prog="train_spin.py", formatter_class=OneLineHelp,
        description="Self-play fine-tuning of a generator checkpoint against its own samples: SPIN (DPO with the "
                    "natural continuation of a train prompt as chosen and the reference's own sample as rejected) "
                    "or DDO (the model's log-likelihood ratio to the reference as a GAN discriminator's logit: "
                    "natural continuations real, the reference's samples fake), in self-play rounds.",
        epilog="Budget matching with a GRPO run (run_cycles): --max_steps = GRPO's updates and "
               "--prompts_per_step = GRPO's prompts_per_step x group_size at the same --seq_len, so both "
               "generate about as many completion tokens per update (SPIN and DDO also read as many natural ones). " + EPILOG)
    g = p.add_argument_group("model and data")
    g.add_argument("--model_path", required=True,
                   help="generator checkpoint to fine-tune; also the first round's frozen reference, which samples "
                        "the continuations opposed to the natural ones; a local Hugging Face GPT-2 directory works "
                        "too")
    g.add_argument("--out_dir", default=None,
                   help="output directory for ckpt.pt, metrics.jsonl and the summary (default: out-spin, out-ddo)")
    g.add_argument("--data_dir", default=None,
                   help="directory with the base model's train.bin/val.bin (default: the data record stored "
                        "in --model_path); prompts and natural continuations come from train.bin only")
    g.add_argument("--seq_len", type=int, default=None,
                   help="total length of every sequence (prompt + continuation); each step draws one prompt "
                        "length in [1, seq_len/2]; default: the model's block_size")
    g = p.add_argument_group("sampling and objective")
    g.add_argument("--objective", choices=OBJECTIVES, default="spin",
                   help="spin: DPO, natural continuation chosen, the reference's sample rejected "
                        "(objectives.spin_loss); ddo: Direct Discriminative Optimization, the policy's own "
                        "log-likelihood ratio to the reference as a GAN discriminator's logit (objectives.ddo_loss)")
    g.add_argument("--rounds", type=int, default=1,
                   help="self-play rounds: --max_steps split into this many rounds of consecutive steps; each "
                        "round's reference is the policy at its start (the first round's: --model_path), which "
                        "samples all the round's continuations and scores them once, when the round starts")
    g.add_argument("--prompts_per_step", type=int, default=64,
                   help="prompts (natural/sampled pairs) per step; to match a GRPO run's generated tokens use "
                        "its prompts_per_step x group_size")
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the reference's continuations")
    g.add_argument("--top_k", type=int, default=None,
                   help="top-k sampling of the reference's continuations (default: all)")
    g.add_argument("--beta", type=float, default=0.1,
                   help="SPIN's DPO beta: the scale of the implicit reward beta * log(pi / pi_ref)")
    g.add_argument("--ddo_alpha", type=float, default=1.0,
                   help="DDO's weight of the sample term (the reference's samples called fake) against the data "
                        "term (natural continuations called real); 1 is the paper's objective, whose optimum is "
                        "the data distribution (its VAR runs searched 10..100)")
    g.add_argument("--ddo_beta", type=float, default=1.0,
                   help="DDO's logit scale: ddo_beta * (log p_theta - log p_ref) summed over "
                        "the continuation; 1 is the paper's objective (optimum: the data distribution); below 1 it "
                        "aims past the data, p_ref^(1-1/beta) p_data^(1/beta), and its sigmoid saturates later "
                        "(the paper's VAR runs: 0.02)")
    g.add_argument("--nll_coef", type=float, default=0.0,
                   help="the likelihood anchor: add this times the mean per-token NLL of the natural "
                        "continuations to the loss (0 = plain SPIN or DDO; DPO alone can push the chosen text's "
                        "likelihood down too, as long as the rejected one falls faster)")
    add_optimizer_args(p, 3e-5, "AdamW learning rate (constant)",
                       "pairs per forward/backward chunk (gradient accumulation, same update); 0 = all pairs")
    g = p.add_argument_group("steps, evaluation, logging")
    g.add_argument("--max_steps", type=int, default=200, help="number of steps (one optimizer update each)")
    g.add_argument("--eval_interval", type=int, default=25,
                   help="every this many steps (and at the start and end): val loss/perplexity and the objective's "
                        "loss, margin and accuracy on fixed val pairs (against the starting model)")
    g.add_argument("--eval_batch_size", type=int, default=32, help="batch size of the val-loss evaluation")
    g.add_argument("--eval_max_batches", type=int, default=None,
                   help="cap the val-loss evaluation at this many batches (default: whole val split)")
    g.add_argument("--eval_pairs", type=int, default=64,
                   help="eval pairs: fixed val prompts (a quarter of seq_len) whose natural continuation and the starting "
                        "model's sample (fixed noise) give an eval margin comparable across the run (0 = off)")
    g.add_argument("--save_interval", type=int, default=25, help="write out_dir/ckpt.pt every this many steps")
    g = p.add_argument_group("system")
    g.add_argument("--resume", action="store_true",
                   help="continue from out_dir/ckpt.pt (bit-exact on the same device; a finished run just "
                        "reports, a larger --max_steps continues it, in the rounds it now splits into)")
    g.add_argument("--seed", type=int, default=1337,
                   help="random seed: step i's prompt length, windows and sampling noise come from (seed, i)")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    add_dtype_arg(g)
    add_tracking_args(p)
    return p


def spin_args(argv=None):
    args = spin_parser().parse_args(argv)
    check_flag_ranges(args, "train_spin.py", [
        ("learning_rate", args.learning_rate > 0, "> 0"),
        ("prompts_per_step", args.prompts_per_step >= 1, ">= 1"),
        ("rounds", 1 <= args.rounds <= max(1, args.max_steps), "in [1, --max_steps]"),
        ("ddo_alpha", args.ddo_alpha > 0, "> 0"),
        ("ddo_beta", args.ddo_beta > 0, "> 0"),
        ("temperature", args.temperature > 0, "> 0"),
        ("top_k", args.top_k is None or args.top_k >= 1, ">= 1"),
        ("beta", args.beta > 0, "> 0"),
        ("nll_coef", args.nll_coef >= 0, ">= 0"),
        ("max_steps", args.max_steps >= 0, ">= 0"),
        ("eval_interval", args.eval_interval >= 1, ">= 1"),
        ("save_interval", args.save_interval >= 1, ">= 1"),
        ("eval_pairs", args.eval_pairs >= 0, ">= 0"),
        ("micro_batch_size", args.micro_batch_size >= 0, ">= 0")])
    args.out_dir = args.out_dir or f"out-{args.objective}"
    return args
