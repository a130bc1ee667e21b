"""
train_grpo.py's and train_spin.py's settings, defined once: each script's parser (its flags and their one default)
and its checks after parsing, read by the scripts and by run_cycles (experiment/cli.py); GRPO's learning rate
and β, which the presets and TRL's arm read too. train.py's and the reward model's: lib/settings.py.
"""
import argparse
import math

from core.cli import EPILOG, OneLineHelp, check_flag_ranges
from core.devices import add_dtype_arg
from core.errors import ProjectError
from core.tracking import add_tracking_args
from lib.finetune import add_optimizer_args

# ---------------------------------------------------------------- train_grpo.py

GRPO_LEARNING_RATE = 5e-5  # (presets and TRL's arm read these two) AdamW's, constant: the CPU presets' step
GRPO_BETA = 0.04  # the KL leash's coefficient, DeepSeekMath's


def add_grpo_objective_flags(p):
    """train_grpo.py's flags of the objective: the reward, the KL, the advantages, ptx, the floor."""
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
                   help="the KL in the reward, not in the loss: put the KL to the reference (the generator "
                        "--model_path, which made the detector's "
                        "negatives) into the sequence reward, r - beta * sum_t (log pi - log pi_ref) over the "
                        "completion tokens, instead of the k3 penalty in the loss (which is then off)")
    g.add_argument("--advantage", choices=["std", "mean"], default="std",
                   help="std: divided by the group's std, GRPO's (r - group mean) / group std; mean: r - group mean "
                        "only "
                        "(Dr. GRPO, TRL's scale_rewards=False), so the reward's scale, and beta, keep their "
                        "meaning")
    g.add_argument("--ptx_coef", type=float, default=0.0,
                   help="weight of MLE on natural text beside the adversarial loss (PPO-ptx, Ouyang et al. 2022): "
                        "add this times the mean NLL of "
                        "--ptx_rows natural train windows per step (at T = 1) to every update's loss, so the "
                        "detector's term rides on ordinary training (0: off)")
    g.add_argument("--ptx_rows", type=int, default=None,
                   help="natural windows of seq_len tokens per step for --ptx_coef (default: --prompts_per_step)")
    g.add_argument("--entropy_floor", type=float, default=0.0,
                   help="coefficient of a penalty on the policy's per-token entropy falling below "
                        "the reference's "
                        "on the completion tokens (objectives.entropy_floor_penalty): fooling the detector then has to "
                        "change WHICH text is likely, not how peaked the distribution is (0: off)")
    g.add_argument("--reward_level", choices=["sequence", "token"], default="sequence",
                   help="sequence: every completion token gets its sequence's advantage (P(natural) of the "
                        "whole sequence); token: needs a per-position reward model (train_reward_model.py "
                        "--per_position) and credits each completion token with the mean P(natural) of its "
                        "own and all later positions (with --reward logit: the summed log-ratio of its own and "
                        "all later tokens), group-relative per position")
    g.add_argument("--shuffle_rewards", action="store_true",
                   help="permute the rewards within each group (the null arm): seeded per step, before the "
                        "advantages, so the run keeps GRPO's noise, step sizes and KL leash but no signal "
                        "from the detector")
    g.add_argument("--num_updates_per_batch", type=int, default=1,
                   help="optimizer steps (passes) per sampled batch; >1 reuses the batch with clipped importance "
                        "ratios")


def add_grpo_loop_flags(p):
    """train_grpo.py's flags of stopping, evaluation and logging."""
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
                   help="evaluate every this many steps: val loss/perplexity and decoded samples")
    g.add_argument("--eval_batch_size", type=int, default=32, help="batch size of the val-loss evaluation")
    g.add_argument("--eval_max_batches", type=int, default=None,
                   help="cap the val-loss evaluation at this many batches (default: whole val split)")
    g.add_argument("--eval_reward_samples", type=int, default=128,
                   help="eval prompts for the detector's score: at each eval, the frozen reward model's mean "
                        "P(natural) on this many completions of "
                        "fixed val prompts with fixed sampling noise (0 = off): unlike the per-step training "
                        "reward, whose prompt length changes every step, this is comparable across the run")
    g.add_argument("--num_show", type=int, default=3, help="decoded samples printed and logged at each eval")
    g.add_argument("--save_interval", type=int, default=25, help="write out_dir/ckpt.pt every this many steps")
    g.add_argument("--no_save", action="store_true",
                   help="write no ckpt.pt, periodic or final (a benchmark of the steps alone, "
                        "bench/bench_grpo_step.py: "
                        "metrics.jsonl and grpo_summary.json are written, nothing is left to --resume)")
    g.add_argument("--no_degeneracy_guard", action="store_true",
                   help="let a degenerate completion (objectives.degenerate_mask: one token over half of it, or "
                        "under 30 %% "
                        "distinct 4-grams) keep its reward; "
                        "by default it gets the lowest reward of its group (objectives.guard_degenerate): repetition, "
                        "which a detector can score as natural, never pays")


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
                   help="the LM whose log-ratio to the reference is --reward trunk_ratio's reward (kept frozen): a "
                        "generator checkpoint of the same tokenizer, e.g. run_cycles' detector trunk")
    g.add_argument("--out_dir", default="out-grpo",
                   help="output directory: ckpt.pt, metrics.jsonl, grpo_curves.png, grpo_summary.json")
    g.add_argument("--data_dir", default=None,
                   help="directory with the base model's train.bin/val.bin (default: the data "
                        "record stored in --model_path); the step prompts come from train.bin only, the generator's "
                        "own train "
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
    add_grpo_objective_flags(p)
    add_optimizer_args(p, GRPO_LEARNING_RATE)
    add_grpo_loop_flags(p)
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
        ("kl_cap", args.kl_cap >= 0, ">= 0 (0 = off)"),
        ("reward_threshold", not math.isnan(args.reward_threshold or 0), "a number"),
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
               "generate about as many completion tokens per update (SPIN and DDO also read as many natural "
               "ones). " + EPILOG)
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
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the reference's "
                                                                  "continuations")
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
                   help="evaluate every this many steps (and at the start and end): val loss/perplexity and the "
                        "objective's loss, margin and accuracy on fixed val pairs (against the starting model)")
    g.add_argument("--eval_batch_size", type=int, default=32, help="batch size of the val-loss evaluation")
    g.add_argument("--eval_max_batches", type=int, default=None,
                   help="cap the val-loss evaluation at this many batches (default: whole val split)")
    g.add_argument("--eval_pairs", type=int, default=64,
                   help="val pairs for the eval margin: fixed val prompts (a quarter of seq_len) whose natural "
                        "continuation and the starting model's sample (fixed noise) give an eval margin comparable "
                        "across the run (0 = off)")
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
