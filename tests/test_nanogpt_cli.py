"""nanoGPT's command line: a config file as the first argument, --key=value overrides, the
`dataset` key, nanoGPT's own config files (read safely, never executed), and GPT(config)
keeping its own copy of the config."""
import argparse
import os

import pytest
import torch

import train
from core.errors import ProjectError
from core.files import read_jsonl
from engine import Engine
from helpers import prepare_char_data, run_script
from lib.checkpoint import read_checkpoint
from model import GPT, GPTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The settings of nanoGPT's config files (config/*.py in karpathy/nanoGPT), key for key and
# value for value, written the way those files write them (comments, `5 * 8`, `import time`).
NANOGPT_CONFIGS = {
    "train_shakespeare_char.py": """\
# a small character-level model of Tiny Shakespeare

out_dir = 'out-shakespeare-char'
eval_interval = 250  # often: this model overfits
eval_iters = 200
log_interval = 10

# overfitting is expected, so write a checkpoint only when val improves
always_save_checkpoint = False

wandb_log = False  # can be switched on from the command line
wandb_project = 'shakespeare-char'
wandb_run_name = 'mini-gpt'

dataset = 'shakespeare_char'
gradient_accumulation_steps = 1
batch_size = 64
block_size = 256  # 256 characters of context

# the baby GPT
n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2

learning_rate = 1e-3  # a small network tolerates a larger step
max_iters = 5000
lr_decay_iters = 5000  # normally max_iters
min_lr = 1e-4  # normally learning_rate / 10
beta2 = 0.99  # few tokens per step

warmup_iters = 100

# on a laptop add
# device = 'cpu'
# compile = False
""",
    "train_gpt2.py": """\
# GPT-2 (124M) on OpenWebText, one node of 8 GPUs:
# $ torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py

wandb_log = True
wandb_project = 'owt'
wandb_run_name='gpt2-124M'

# about 0.5M tokens per step: 12 sequences * 1024 tokens * 5 accumulation steps * 8 GPUs
batch_size = 12
block_size = 1024
gradient_accumulation_steps = 5 * 8

# 300B tokens in all
max_iters = 600000
lr_decay_iters = 600000

# evaluation
eval_interval = 1000
eval_iters = 200
log_interval = 10

# weight decay
weight_decay = 1e-1
""",
    "finetune_shakespeare.py": """\
import time

out_dir = 'out-shakespeare'
eval_interval = 5
eval_iters = 40
wandb_log = False  # could be switched on
wandb_project = 'shakespeare'
wandb_run_name = 'ft-' + str(time.time())

dataset = 'shakespeare'
init_from = 'gpt2-xl'  # the largest GPT-2

# write a checkpoint only when val improves
always_save_checkpoint = False

# 1 sequence * 32 accumulation steps * 1024 tokens = 32,768 tokens per step;
# the corpus has about 300k tokens, so an epoch is about 9 steps
batch_size = 1
gradient_accumulation_steps = 32
max_iters = 20

# a constant learning rate
learning_rate = 3e-5
decay_lr = False
""",
    "eval_gpt2.py": """\
# evaluate the released GPT-2 (124M): n_layer=12, n_head=12, n_embd=768
batch_size = 8
eval_iters = 500  # a precise estimate
eval_only = True
wandb_log = False
init_from = 'gpt2'
""",
}

# small enough to train in seconds on one CPU thread
TINY = ["--device=cpu", "--compile=False", "--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=16",
        "--batch_size=4", "--eval_iters=2", "--dtype=float32"]


def write_configs(root):
    os.makedirs(os.path.join(root, "config"), exist_ok=True)
    for name, text in NANOGPT_CONFIGS.items():
        with open(os.path.join(root, "config", name), "w", encoding="utf-8") as f:
            f.write(text)
    return os.path.join(root, "config")


def run(script, *argv, cwd):
    return run_script([os.path.join(ROOT, script), *argv], cwd=cwd, env=dict(os.environ, OMP_NUM_THREADS="1"))


def parse(*argv):
    return train.parse_args(list(argv))


@pytest.fixture(scope="module")
def nanogpt_run(tmp_path_factory):
    """nanoGPT's command, run where nanoGPT users run it: a directory holding config/ and data/."""
    root = tmp_path_factory.mktemp("nanogpt")
    write_configs(root)
    prepare_char_data(str(root / "data"), name="shakespeare_char")
    proc = run("train.py", "config/train_shakespeare_char.py", "--max_iters=10", *TINY, cwd=root)
    return root, proc


# ----------------------------------------------------------------------------- the command line

@pytest.mark.slow  # a command line run in a subprocess
def test_nanogpt_command_trains(nanogpt_run):
    root, proc = nanogpt_run
    assert proc.returncode == 0, proc.stderr
    out = root / "out-shakespeare-char"  # the config's out_dir, relative to the current directory
    ckpt = read_checkpoint(str(out / "ckpt.pt"))
    cfg = ckpt["config"]
    assert cfg["data_dir"] == os.path.join("data", "shakespeare_char") and cfg["dataset"] == "shakespeare_char"
    assert ckpt["data"]["data_dir"] == str(root / "data" / "shakespeare_char")  # relative to the cwd
    # the config's values, except where a flag overrides them
    assert (cfg["max_iters"], cfg["n_layer"], cfg["n_embd"], cfg["block_size"]) == (10, 1, 32, 16)
    assert (cfg["dropout"], cfg["learning_rate"], cfg["beta2"]) == (0.2, 1e-3, 0.99)
    assert cfg["always_save_checkpoint"] is False
    assert cfg["compile"] is False and cfg["device"] == "cpu"
    # nanoGPT's W&B settings are read (wandb_log = False in this config: nothing is sent)
    assert (cfg["wandb_log"], cfg["wandb_project"], cfg["wandb_run_name"]) == (False, "shakespeare-char", "mini-gpt")
    evals = [r["step"] for r in read_jsonl(str(out / "metrics.jsonl")) if "val_loss" in r]
    assert evals == [0, 10] and ckpt["iter_num"] in (0, 10)
    # always_save_checkpoint = False: last.pt only when training ends, i.e. written once at iter 10
    assert read_checkpoint(str(out / "last.pt"))["iter_num"] == 10
    assert "warning" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow  # a command line run in a subprocess
def test_sample_accepts_nanogpt_style(nanogpt_run):
    root, proc = nanogpt_run
    assert proc.returncode == 0, proc.stderr
    (root / "sample_cfg.py").write_text("init_from = 'resume'\nout_dir = 'out-shakespeare-char'\n"
                                        "num_samples = 5\nmax_new_tokens = 6\ncompile = False\ndevice = 'cpu'\n")
    s = run("sample.py", "sample_cfg.py", "--start=ROMEO:", "--num_samples=2", "--seed=3", cwd=root)
    assert s.returncode == 0, s.stderr
    samples = s.stdout.split("---------------\n")[:-1]
    assert len(samples) == 2 and all(x.startswith("ROMEO:") for x in samples), s.stdout
    assert s.stderr.count("warning: compile is ignored") == 1, s.stderr
    bad = run("sample.py", "--out_dir=out-shakespeare-char", "--init_from=gpt2-xl", cwd=root)
    assert bad.returncode == 2 and "--init_from" in bad.stderr and "Traceback" not in bad.stderr


def test_nanogpt_config_files_load(tmp_path, capsys):
    cfg = write_configs(tmp_path)
    gpt2 = parse(os.path.join(cfg, "train_gpt2.py"))
    assert gpt2.gradient_accumulation_steps == 40 and isinstance(gpt2.gradient_accumulation_steps, int)
    assert (gpt2.batch_size, gpt2.block_size, gpt2.max_iters, gpt2.lr_decay_iters) == (12, 1024, 600000, 600000)
    assert (gpt2.eval_interval, gpt2.eval_iters, gpt2.log_interval, gpt2.weight_decay) == (1000, 200, 10, 0.1)
    assert (gpt2.wandb_log, gpt2.wandb_project, gpt2.wandb_run_name) == (True, "owt", "gpt2-124M")

    ft = parse(os.path.join(cfg, "finetune_shakespeare.py"))
    assert ft.init_from == "gpt2-xl"  # passed on: the code that builds the model judges it
    assert ft.dataset == "shakespeare" and ft.data_dir == os.path.join("data", "shakespeare")
    assert (ft.out_dir, ft.eval_interval, ft.eval_iters, ft.batch_size, ft.gradient_accumulation_steps,
            ft.max_iters, ft.learning_rate, ft.decay_lr, ft.always_save_checkpoint) == (
        "out-shakespeare", 5, 40, 1, 32, 20, 3e-5, False, False)
    err = capsys.readouterr().err
    # nanoGPT's run name made of code: not run, W&B picks a name
    assert "warning: wandb_run_name's value 'ft-' + str(time.time()) was not evaluated" in err
    assert ft.wandb_run_name is None and ft.wandb_project == "shakespeare"

    ev = parse(os.path.join(cfg, "eval_gpt2.py"))
    assert (ev.init_from, ev.eval_only, ev.batch_size, ev.eval_iters) == ("gpt2", True, 8, 500)

    sc = parse(os.path.join(cfg, "train_shakespeare_char.py"))
    assert (sc.out_dir, sc.data_dir, sc.n_layer, sc.n_head, sc.n_embd, sc.block_size, sc.batch_size,
            sc.dropout, sc.max_iters, sc.lr_decay_iters, sc.min_lr, sc.warmup_iters, sc.beta2) == (
        "out-shakespeare-char", os.path.join("data", "shakespeare_char"), 6, 6, 384, 256, 64, 0.2, 5000, 5000,
        1e-4, 100, 0.99)
    # the project's own presets still load, with --config or as the first argument
    assert parse("config/train_shakespeare_char_cpu.py").n_layer == 4
    assert parse("--config", "config/train_shakespeare_char_cpu.py", "--n_layer=3").n_layer == 3


def test_ignored_settings_warn_once_each(tmp_path, capsys):
    from configurator import add_config_arguments, add_ignored_arguments, parse_args_with_config

    def parser():
        p = argparse.ArgumentParser()
        add_config_arguments(p)
        p.add_argument("--n_layer", type=int, default=1)
        add_ignored_arguments(p, {"compile": "not here", "backend": "not here either"})
        return p
    cfg = tmp_path / "c.py"
    cfg.write_text("compile = True\ncompile = False\nbackend = 'nccl'\n")
    args = parse_args_with_config(parser(), [str(cfg), "--compile=True"])
    err = capsys.readouterr().err.splitlines()
    assert sorted(line.split()[1] for line in err) == ["backend", "compile"], err
    assert all(line.startswith("warning: ") for line in err)
    assert not hasattr(args, "compile") and not hasattr(args, "backend")
    parse_args_with_config(parser(), ["--n_layer=2"])  # nothing set, nothing said
    assert capsys.readouterr().err == ""


def test_wandb_settings_are_read(tmp_path, capsys):
    cfg = tmp_path / "c.py"
    cfg.write_text("wandb_log = True\nwandb_log = False\nwandb_project = 'p'\n")
    args = parse(str(cfg), "--wandb_log=True", "--wandb_run_name", "r")
    assert (args.wandb_log, args.wandb_project, args.wandb_run_name) == (True, "p", "r")
    assert capsys.readouterr().err == ""


def test_overrides_and_precedence(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("dataset = 'from_a'\nmax_iters = 100\nlr_decay_iters = max_iters  # an earlier name\n"
                 "min_lr = learning_rate / 10  # a default\nbatch_size = 2 ** 3\nout_dir = 'out-' + dataset\n")
    b.write_text("data_dir = 'b_dir'\nmax_iters = 7\n")
    args = parse(str(a))
    assert (args.data_dir, args.lr_decay_iters, args.min_lr, args.batch_size, args.out_dir) == (
        os.path.join("data", "from_a"), 100, 6e-4 / 10, 8, "out-from_a")
    # a later config file overrides an earlier one (--config is read first); flags override both
    args = parse(str(b), "--config", str(a))
    assert (args.data_dir, args.max_iters, args.lr_decay_iters) == ("b_dir", 7, 100)
    assert parse(str(a), str(b), "--max_iters=3").max_iters == 3
    # dataset and data_dir set the same thing: the later one wins, flags beat config files
    assert parse(str(b), "--dataset=x").data_dir == os.path.join("data", "x")
    assert parse("--data_dir=y", "--dataset=x").data_dir == os.path.join("data", "x")
    assert parse("--dataset=x", "--data_dir=y").data_dir == "y"
    a.write_text("data_dir = 'first'\ndataset = 'second'\n")
    assert parse(str(a)).data_dir == os.path.join("data", "second")
    # booleans as nanoGPT writes them
    args = parse("--compile=False", "--always_save_checkpoint=False", "--bias=True", "--decay_lr=false",
                 "--eval_only")
    assert (args.compile, args.always_save_checkpoint, args.bias, args.decay_lr, args.eval_only) == (
        False, False, True, False, True)


@pytest.mark.parametrize("text, match", [
    ("n_layer = 3.5\n", r"n_layer = 3\.5 has the wrong type"),
    ("gradient_accumulation_steps = 40 / 8\n", r"gradient_accumulation_steps = 5\.0 has the wrong type"),
    ("n_layers = 3\n", r"unknown setting 'n_layers'"),
    ("if True:\n    n_layer = 3\n", r"line 1: only `name = value` assignments"),
    ("n_layer, n_head = 2, 2\n", r"only `name = value` assignments"),
    ("import os\nout_dir = os.getcwd()\n", r"line 2: cannot evaluate the value of out_dir \(it calls a "
                                           r"function\); config files are read, never executed"),
    ("import os\nout_dir = os.sep\n", r"it reads an attribute"),
    ("import time\nout_dir = time\n", r"it uses the module 'time'; imports are skipped"),
    ("max_iters = iters\n", r"'iters' is not set earlier"),
    ("wandb_run_name = str(1)\nout_dir = wandb_run_name\n", r"'wandb_run_name' was not evaluated"),
    ("max_iters = 9 ** 9 ** 9\n", r"too large"),
    ("out_dir = 'x' * 10 ** 9\n", r"too long"),
    ("out_dir = 'x' * 60000\nout_dir = out_dir + out_dir\n", r"line 2: .* too long"),
    ("max_iters = 1 // 0\n", r"division or modulo by zero"),
    ("dtype = 'float64'\n", r"dtype = 'float64' has the wrong type or value"),
    ("out_dir = 'a' 'b'\nn_layer = (\n", r"syntax error on line 2"),
])
def test_bad_config_files(tmp_path, text, match):
    cfg = tmp_path / "bad.py"
    cfg.write_text(text)
    with pytest.raises(ProjectError, match=match) as e:
        parse(str(cfg))
    assert str(cfg) in str(e.value)


def test_config_code_never_runs(tmp_path, capsys):
    marker = tmp_path / "PWNED"
    call = f"__import__('os').system('touch {marker}')"
    cfg = tmp_path / "evil.py"
    for text in (f"batch_size = {call}\n", f"{call}\n", f"out_dir = [x for x in {call}]\n",
                 f"out_dir = (lambda: {call})()\n", f'out_dir = f"{{{call}}}"\n',
                 f"import os\nos.system('touch {marker}')\n"):
        cfg.write_text(text)
        with pytest.raises(ProjectError, match="cannot evaluate|only `name = value`"):
            parse(str(cfg))
    # on nanoGPT's run name (often code), the value is skipped with the warning, still not run
    cfg.write_text(f"wandb_run_name = {call}\nn_layer = 2\n")
    assert parse(str(cfg)).n_layer == 2
    assert "wandb_run_name's value __import__" in capsys.readouterr().err
    assert not marker.exists(), "a config file ran code"


# ----------------------------------------------------------------------------- GPT keeps its own config

def test_gpt_keeps_its_own_config():
    config = GPTConfig(block_size=16, vocab_size=20, n_layer=1, n_head=2, n_embd=16)
    gen = GPT(config).eval()
    config.mode = "reward"  # the design's client code: the same object now builds the reward model
    config.block_size = 8
    reward = GPT(config)
    assert gen.config.mode == "generator" and gen.config.block_size == 16 and gen.config is not config
    assert hasattr(gen, "lm_head") and not hasattr(gen, "reward_head")
    out = Engine(gen).generate(torch.zeros(2, 1, dtype=torch.long), 12, seed=0)
    assert out.shape == (2, 13)  # generation past the caller's new block_size of 8 still works
    logits, _ = gen(out[:, :16])
    assert logits.shape == (2, 1, 20)
    assert reward.config.mode == "reward" and reward(out[:, :8])[0].shape == (2, 2)
    # changing a model's config changes that model only
    gen.crop_block_size(4)
    assert gen.config.block_size == 4 and gen.transformer.wpe.weight.shape[0] == 4
    assert config.block_size == 8 and reward.config.block_size == 8


@pytest.mark.slow  # a command line run in a subprocess
@pytest.mark.parametrize("script,argv", [("train.py", []), ("sample.py", ["--ckpt", "X"])])
def test_unknown_flag_is_refused_by_name(script, argv, tmp_path):
    """`--bogus_flag 3` is an unknown flag, not a config file named '3'; refused before anything loads."""
    r = run(script, *argv, "--bogus_flag", "3", cwd=tmp_path)
    assert r.returncode != 0
    assert "unknown flag --bogus_flag" in r.stderr and "config file" not in r.stderr
    r = run(script, *argv, "--max_new_tokenz=5" if script == "sample.py" else "--max_itres=5", cwd=tmp_path)
    assert r.returncode != 0 and ("--max_new_tokens" if script == "sample.py" else "--max_iters") in r.stderr


def test_flag_check_keeps_abbreviations_and_numbers():
    args = parse("--max_iters", "3", "--min_lr=1e-5", "--learning_r", "0.5", "--dropout", "-0")
    assert args.max_iters == 3 and args.min_lr == 1e-5 and args.learning_rate == 0.5
    with pytest.raises(ProjectError, match=r"^--min_lr must be >= 0, got -1e-05$"):  # a value, checked as one
        parse("--min_lr=-1e-5")
    with pytest.raises(ProjectError, match="unknown flag --max_itres") as e:
        parse("--max_itres", "1")
    assert "did you mean --max_iters" in e.value.suggestion


def test_resume_is_one_spelling_for_every_script():
    assert parse("--resume").init_from == "resume"
    assert parse("--init_from", "resume").init_from == "resume"  # nanoGPT's spelling, accepted
    assert parse().init_from == "scratch" and not hasattr(parse(), "resume")  # not stored in checkpoints
    with pytest.raises(ProjectError, match="contradict"):
        parse("--resume", "--init_from", "some.pt")
