"""Hugging Face interop with real transformers code and tiny random GPT-2 models saved with
save_pretrained: pretrained weights in (every generator-taking script, train.py --init_from),
export_hf.py out (GPT2LMHeadModel, AutoTokenizer, reward models), and the round trip."""
import json
import logging
import os
import re
import sys
import warnings

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import evaluate  # noqa: E402
import export_hf  # noqa: E402
import sample  # noqa: E402
import train  # noqa: E402
from core.errors import CheckpointError, ProjectError  # noqa: E402
from core.files import read_jsonl  # noqa: E402
from helpers import make_text, prepare_alphabet_data, train_gameable_reward, train_tiny_checkpoint  # noqa: E402
from lib.checkpoint import load_model, read_checkpoint  # noqa: E402
from lib.corpus import Corpus  # noqa: E402
from lib.prepare import prepare_corpus  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from tokenization_manager import TokenizationManager  # noqa: E402

transformers = pytest.importorskip("transformers")
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel, GPT2Model  # noqa: E402

TEXT = "ROMEO:\nBut soft, what light  through yonder window breaks?\n\n\tIt is the east; 1595 \u2014 caf\u00e9 \U0001F600\n"
TRAIN = ["--device", "cpu", "--dtype", "float32", "--batch_size", "4", "--eval_iters", "2", "--log_interval", "1",
         "--warmup_iters", "0", "--learning_rate", "1e-3", "--patience", "0", "--dropout", "0.0"]


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    """A tiny random GPT-2 saved as save_pretrained writes it (safetensors) and as older versions
    did (pytorch_model.bin), a BPE and a char dataset, a trained char generator."""
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    # a large initializer range: activations big enough that an approximation would show
    hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=50257, n_positions=64,
                                    initializer_range=0.3)).eval()
    st_dir, bin_dir = str(root / "gpt2-tiny"), str(root / "gpt2-tiny-bin")
    hf.save_pretrained(st_dir)
    os.makedirs(bin_dir)
    torch.save(hf.state_dict(), os.path.join(bin_dir, "pytorch_model.bin"))
    hf.config.to_json_file(os.path.join(bin_dir, "config.json"))
    (root / "input.txt").write_text(make_text(20000), encoding="utf-8")
    bpe, char = str(root / "tiny_bpe"), str(root / "tiny_char")
    prepare_corpus(str(root / "input.txt"), bpe, "bpe", 0.9, log=lambda *a: None)
    prepare_corpus(str(root / "input.txt"), char, "char", 0.9, log=lambda *a: None)
    gen_char = train_tiny_checkpoint(char, str(root / "char.pt"), steps=20)
    return dict(root=root, hf=hf, st=st_dir, bin=bin_dir, bpe=bpe, char=char, gen_char=gen_char)


def run_main(module, monkeypatch, capsys, *args):
    monkeypatch.setattr(sys, "argv", [f"{module.__name__}.py", *map(str, args)])
    module.main()
    return capsys.readouterr().out


def logits(model, x):
    with torch.no_grad():
        return model.lm_head(model.hidden_states(x))


def load_quietly(cls, path):
    """from_pretrained, returning the model and every warning transformers logged or raised."""
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    transformers.logging.add_handler(handler)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_warning()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model, info = cls.from_pretrained(path, output_loading_info=True)
    finally:
        transformers.logging.remove_handler(handler)
        transformers.logging.set_verbosity(verbosity)
    return model.eval(), info, [r.getMessage() for r in records] + [str(c.message) for c in caught]


# ----------------------------------------------------------------------------- weights in

@pytest.mark.parametrize("fmt", ["st", "bin"])
def test_a_save_pretrained_directory_loads_with_gpt2s_logits(w, fmt):
    model, ckpt, _ = load_model(w[fmt])
    model.eval()
    c = model.config
    assert (c.n_layer, c.n_head, c.n_embd, c.block_size, c.vocab_size, c.bias) == (2, 2, 32, 64, 50257, True)
    assert c.activation == "gelu_tanh"  # GPT-2's 'gelu_new'
    assert ckpt["tokenization"] == {"method": "bpe", "vocab_size": 50257, "meta_path": None}
    x = torch.randint(0, 50257, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = w["hf"](x).logits
    ours = logits(model, x)
    assert (ours - ref).abs().max() <= 1e-4 * max(1.0, ref.abs().max())
    # the exact GELU (nanoGPT's) would not reproduce GPT-2: the activation setting matters
    exact = GPT(GPTConfig(**{**vars(c), "activation": "gelu"}))
    exact.load_state_dict(model.state_dict())
    assert (logits(exact.eval(), x) - ref).abs().max() > 1e-3


def test_a_hub_name_gets_a_clear_error_and_nothing_is_downloaded(w, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError) as e:
        load_model("gpt2-medium")
    assert "never downloaded" in e.value.message
    assert "save_pretrained('gpt2-medium-local')" in e.value.suggestion
    assert e.value.suggestion.startswith("if it is a path, check it")  # 'nodir' may be a mistyped path
    with pytest.raises(ProjectError) as e:  # nanoGPT's value, as a config file would give it
        run_main(train, monkeypatch, capsys, "--init_from", "gpt2", "--data_dir", w["bpe"],
                 "--out_dir", tmp_path / "o", *TRAIN)
    assert e.value.message.startswith("--init_from gpt2 is not a local model directory")
    assert "--init_from gpt2-local" in e.value.suggestion
    assert not (tmp_path / "o").exists()
    # the README's directory name, not saved yet: the suggestion saves GPT-2 itself under that name
    with pytest.raises(ProjectError) as e:
        run_main(train, monkeypatch, capsys, "--init_from", "gpt2-local", "--data_dir", w["bpe"],
                 "--out_dir", tmp_path / "o", *TRAIN)
    assert e.value.message.startswith("--init_from gpt2-local is not a local model directory")
    assert "from_pretrained('gpt2').save_pretrained('gpt2-local')" in e.value.suggestion
    assert e.value.suggestion.endswith("here and pass --init_from gpt2-local") and "-local-local" not in e.value.suggestion
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="without a config.json"):
        load_model(str(empty))


def test_init_from_a_directory_computes_gpt2s_loss_then_trains_and_resumes(w, tmp_path, monkeypatch, capsys):
    out = tmp_path / "ft"
    # eval only: the step-0 val loss is the one transformers' GPT-2 gets on the same batches
    stdout = run_main(train, monkeypatch, capsys, "--init_from", w["st"], "--data_dir", w["bpe"], "--out_dir", out,
                      "--block_size", "32", "--eval_only", *TRAIN)
    val = float(re.search(r"step 0: .*val loss (\d+\.\d+)", stdout).group(1))
    g = torch.Generator().manual_seed(1337 + 1_000_003 * 2)  # train.estimate_loss's val stream
    losses = []
    for _ in range(2):
        X, Y = train.get_batch(Corpus(w["bpe"]), "val", 4, 32, g, "cpu")
        with torch.no_grad():
            lg = w["hf"](X).logits
        losses.append(torch.nn.functional.cross_entropy(lg.view(-1, lg.size(-1)), Y.view(-1)).item())
    assert abs(val - np.mean(losses)) < 1e-4

    # one training step, then a resume
    stdout = run_main(train, monkeypatch, capsys, "--init_from", w["st"], "--data_dir", w["bpe"], "--out_dir", out,
                      "--block_size", "32", "--n_layer", "7", "--max_iters", "1", "--eval_interval", "1", *TRAIN)
    assert "initialised from" in stdout and "2 layers" in stdout  # the architecture came from the weights
    last = read_checkpoint(str(out / "last.pt"))
    assert last["iter_num"] == 1
    assert last["init_from"]["path"] == os.path.abspath(w["st"]) and last["init_from"]["format"] == "huggingface"
    assert last["model_args"]["block_size"] == 32 and last["model_args"]["vocab_size"] == 50257
    assert last["model_extra"]["activation"] == "gelu_tanh"
    pre = w["hf"].state_dict()["transformer.h.0.mlp.c_fc.weight"].t()
    moved = (last["model"]["transformer.h.0.mlp.c_fc.weight"] - pre).abs().max()
    assert 0 < moved < 0.01  # fine-tuned from GPT-2, not from scratch
    assert last["model"]["transformer.wpe.weight"].shape == (32, 32)  # the first 32 of 64 positions
    stdout = run_main(train, monkeypatch, capsys, "--init_from", "resume", "--data_dir", w["bpe"], "--out_dir", out,
                      "--max_iters", "2", "--eval_interval", "1", *TRAIN)
    assert "resuming from" in stdout
    last = read_checkpoint(str(out / "last.pt"))
    assert last["iter_num"] == 2 and last["init_from"]["path"] == os.path.abspath(w["st"])
    assert [r["step"] for r in read_jsonl(str(out / "metrics.jsonl")) if "val_loss" in r] == [0, 1, 2]


def test_init_from_a_gpt2_directory_needs_bpe_data(w, tmp_path, monkeypatch, capsys):
    with pytest.raises(ProjectError) as e:
        run_main(train, monkeypatch, capsys, "--init_from", w["st"], "--data_dir", w["char"],
                 "--out_dir", tmp_path / "o", *TRAIN)
    assert "holds a bpe model" in e.value.message and "--tokenization bpe" in e.value.suggestion


def test_init_from_a_project_checkpoint(w, tmp_path, monkeypatch, capsys):
    out = tmp_path / "o"
    run_main(train, monkeypatch, capsys, "--init_from", w["gen_char"], "--data_dir", w["char"], "--out_dir", out,
             "--max_iters", "0", *TRAIN)
    src, ck = load_model(w["gen_char"])[0], load_model(str(out / "ckpt.pt"))[0]
    x = torch.randint(0, src.config.vocab_size, (2, 32))
    assert torch.equal(logits(src.eval(), x), logits(ck.eval(), x))


def test_generator_scripts_take_a_directory(w, tmp_path, monkeypatch, capsys):
    stdout = run_main(sample, monkeypatch, capsys, "--ckpt", w["st"], "--start", "ROMEO:", "--num_samples", "1",
                      "--max_new_tokens", "5", "--device", "cpu")
    assert stdout.startswith("ROMEO:")
    stdout = run_main(evaluate, monkeypatch, capsys, "--ckpt", w["st"], "--data_dir", w["bpe"], "--max_batches", "1",
                      "--device", "cpu")
    assert "perplexity" in stdout
    import prepare_reward_data
    prepare_reward_data.main(["--model_path", w["st"], "--input_mode", "binary", "--train_bin",
                              os.path.join(w["bpe"], "train.bin"), "--val_bin", os.path.join(w["bpe"], "val.bin"),
                              "--output_dir", str(tmp_path / "rd"), "--block_size", "16", "--max_samples_per_split",
                              "4", "--samples_per_chunk", "1", "--device", "cpu", "--allow_split_mismatch"])
    meta = (tmp_path / "rd" / "train_metadata.txt").read_text()
    assert "bpe" in meta
    capsys.readouterr()


# ----------------------------------------------------------------------------- export out

def check_generator_export(project_model, out_dir, tok, text):
    hf, info, logged = load_quietly(GPT2LMHeadModel, out_dir)
    assert not any(info.values()) and not logged, (info, logged)
    x = torch.randint(0, tok.vocab_size, (2, project_model.config.block_size), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        diff = (hf(x).logits - logits(project_model.eval(), x)[..., :tok.vocab_size]).abs().max().item()
    assert diff <= 1e-4
    hf_tok = AutoTokenizer.from_pretrained(out_dir)
    ids = hf_tok(text)["input_ids"]
    assert ids == tok.encode(text) and hf_tok.decode(ids) == text
    return hf


def test_export_bpe_generator(w, tmp_path, monkeypatch, capsys):
    out = tmp_path / "ft"
    run_main(train, monkeypatch, capsys, "--init_from", w["st"], "--data_dir", w["bpe"], "--out_dir", out,
             "--block_size", "32", "--max_iters", "1", "--eval_interval", "1", *TRAIN)
    # the project's own BPE models pad the vocabulary to 50304: the export crops it
    torch.manual_seed(0)
    padded = GPT(GPTConfig(block_size=32, vocab_size=50304, n_layer=2, n_head=2, n_embd=32, bias=False))
    from core.files import atomic_torch_save
    from lib.checkpoint import make_checkpoint
    atomic_torch_save(make_checkpoint(padded, tokenization={"method": "bpe", "vocab_size": 50257, "meta_path": None}),
                      str(tmp_path / "padded.pt"))
    tok = TokenizationManager("bpe")
    for src in (str(out / "last.pt"), str(tmp_path / "padded.pt")):
        e = tmp_path / ("e_" + os.path.basename(src))
        stdout = run_main(export_hf, monkeypatch, capsys, "--ckpt", src, "--out_dir", e)
        assert "checked with transformers" in stdout
        assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= set(os.listdir(e))
        hf = check_generator_export(load_model(src)[0], str(e), tok, TEXT)
        assert hf.config.vocab_size == 50257 and hf.generation_config.eos_token_id == 50256


def test_export_char_generator_and_round_trip(w, tmp_path, monkeypatch, capsys):
    e = tmp_path / "hf-char"
    run_main(export_hf, monkeypatch, capsys, "--ckpt", w["gen_char"], "--out_dir", e)
    tok = TokenizationManager("char", meta_path=os.path.join(w["char"], "meta.pkl"))
    text = open(os.path.join(w["root"], "input.txt"), encoding="utf-8").read()[:500]  # newlines, double spaces
    assert "\n" in text and " " in text
    src = load_model(w["gen_char"])[0]
    check_generator_export(src, str(e), tok, text)
    # round trip: the directory as a checkpoint, and as --init_from
    back, ckpt, _ = load_model(str(e))
    assert ckpt["tokenization"]["method"] == "char" and ckpt["tokenization"]["vocab_size"] == tok.vocab_size
    x = torch.randint(0, tok.vocab_size, (2, 32))
    assert torch.equal(logits(back.eval(), x), logits(src.eval(), x))
    out = tmp_path / "again"
    run_main(train, monkeypatch, capsys, "--init_from", e, "--data_dir", w["char"], "--out_dir", out,
             "--max_iters", "0", *TRAIN)
    again = load_model(str(out / "ckpt.pt"))[0]
    assert torch.equal(logits(again.eval(), x), logits(src, x))
    # exporting again replaces an earlier export, but never a directory holding other files
    run_main(export_hf, monkeypatch, capsys, "--ckpt", str(out / "ckpt.pt"), "--out_dir", e)
    (e / "notes.txt").write_text("mine")
    with pytest.raises(ProjectError, match="holds files an export does not write"):
        run_main(export_hf, monkeypatch, capsys, "--ckpt", w["gen_char"], "--out_dir", e)
    assert (e / "notes.txt").exists()


def test_reward_export_reproduces_p_natural(tmp_path, monkeypatch, capsys):
    data = prepare_alphabet_data(tmp_path)
    src = train_gameable_reward(data, str(tmp_path / "reward.pt"))
    d = str(tmp_path / "hf-reward")
    run_main(export_hf, monkeypatch, capsys, "--ckpt", src, "--out_dir", d)
    reward, _, _ = load_model(src)
    tok = TokenizationManager("char", meta_path=os.path.join(data, "meta.pkl"))
    texts = ["dddddddddddddddd", "abcdefghijklmnop", "ddaddbdd"]
    with torch.no_grad():
        want = torch.cat([reward(torch.tensor([tok.encode(t)]))[0][:, 0] for t in texts])
    assert want.max() - want.min() > 0.3  # a head that tells these apart

    # the docs' plain-PyTorch recipe (docs/reward_model_training_infrastructure.md)
    from safetensors.torch import load_file
    trunk, hf_tok = GPT2Model.from_pretrained(d).eval(), AutoTokenizer.from_pretrained(d)
    head = load_file(f"{d}/reward_head.safetensors")
    got = []
    for text in texts:
        ids = torch.tensor([hf_tok(text)["input_ids"]])
        with torch.no_grad():
            h = trunk(ids).last_hidden_state[:, -1]  # the last token's hidden state
            h = torch.relu(h @ head["reward_head.0.weight"].T + head["reward_head.0.bias"])
            got.append(torch.softmax(h @ head["reward_head.2.weight"].T + head["reward_head.2.bias"], -1)[:, 0])
    assert (torch.cat(got) - want).abs().max() <= 1e-5

    cfg = json.load(open(f"{d}/reward_config.json"))
    assert set(cfg["gpt_config"]) == set(vars(reward.config)) and cfg["gpt_config"]["mode"] == "reward"
    back, ckpt, _ = load_model(d, require_mode="reward")  # and back into the project
    assert ckpt["reward_data"] == {"block_size": 32}
    with torch.no_grad():
        again = torch.cat([back(torch.tensor([tok.encode(t)]))[0][:, 0] for t in texts])
    assert torch.equal(again, want)

    # GRPO runs (and resumes) on exported directories: the policy's and the reward model's
    import train_grpo
    gen = tmp_path / "hf-gen"
    run_main(export_hf, monkeypatch, capsys, "--ckpt", train_tiny_checkpoint(data, str(tmp_path / "gen.pt"), steps=5),
             "--out_dir", gen, "--skip_check")
    argv = ["--model_path", str(gen), "--reward_model_path", d, "--data_dir", data, "--out_dir", str(tmp_path / "grpo"),
            "--prompts_per_step", "2", "--group_size", "2", "--eval_interval", "100", "--save_interval", "1",
            "--device", "cpu"]
    train_grpo.main(argv + ["--max_steps", "1"])
    train_grpo.main(argv + ["--max_steps", "2", "--resume"])
    assert read_checkpoint(str(tmp_path / "grpo" / "ckpt.pt"))["iter_num"] == 2
    capsys.readouterr()


def test_core_scripts_and_directories_work_without_transformers(w, tmp_path, monkeypatch, capsys):
    for name in ("transformers", "tokenizers"):
        monkeypatch.setitem(sys.modules, name, None)  # `import name` now raises ImportError
    model, _, _ = load_model(w["st"])
    assert model.config.vocab_size == 50257
    with pytest.raises(ProjectError) as e:
        run_main(export_hf, monkeypatch, capsys, "--ckpt", w["gen_char"], "--out_dir", tmp_path / "e")
    assert "'tokenizers'" in e.value.message and "pip install tokenizers" in e.value.suggestion
    assert not (tmp_path / "e").exists() and not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
