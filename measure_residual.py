"""
What a detector knows beyond its generator: the val likelihood of the residual energy model
P_gen(x | c) * exp(s(c, x)) / Z(c) (Deng et al. 2020; experiment/residual.py), in nats per token gained over
the generator alone, with Z(c) from n = 1, 2, 4, ... of the generator's own continuations of c: the
estimate from the samples alone (biased high) and the one with the natural continuation counted
among them (residual.window_gains; biased low for an exact log-ratio), which bracket the gain.

    python measure_residual.py --model_path out/ckpt.pt --reward_model_path out-reward/reward_ckpt.pt

Val windows of the detector's block size N are cut at --prompt_len: the first tokens are the
natural prefix c, the rest the natural continuation x that is scored. The gain estimate is biased
high (log Z_n is biased low); the bias shows as the gain falling with n. --scales also scores
lambda * s, a family of residual models of which lambda = 1 is the log-ratio's own.

It prints one labelled row per lambda and n, and one sentence: the detector's information (the gain,
lower to upper estimate) against its trunk's advantage, how much better the model whose trunk the
detector reads (train_reward_model.py --init_trunk_from) scores the same continuations than the
generator does. The continuations are made --batch_size at a time and only their scores are kept, so
memory does not grow with --num_prefixes x --n (0.75 GiB peak RSS at the defaults on the default
preset's models, docs/benchmarks.md; each draws its own uniforms, so the result does not depend on
--batch_size).
"""
import argparse
import json
import time

import numpy as np
import torch

from core.cli import check_flag_ranges, run_cli
from core.errors import ProjectError
from core.files import atomic_write_text, check_writable_file
from core.objectives import logit_rewards
from engine import Engine
from experiment.residual import continuation_logprob, load_detector, residual_gain, window_gains
from lib.checkpoint import load_model
from lib.rl_data import prompt_corpus


def get_args(argv=None):
    p = argparse.ArgumentParser(description="The detector as a residual energy model: val nats per token it adds "
                                "to its generator (experiment/residual.py).")
    p.add_argument("--model_path", required=True, help="the generator whose samples the detector was trained against")
    p.add_argument("--reward_model_path", required=True,
                   help="a per-position detector checkpoint (train_reward_model.py --per_position)")
    p.add_argument("--data_dir", default=None,
                   help="directory with the generator's val.bin (default: the data record of --model_path)")
    p.add_argument("--num_prefixes", type=int, default=256, help="val windows scored (prefixes c)")
    p.add_argument("--prompt_len", type=int, default=None, help="natural prefix length (default: N // 4)")
    p.add_argument("--n", type=int, default=64, help="largest number of generator continuations per prefix in Z")
    p.add_argument("--scales", default="1", help="comma-separated lambdas: the energy is lambda * s")
    p.add_argument("--score", choices=["increments", "raw_sum"], default="increments",
                   help="s(c, x): increments = the summed per-token log-ratios of the continuation "
                        "(objectives.logit_rewards, train_grpo.py --reward logit); raw_sum = the plain sum of the "
                        "per-position logits over it (no inversion of the crossover labels), for comparison")
    p.add_argument("--batch_size", type=int, default=1024,
                   help="sequences generated and scored at a time (the peak memory grows with it)")
    p.add_argument("--trunk_path", default=None,
                   help="the model whose trunk the detector reads, whose advantage over the generator the closing "
                        "sentence compares with the detector's gain (default: the detector's recorded "
                        "--init_trunk_from; 'none': no comparison)")
    p.add_argument("--seed", type=int, default=0, help="seed of the val windows and of the generator's sampling")
    p.add_argument("--out", default=None, help="also write the result as JSON to this file")
    args = p.parse_args(argv)
    check_flag_ranges(args, "measure_residual.py", [("num_prefixes", args.num_prefixes >= 2, ">= 2"),
                                                    ("n", args.n >= 1, ">= 1"),
                                                    ("batch_size", args.batch_size >= 1, ">= 1")])
    if args.out is not None:
        check_writable_file(args.out, "--out")
    try:
        args.scales = [float(s) for s in args.scales.split(",")]
    except ValueError:
        raise ProjectError(f"--scales {args.scales!r} is not a comma-separated list of numbers",
                           "e.g. --scales 0.5,1,2")
    return args


@torch.no_grad()
def raw_logits(rm, seqs, batch_size):
    """log D / (1 - D) at every position, (B, T), in chunks of rows."""
    out = []
    for i in range(0, seqs.size(0), batch_size):
        lg = rm.position_logits(seqs[i:i + batch_size]).float()
        out.append(lg[..., 0] - lg[..., 1])
    return torch.cat(out)


@torch.no_grad()
def sample_logits(gen, rm, prefixes, N, args):
    """raw_logits of args.n generator continuations to N tokens of every prefix (C, P): (C * n, N), the n
    of a prefix in consecutive rows, sampled with uniforms of --seed. Made --batch_size sequences at a
    time, each row with uniforms of its own: the peak memory is one batch's, and the result the same for
    any batch size."""
    rows, batch_size, engine = prefixes.repeat_interleave(args.n, 0), args.batch_size, Engine(gen)
    U = torch.rand((rows.size(0), N), generator=torch.Generator().manual_seed(args.seed))
    return torch.cat([raw_logits(rm, engine.generate(rows[i:i + batch_size], N - prefixes.size(1),
                                                     uniforms=U[i:i + batch_size]), batch_size)
                      for i in range(0, rows.size(0), batch_size)])


def table(result):
    """The result as labelled lines: one row per lambda and n."""
    head = (f"the residual model P_gen exp(lambda s) / Z on {result['num_prefixes']} val windows, "
            f"{result['N'] - result['prompt_len']} tokens scored after {result['prompt_len']} natural ones;\n"
            f"Z from n generator continuations of each prefix; gain and NLL in nats per scored token")
    cols = ("lambda", "n", "mean log Z", "gain, upper (+- SE)", "gain, lower", "NLL generator", "NLL residual")
    widths = (6, 5, 10, 20, 11, 13, 12)
    lines = [head, "  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    for lam, by_n in result["by_scale"].items():
        for m, v in by_n.items():
            cells = (f"{float(lam):g}", m, f"{v['log_z']:.3f}", f"{v['gain']:.4f} +- {v['gain_se']:.4f}",
                     f"{v['gain_lower']:.4f}", f"{v['nll_gen']:.4f}", f"{v['nll_residual']:.4f}")
            lines.append("  ".join(c.rjust(w) for c, w in zip(cells, widths)))
    return lines


def conclusion(result):
    """One sentence: the detector's information (lower to upper estimate at the largest n, lambda = 1 if
    scored) against its trunk's advantage over the generator on the same continuations."""
    lam = "1.0" if "1.0" in result["by_scale"] else next(iter(result["by_scale"]))
    v = result["by_scale"][lam][str(result["n"])]
    scale = "" if lam == "1.0" else f" (its log-ratio scaled by lambda {float(lam):g})"
    info = (f"The detector{scale} adds {v['gain_lower']:.4f} to {v['gain']:.4f} nats per token to its generator "
            f"(lower and upper estimates, n = {result['n']})")
    trunk = result.get("trunk")
    if trunk is None:
        return info + "; no trunk of another model to compare it with (see --trunk_path)."
    adv = trunk["advantage"]
    if adv <= 0:
        return (info + f"; its trunk ({trunk['path']}) is no better than the generator on these continuations "
                f"({adv:+.4f} nats per token).")
    return (info + f", while its trunk ({trunk['path']}) scores the same continuations {adv:.4f} nats per token "
            f"better than the generator: the detector passes on at most {100 * max(v['gain'], 0) / adv:.2g} % of "
            f"what its trunk knows.")


def main(argv=None):
    args = get_args(argv)
    torch.manual_seed(args.seed)
    gen, ckpt, _ = load_model(args.model_path, require_mode="generator")
    gen.eval()
    rm, N, trunk_path = load_detector(args.reward_model_path, trunk=True)
    trunk_path = None if args.trunk_path == "none" else args.trunk_path or trunk_path
    plen = N // 4 if args.prompt_len is None else args.prompt_len
    if not 1 <= plen < N - 1:
        raise ProjectError(f"--prompt_len {plen} must be in [1, {N - 2}] (N = {N}, the detector's block size)",
                           "choose a shorter prefix")
    val = prompt_corpus(ckpt.get("data"), args.data_dir, splits=("val",)).val
    starts = np.random.default_rng([args.seed, 1]).integers(0, len(val) - N, size=args.num_prefixes)
    natural = torch.from_numpy(np.stack([val[s:s + N].astype(np.int64) for s in starts]))
    t0 = time.time()
    data_a = raw_logits(rm, natural, args.batch_size)
    sample_a = sample_logits(gen, rm, natural[:, :plen], N, args)
    gen_logp = continuation_logprob(gen, natural, plen)
    score = (lambda a: logit_rewards(a, plen, N)) if args.score == "increments" else (lambda a: a[:, plen:].sum(1))
    s_data, s_samples = score(data_a), score(sample_a).view(-1, args.n)
    result = {"model_path": args.model_path, "reward_model_path": args.reward_model_path, "N": N,
              "prompt_len": plen, "num_prefixes": args.num_prefixes, "n": args.n, "score": args.score,
              "by_scale": {}, "trunk": None}
    tokens = s_data.numel() * (N - plen)
    for lam in args.scales:
        rep = residual_gain(lam * s_data, lam * s_samples, N - plen, gen_logp)
        lows = window_gains(lam * s_data.double(), lam * s_samples.double())
        for m, v in rep.items():
            v["gain_lower"] = lows[m][1].sum().item() / tokens  # the data counted among the samples
        result["by_scale"][str(lam)] = {str(m): v for m, v in rep.items()}
    if trunk_path:  # what the detector's trunk knows: its NLL of the same continuations against the generator's
        trunk, _, _ = load_model(trunk_path, require_mode="generator")
        nll = -continuation_logprob(trunk.eval(), natural, plen).double().sum().item() / tokens
        result["trunk"] = {"path": trunk_path, "nll": nll, "advantage": -gen_logp.double().sum().item() / tokens - nll}
    result["conclusion"] = conclusion(result)
    print("\n".join(table(result)) + "\n" + result["conclusion"])
    result["seconds"] = round(time.time() - t0, 1)
    if args.out:
        atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    run_cli(main)
