"""
GRPO by an independent implementation, judged by run_cycles.py as an arm: TRL's GRPOTrainer fine-tunes the cycle's
generator against the cycle's detector, whose reward is lib/detector_reward.DetectorReward (P(natural), or the
log-ratio, exactly as train_grpo.py scores a rollout). Beside train_grpo.py's arm it checks the project's GRPO.

The generator is exported to a Hugging Face GPT-2 directory by export_hf.py (run as a command: a script imports no
script), which also writes a tokenizer transformers loads (GPT-2 BPE, or one token per character for a char
corpus). The prompts are windows of --prompt_len tokens of the corpus's train split, decoded to text; each gets
--num_generations completions of --max_completion_length tokens (default: the sequence length, min(--block_size,
the detector's trained length), less the prompt, as train_grpo.py fills every rollout to its seq_len). The
defaults are train_grpo.py's where TRL has the same knob: group size 8, 8 prompts per update, KL beta 0.04,
clip 0.2, temperature 1, AdamW lr 5e-5 (betas 0.9, 0.95, no weight decay, constant), gradient norm clipped to 1,
the loss a mean over every completion token of the batch (TRL's 'dapo': train_grpo.py's masked token mean), one
update per batch. Unlike train_grpo.py the prompt length is fixed (train_grpo.py draws it in [1, seq_len/2] each
step) and there is no early stopping. A char vocabulary has no end-of-text token: the tokenizer gets a pad / EOS
token one past the model's vocabulary, which the model cannot sample, so every completion runs its full length;
at BPE, <|endoftext|> is held off until the completion's last token (min_new_tokens).

It writes a Hugging Face directory in out_dir (model.safetensors, config.json and export_hf.py's tokenizer files),
flops.json (6 N per trained token, 2 N per sampled token, 2 N for the reference's forward, 2 N_detector per scored
token), and rewards.jsonl: each update's prompts, completions and the rewards TRL received, plus TRL's own logged
reward mean (tests/test_trl_grpo.py rescores them) and the update's wall time (bench/bench_trl_step.py).

    python run_cycles.py --preset quick --arm trl='python examples/trl_grpo.py --init {generator}
        --detector {detector} --data_dir {data_dir} --out_dir {out_dir} --seed {seed} --max_updates {updates}
        --block_size {block_size} --device {device}'
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repository, from anywhere
from core.errors import ProjectError  # noqa: E402
from lib.checkpoint import load_model  # noqa: E402
from lib.corpus import Corpus  # noqa: E402
from lib.detector_reward import REWARDS, DetectorReward  # noqa: E402
from lib.rl_settings import GRPO_BETA, GRPO_LEARNING_RATE  # noqa: E402

# export_hf.py's files that are not the weights or config.json: copied into out_dir unchanged
TOKENIZER_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "meta.pkl")
NO_TOKEN = "<|trl_pad|>"  # a char vocabulary's pad / EOS for TRL: one past the model's vocabulary, never sampled
LOG_FILE = "rewards.jsonl"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="TRL's GRPOTrainer on a generator with a detector's reward, for "
                                 "run_cycles --arm", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--init", required=True, help="the generator to start from (run_cycles: {generator})")
    ap.add_argument("--detector", required=True, help="the detector checkpoint, the reward (run_cycles: {detector})")
    ap.add_argument("--data_dir", required=True, help="the prepared corpus (train.bin, meta.pkl): prompts from train")
    ap.add_argument("--out_dir", required=True, help="where the Hugging Face directory, flops.json and "
                                                     f"{LOG_FILE} go")
    ap.add_argument("--seed", type=int, default=1337, help="TRL's seed and the prompts' (train_grpo.py's default)")
    ap.add_argument("--max_updates", type=int, required=True, help="optimizer updates (one batch of rollouts each)")
    ap.add_argument("--block_size", type=int, default=None,
                    help="the sequence length (prompt + completion) at most; default the generator's context")
    ap.add_argument("--prompts_per_step", type=int, default=8, help="prompts per update (train_grpo.py's default)")
    ap.add_argument("--num_generations", type=int, default=8, help="completions per prompt, the group size G")
    ap.add_argument("--prompt_len", type=int, default=None,
                    help="prompt tokens (default a quarter of the sequence length, train_grpo.py's mean)")
    ap.add_argument("--max_completion_length", type=int, default=None,
                    help="completion tokens (default the sequence length less --prompt_len)")
    ap.add_argument("--learning_rate", type=float, default=GRPO_LEARNING_RATE, help="AdamW's learning rate, constant")
    ap.add_argument("--beta", type=float, default=GRPO_BETA, help="KL coefficient (k3 penalty in the loss)")
    ap.add_argument("--epsilon", type=float, default=0.2, help="clipping epsilon of the importance ratio")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    ap.add_argument("--reward", choices=REWARDS, default="p_natural", help="DetectorReward's reward")
    ap.add_argument("--device", default="cpu", help="cpu or cuda ('auto': cuda where there is one)")
    return ap.parse_args(argv)


def export_generator(init, out_dir):
    """export_hf.py's Hugging Face directory of the generator (checked against the project's logits)."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "export_hf.py"), "--ckpt", init, "--out_dir", out_dir],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise ProjectError(f"export_hf.py could not export {init}:\n{r.stdout}{r.stderr}",
                           "pass a generator checkpoint export_hf.py accepts")


def make_prompts(corpus, tok, n, plen, seed):
    """n windows of plen tokens of the train split, as text."""
    train = corpus.train
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(train) - plen + 1, size=n)
    return [tok.decode(train[s:s + plen].astype(np.int64).tolist()) for s in starts]


def step_timer():
    """A TrainerCallback that times each optimizer update (TRL generates, scores and updates inside one), and
    the list of seconds it fills (bench/bench_trl_step.py reads them from rewards.jsonl)."""
    import time

    from transformers import TrainerCallback
    seconds = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            seconds.append(time.perf_counter() - self.t0)
    return StepTimer(), seconds


class LoggedReward:
    """DetectorReward as TRL calls it, each call's prompts, completions and rewards appended to a JSONL file."""

    def __init__(self, reward, path):
        self.reward, self.path, self.calls = reward, path, 0
        self.__name__ = reward.__name__  # TRL's column name: rewards/detector_p_natural/mean

    def __call__(self, prompts=None, completions=None, **kwargs):
        rewards = self.reward(prompts=prompts, completions=completions)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"call": self.calls, "prompts": prompts, "completions": completions,
                                "rewards": rewards}) + "\n")
        self.calls += 1
        return rewards


def main(argv=None):
    args = parse_args(argv)
    try:
        from datasets import Dataset
        from transformers import AutoTokenizer, GPT2LMHeadModel
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as e:
        raise ProjectError(f"examples/trl_grpo.py needs TRL ({e})", "pip install trl (see requirements.txt)") from None
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    gen, _, _ = load_model(args.init, require_mode="generator")
    reward = DetectorReward(args.detector, args.reward, device=device)
    n_gen = sum(p.numel() for p in gen.parameters())
    n_det = sum(p.numel() for p in reward.model.parameters())
    seq_len = min(args.block_size or gen.config.block_size, gen.config.block_size, reward.sequence_length)
    plen = args.prompt_len or max(1, seq_len // 4)
    comp_len = args.max_completion_length or seq_len - plen
    if plen < 1 or comp_len < 1 or plen + comp_len > gen.config.block_size:
        raise ProjectError(f"prompt {plen} + completion {comp_len} tokens must fit the generator's context "
                           f"({gen.config.block_size}), each at least 1", "choose a shorter --prompt_len")
    corpus = Corpus(args.data_dir)
    os.makedirs(args.out_dir, exist_ok=True)
    log_path = os.path.join(args.out_dir, LOG_FILE)
    if os.path.exists(log_path):
        os.remove(log_path)
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = os.path.join(tmp, "init")
        export_generator(args.init, hf_dir)
        tokenizer = AutoTokenizer.from_pretrained(hf_dir)
        model = GPT2LMHeadModel.from_pretrained(hf_dir)
        exported = {k: getattr(model.config, k, None) for k in ("pad_token_id", "eos_token_id", "bos_token_id")}
        bpe = tokenizer.eos_token is not None
        gen_kwargs = {}
        if bpe:
            tokenizer.pad_token = tokenizer.eos_token
            gen_kwargs["min_new_tokens"] = comp_len  # train_grpo.py's rollouts have no end-of-text
        else:
            tokenizer.add_special_tokens({"pad_token": NO_TOKEN, "eos_token": NO_TOKEN})
            model.generation_config.eos_token_id = None
        n_rows = args.prompts_per_step * args.num_generations
        prompts = make_prompts(corpus, corpus.tokenizer, args.max_updates * args.prompts_per_step, plen, args.seed)
        config = GRPOConfig(
            output_dir=os.path.join(tmp, "trl"), seed=args.seed, max_steps=args.max_updates,
            per_device_train_batch_size=n_rows, gradient_accumulation_steps=1, num_generations=args.num_generations,
            max_completion_length=comp_len, temperature=args.temperature, top_k=0, top_p=1.0,
            generation_kwargs=gen_kwargs or None,
            learning_rate=args.learning_rate, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
            adam_beta1=0.9, adam_beta2=0.95, max_grad_norm=1.0, beta=args.beta, epsilon=args.epsilon,
            num_iterations=1, loss_type="dapo", scale_rewards="group", disable_dropout=True,
            logging_steps=1, save_strategy="no", report_to="none", use_cpu=(device == "cpu"),
            bf16=False, fp16=False, shuffle_dataset=False, dataloader_num_workers=0)
        logged = LoggedReward(reward, log_path)
        timer, step_s = step_timer()
        trainer = GRPOTrainer(model=model, reward_funcs=[logged], args=config, processing_class=tokenizer,
                              train_dataset=Dataset.from_dict({"prompt": prompts}), callbacks=[timer])
        trainer.train()
        trained = trainer.model
        for name, value in exported.items():  # the export's token ids, not those TRL aligned to its tokenizer
            setattr(trained.config, name, value)
        trained.save_pretrained(args.out_dir, safe_serialization=True)
        for name in TOKENIZER_FILES:
            if os.path.exists(os.path.join(hf_dir, name)):
                shutil.copyfile(os.path.join(hf_dir, name), os.path.join(args.out_dir, name))
    key = f"rewards/{logged.__name__}/mean"
    means = [h[key] for h in trainer.state.log_history if key in h]
    records = [json.loads(line) for line in open(log_path, encoding="utf-8")]
    with open(log_path, "w", encoding="utf-8") as f:
        for i, r in enumerate(records):
            f.write(json.dumps({**r, "trl_reward_mean": means[i] if i < len(means) else None,
                                "step_s": step_s[i] if i < len(step_s) else None}) + "\n")
    tokens = args.max_updates * n_rows * (plen + comp_len)
    flops = tokens * (8.0 * n_gen + (2.0 * n_gen if args.beta else 0.0) + 2.0 * n_det)
    with open(os.path.join(args.out_dir, "flops.json"), "w") as f:
        json.dump({"flops": flops}, f)
    print(f"TRL GRPO: {args.max_updates} updates of {n_rows} rollouts ({plen} prompt + {comp_len} completion "
          f"tokens); reward means {', '.join(f'{m:.4f}' for m in means)}; wrote {args.out_dir}")


if __name__ == "__main__":
    main()
