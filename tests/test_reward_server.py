"""
The detector as a reward elsewhere (issue 79): lib/detector_reward.py's DetectorReward and serve_reward.py, on
detectors that train_reward_model.py writes here (char: ratio_features and frozen_last_token; BPE: per_position).
In process (the unit tier): the rewards are lib.grpo_objective.Reward.score's (GRPO's own reward of a detector) to 1e-6,
TRL's call takes strings and conversations, long texts keep their last tokens, bad bodies are refused by name.
The servers run as subprocesses on free ports (slow), started once for the module: their rewards are the
in-process ones; each bad request gets its 4xx and the next one is answered; concurrent clients get the serial
scores; SIGTERM lets a request in flight finish, refuses new connections and exits 0.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch

import serve_reward
import train_grpo
import train_reward_model
from core.errors import CheckpointError, ProjectError
from core.files import atomic_torch_save
from helpers import make_text, run_script, write_reward_split
from lib.checkpoint import load_model, make_checkpoint, read_checkpoint, sequence_length
from lib.detector_reward import DetectorReward, TextError
from lib.grpo_objective import Reward, Rollout
from model import GPT, GPTConfig
from tokenization_manager import GPT2_VOCAB_SIZE, TokenizationInfo, TokenizationManager

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 32  # the reward data's blocks and the detectors' context
TOL = 1e-6


def close(a, b, tol=TOL):
    """Two lists of rewards equal to tol (relative above 1: the log-ratio reward is in nats)."""
    return len(a) == len(b) and all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b))


def reward_data(out, tok, ids, seed):
    """A reward dataset of N-token blocks of `ids` whose tail after K ~ U[1, N-1] is random tokens."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", 128), ("val", 32)):
        starts = rng.integers(0, len(ids) - N, n)
        x = np.stack([ids[s:s + N] for s in starts]).astype(np.int64)
        k = rng.integers(1, N, n)
        x = np.where(np.arange(N)[None] >= k[:, None], rng.integers(0, tok.vocab_size, (n, N)), x)
        write_reward_split(str(out), split, x, np.stack([k / N, (N - k) / N], 1), tok.info)
    return str(out)


def train_detector(gen, data, out, *flags):
    train_reward_model.main(["--device", "cpu", "--model_path", str(gen), "--data_dir", data, "--out_dir", str(out),
                             "--reward_head_hidden_dim", "32", "--batch_size", "32", "--learning_rate", "1e-2",
                             "--max_iters", "8", "--eval_interval", "8", *flags])
    return str(out / "reward_ckpt.pt")


def varied_head(path):
    """The checkpoint with its head's output layer redrawn: a last-token head stays at chance on this data (docs/
    detector.md), so its best checkpoint is the untrained one, which says 0.5 to every text."""
    ckpt = read_checkpoint(path)
    ckpt["model"]["reward_head.2.weight"] = torch.randn(ckpt["model"]["reward_head.2.weight"].shape,
                                                        generator=torch.Generator().manual_seed(0))
    atomic_torch_save(ckpt, path)
    return path


def save_generator(path, info, vocab_size, seed, **arch):
    torch.manual_seed(seed)
    gen = GPT(GPTConfig(block_size=N, vocab_size=vocab_size, n_head=2, dropout=0.0, **arch))
    atomic_torch_save(make_checkpoint(gen, None, iter_num=0, tokenization=info.to_dict()), path)
    return str(path)


@pytest.fixture(scope="module")
def detectors(tiny_char_ckpt, tmp_path_factory):
    """Detector checkpoints as train_reward_model.py writes them: char ratio_features (per position, LM features on
    another trunk, the generator's copy), char frozen_last_token, BPE per_position (whole trunk trained)."""
    tmp = tmp_path_factory.mktemp("detectors")
    gen = tiny_char_ckpt["ckpt"]
    char = TokenizationManager("char", meta_path=tiny_char_ckpt["meta"])
    ids = char.encode(open(tiny_char_ckpt["text"], encoding="utf-8").read())
    data = reward_data(tmp / "char_data", char, ids, 0)
    trunk = save_generator(tmp / "trunk.pt", char.info, char.vocab_size, 1, n_layer=1, n_embd=16)
    out = {"gen": gen, "char_text": open(tiny_char_ckpt["text"], encoding="utf-8").read(),
           "char_ratio": train_detector(gen, data, tmp / "ratio", "--per_position", "--lm_features", "--gen_features",
                                        "--init_trunk_from", trunk),
           "char_last": varied_head(train_detector(gen, data, tmp / "last"))}
    bpe = TokenizationManager("bpe")
    bpe_gen = save_generator(tmp / "bpe_gen.pt", TokenizationInfo("bpe", GPT2_VOCAB_SIZE), GPT2_VOCAB_SIZE, 2,
                             n_layer=1, n_embd=16)
    data = reward_data(tmp / "bpe_data", bpe, bpe.encode(make_text(20_000, seed=3)), 1)
    out["bpe_pp"] = train_detector(bpe_gen, data, tmp / "bpe", "--per_position", "--unfreeze_last_n_blocks", "-1")
    return out


class Server:
    """serve_reward.py in a subprocess on a free port; its stdout is read on a thread (the pipe never fills)."""

    def __init__(self, tmp, ckpt, *flags):
        self.err_path = os.path.join(tmp, f"server_{id(self)}.err")
        cmd = [sys.executable, os.path.join(ROOT, "serve_reward.py"), "--ckpt", ckpt, "--port", "0", "--device", "cpu",
               *flags]
        self.err = open(self.err_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=self.err, text=True,
                                     env={**os.environ, "OMP_NUM_THREADS": "1"})
        self.lines, self.ready = [], threading.Event()
        threading.Thread(target=self.read, daemon=True).start()

    def read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            m = re.search(r"ready: .* on (http://\S+:\d+) ", line)
            if m:
                self.url = m.group(1)
                self.ready.set()

    def wait_ready(self, timeout=180):
        deadline = time.time() + timeout
        while not self.ready.wait(0.2):
            assert self.proc.poll() is None and time.time() < deadline, \
                f"server not ready: {''.join(self.lines)}{open(self.err_path).read()}"
        return self

    def post(self, body, timeout=120):
        """(status, JSON answer) of POST /get_reward with a JSON body (bytes: sent as they are)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + "/get_reward", data, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)

    def get(self, path):
        with urllib.request.urlopen(self.url + path, timeout=60) as r:
            return json.load(r)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)
        self.err.close()


@pytest.fixture(scope="module")
def servers(detectors, tmp_path_factory):
    """Started together (their start-ups overlap): char (ratio_features, p_natural, small limits, shared batches)
    and bpe (per_position, logit)."""
    tmp = str(tmp_path_factory.mktemp("servers"))
    s = {"char": Server(tmp, detectors["char_ratio"], "--max_batch", "64", "--max_chars", "200", "--batch_cap", "8",
                        "--batch_wait_ms", "20"),
         "bpe": Server(tmp, detectors["bpe_pp"], "--reward", "logit")}
    try:
        yield {k: v.wait_ready() for k, v in s.items()}
    finally:
        for v in s.values():
            v.stop()


@pytest.fixture(scope="module")
def scorers(detectors):
    return {"char": DetectorReward(detectors["char_ratio"], batch_size=8),
            "bpe": DetectorReward(detectors["bpe_pp"], "logit")}


def char_texts(detectors, n, seed, lo=3, hi=N):
    """n windows of the char corpus, of random lengths in lo..hi characters."""
    text, rng = detectors["char_text"], np.random.default_rng(seed)
    return [text[s:s + int(k)] for s, k in zip(rng.integers(0, len(text) - hi, n), rng.integers(lo, hi + 1, n))]


def grpo_rewards(ckpt, reward, seqs):
    """GRPO's sequence reward of each Sequence (ids, prompt_len) (lib.grpo_objective.Reward.score, as train_grpo.py
    builds it), its detector loaded as train_grpo.load_models loads it; sequences of one length and prompt are
    scored in one batch, as a step's."""
    model, ckpt_dict, _ = load_model(ckpt, require_mode="reward")
    model.eval()
    args = train_grpo.get_args(["--model_path", "m", "--reward_model_path", ckpt, "--reward", reward])
    grpo_reward = Reward.from_args(args)
    groups, out = {}, [None] * len(seqs)
    for i, s in enumerate(seqs):
        groups.setdefault((len(s.ids), s.prompt_len), []).append(i)
    with torch.no_grad():
        for (_, plen), rows in groups.items():
            ids = torch.tensor([seqs[i].ids for i in rows])
            r = grpo_reward.score(model, Rollout(ids, plen, 0, None, len(rows)), sequence_length(ckpt_dict))[0]
            for i, v in zip(rows, r.tolist()):
                out[i] = v
    return out


# ---------------------------------------------------------------------------- the rewards, in process

def test_char_rewards_are_grpos(scorers, detectors):
    """Char detectors, every reward: DetectorReward's is GRPO's (ratio_features: p_natural and logit;
    frozen_last_token: p_natural)."""
    texts = char_texts(detectors, 24, 0) + char_texts(detectors, 6, 1, N, N)  # some of one length: a shared batch
    mine, truncated = scorers["char"].score(texts)
    assert truncated == [False] * len(texts) and len(set(np.round(mine, 6))) > len(texts) // 2  # texts told apart
    seqs = scorers["char"].encode(texts)
    assert close(mine, grpo_rewards(detectors["char_ratio"], "p_natural", seqs))
    logit = DetectorReward(detectors["char_ratio"], "logit")
    assert close(logit.score(texts)[0], grpo_rewards(detectors["char_ratio"], "logit", seqs))
    last = DetectorReward(detectors["char_last"])
    assert close(last.score(texts)[0], grpo_rewards(detectors["char_last"], "p_natural", last.encode(texts)))
    assert close([scorers["char"].score([t])[0][0] for t in texts], mine)  # batched or alone: the same rewards


PROMPTS = ["ROMEO:\n", "The king", "JULIET: good night, sweet", "O"]
COMPLETIONS = [" what light through yonder window breaks", " doth speak of love and war.", " prince!", "!"]


def test_bpe_rewards_with_prompts_are_grpos(scorers, detectors):
    """The BPE detector called as TRL calls it (prompts, completions) gives GRPO's reward (Reward.score) (the
    prompt's tokens, then the completion's; the log-ratio counts the completion's positions only)."""
    trl = scorers["bpe"](prompts=PROMPTS, completions=COMPLETIONS, completion_ids=None, trainer_state=None)
    seqs = scorers["bpe"].encode(COMPLETIONS, PROMPTS)
    assert [s.prompt_len for s in seqs] == [len(TokenizationManager("bpe").encode(p)) for p in PROMPTS]
    assert close(trl, grpo_rewards(detectors["bpe_pp"], "logit", seqs))
    p_nat = DetectorReward(detectors["bpe_pp"])
    assert close(p_nat(prompts=PROMPTS, completions=COMPLETIONS), grpo_rewards(detectors["bpe_pp"], "p_natural", seqs))


def test_trl_calls_take_conversations_and_refuse_unknown_characters_by_name(scorers, detectors):
    reward = scorers["char"]
    texts = char_texts(detectors, 3, 2)
    plain = reward(prompts=["a", "b", "c"], completions=texts)
    assert plain == reward.score(texts, ["a", "b", "c"])[0] and reward.__name__ == "detector_p_natural"
    chat = reward(prompts=[[{"role": "user", "content": "a"}]] * 3,
                  completions=[[{"role": "assistant", "content": t}] for t in texts])
    assert chat == reward.score(texts)[0]  # conversational prompts: their template is unknown, left out
    with pytest.raises(TextError, match=r"completions\[1\] has 2 character\(s\) outside .*'€', '~'") as e:
        reward(completions=["ok", "a€b~"])
    assert isinstance(e.value, ValueError)
    with pytest.raises(TextError, match=r"completions\[0\] is neither a string"):
        reward(completions=[3])
    with pytest.raises(ProjectError, match="needs a per-position detector"):
        DetectorReward(detectors["char_last"], "logit")


def test_long_texts_keep_their_last_tokens_and_are_flagged(scorers, detectors):
    long_text = detectors["char_text"][100:100 + 3 * N]
    rewards, truncated = scorers["char"].score([long_text, long_text[-N:]], [long_text[:10], ""])
    assert truncated == [True, False] and rewards[0] == rewards[1]  # the last N characters, whatever the prompt
    seq = scorers["char"].encode([long_text[N:]], [long_text[:N]])[0]  # a prompt cut away to its last tokens
    assert seq.truncated and seq.prompt_len == 0 and len(seq.ids) == N


# ---------------------------------------------------------------------------- the server (subprocesses: slow)

@pytest.mark.slow
def test_the_servers_rewards_are_the_in_process_ones(servers, scorers, detectors):
    """The char server (p_natural) on texts of many lengths, some too long; the BPE server (logit) through
    OpenRLHF's request (query = prompt + response, prompts, labels) and without prompts."""
    texts = char_texts(detectors, 24, 0) + char_texts(detectors, 6, 1, N, 2 * N)
    status, got = servers["char"].post({"query": texts})
    rewards, truncated = scorers["char"].score(texts)
    assert status == 200 and close(got["rewards"], rewards) and got["truncated"] == truncated and any(truncated)
    status, got = servers["bpe"].post({"query": [p + c for p, c in zip(PROMPTS, COMPLETIONS)], "prompts": PROMPTS,
                                       "labels": [None] * 4})
    assert status == 200 and close(got["rewards"], scorers["bpe"](prompts=PROMPTS, completions=COMPLETIONS))
    whole = servers["bpe"].post({"query": COMPLETIONS})[1]["rewards"]  # no prompts: each query scored whole
    assert close(whole, scorers["bpe"].score(COMPLETIONS)[0])


BAD = [  # (body, status, words the message has)
    (b"{not json", 400, "not JSON"),
    ({"queries": ["a"]}, 422, 'no "query"'),
    ({"query": "the king"}, 422, '"query" must be a list'),
    ({"query": ["the king", 3]}, 422, '"query"[1] is int'),
    ({"query": []}, 422, "empty list"),
    ({"query": ["a"] * 65}, 413, "more than --max_batch 64"),
    ({"query": ["a" * 201]}, 413, "more than --max_chars 200"),
    ({"query": ["the king", "a€b~"]}, 422, "\"query\"[1] has 2 character(s) outside the char detector's vocabulary"),
    ({"query": [""]}, 422, '"query"[0] is empty'),
    ({"query": ["the king"], "prompts": ["queen"]}, 422, "does not start with"),
    ({"query": ["the king"], "prompts": ["the", "a"]}, 422, "one per query"),
]


@pytest.mark.parametrize("body, status, words", BAD, ids=[str(b[2]) for b in BAD])
def test_a_bad_body_is_refused_with_its_status_and_the_problem(scorers, body, status, words):
    """In process, as the server's handler does it: parse_body (the request), then DetectorReward.encode (the
    texts: empty, characters outside the vocabulary)."""
    args = serve_reward.get_args(["--ckpt", "x", "--max_batch", "64", "--max_chars", "200"])
    try:
        texts, prompts = serve_reward.parse_body(body if isinstance(body, bytes) else json.dumps(body).encode(), args)
        with pytest.raises(TextError) as e:
            scorers["char"].encode(texts, prompts, ('"query"', '"prompts"'))
        got_status, message = 422, e.value.message
    except serve_reward.BadRequest as e:
        got_status, message = e.status, e.message
    assert got_status == status and words in message, message


@pytest.mark.slow
@pytest.mark.parametrize("body, status, words", BAD, ids=[str(b[2]) for b in BAD])
def test_a_bad_request_gets_its_4xx_and_the_next_one_is_answered(servers, scorers, body, status, words):
    got_status, got = servers["char"].post(body)
    assert got_status == status and words in got["detail"], got
    if "€" in words:
        assert "'€', '~'" in got["detail"]
    status, got = servers["char"].post({"query": ["the king"]})
    assert status == 200 and close(got["rewards"], scorers["char"].score(["the king"])[0])


@pytest.mark.slow
def test_concurrent_clients_get_the_serial_scores_in_shared_batches(servers, scorers, detectors):
    requests = [char_texts(detectors, 1 + k % 5, 100 + k) for k in range(40)]
    serial = [scorers["char"].score(texts)[0] for texts in requests]
    before = servers["char"].get("/health")
    answers = {}

    def client(c):
        for k in range(c, len(requests), 8):
            answers[k] = servers["char"].post({"query": requests[k]})

    threads = [threading.Thread(target=client, args=(c,)) for c in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers) == list(range(len(requests)))
    for k, (status, got) in answers.items():
        assert status == 200 and close(got["rewards"], serial[k]), (k, got, serial[k])
    after = servers["char"].get("/health")
    assert after["texts"] - before["texts"] == sum(map(len, requests))
    assert after["batches"] - before["batches"] < len(requests)  # requests shared forwards


@pytest.mark.slow
def test_info_and_health(servers, detectors):
    info = servers["bpe"].get("/info")
    from core.files import sha256_file
    assert info["checkpoint"] == detectors["bpe_pp"] and info["sha256"] == sha256_file(detectors["bpe_pp"])
    assert info["tokenizer_kind"] == "bpe" and info["block_size"] == N and info["reward"] == "logit"
    assert "log-ratio" in info["definition"] and info["head"].startswith("per-position")
    assert servers["char"].get("/health")["status"] == "ok"


@pytest.mark.slow
def test_the_verl_function_of_the_docs_calls_the_server(servers, scorers, detectors):
    """docs/usage.md's verl reward function, as written there, against the server."""
    with open(os.path.join(ROOT, "docs", "usage.md"), encoding="utf-8") as f:
        section = f.read().split("## The detector as a reward elsewhere", 1)[1]
    code = re.search(r"# verl: .*?\n(.*?)```", section, re.S).group(1)
    ns = {}
    exec(compile(code.replace("http://127.0.0.1:5000", servers["char"].url), "docs/usage.md", "exec"), ns)
    texts = char_texts(detectors, 4, 7)
    got = ns["compute_score"](data_sources=["x"] * 4, solution_strs=texts, ground_truths=[None] * 4,
                              extra_infos=[{}] * 4)
    assert close(got, scorers["char"].score(texts)[0])


def refused(url, within=2.0):
    """Whether a new connection to url's host and port is refused within `within` seconds."""
    host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
    deadline = time.time() + within
    while time.time() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
        except OSError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_sigterm_lets_the_request_in_flight_finish_refuses_new_ones_and_exits_0(detectors, tmp_path):
    # frozen_last_token; a batch waits 3 s for company, so a request stays in flight when SIGTERM comes
    server = Server(str(tmp_path), detectors["char_last"], "--batch_wait_ms", "3000", "--batch_cap", "512")
    try:
        server.wait_ready()
        texts, answer = char_texts(detectors, 300, 9), {}
        t = threading.Thread(target=lambda: answer.update(r=server.post({"query": texts})))
        t.start()
        deadline = time.time() + 2.5  # the request waits 3 s in the batcher: in flight until then
        while server.get("/health")["waiting"] == 0:
            assert time.time() < deadline, "the request never reached the batcher"
            time.sleep(0.05)
        server.proc.send_signal(signal.SIGTERM)
        assert refused(server.url) and t.is_alive(), "a new connection must be refused while the request is scored"
        t.join(60)
        status, got = answer["r"]
        assert status == 200 and close(got["rewards"], DetectorReward(detectors["char_last"]).score(texts)[0])
        assert len(set(got["rewards"])) > 10 and server.proc.wait(timeout=60) == 0
    finally:
        server.stop()


@pytest.mark.slow
def test_loading_errors_name_the_flag_and_the_fix(detectors, tmp_path):
    r = run_script(["serve_reward.py", "--ckpt", str(tmp_path / "nope.pt"), "--port", "0"], cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "error: --ckpt" in r.stderr and "no such file" in r.stderr, r.stderr
    assert "suggestion: pass the reward_ckpt.pt that train_reward_model.py wrote" in r.stderr
    with pytest.raises(CheckpointError, match=r"--ckpt: .* is a generator checkpoint") as e:
        serve_reward.main(["--ckpt", detectors["gen"], "--device", "cpu", "--port", "0"])
    assert "train_reward_model.py" in e.value.suggestion
    (tmp_path / "junk.pt").write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match=r"--ckpt: .* is not a PyTorch checkpoint"):
        serve_reward.main(["--ckpt", str(tmp_path / "junk.pt"), "--device", "cpu", "--port", "0"])
    with pytest.raises(ProjectError, match=r"--batch_cap must be >= 1"):
        serve_reward.get_args(["--ckpt", "x", "--batch_cap", "0"])


@pytest.mark.slow
def test_the_benchmark_loses_nothing(detectors, tiny_char_ckpt, tmp_path):
    """bench/bench_reward_server.py at tiny settings, on the char detector and its corpus."""
    out = tmp_path / "bench.json"
    r = run_script(["bench/bench_reward_server.py", "--ckpt", detectors["char_last"], "--corpus",
                    tiny_char_ckpt["text"], "--clients", "2", "--requests", "2", "--texts", "3", "--waits", "2",
                    "--out", str(out)], cwd=ROOT, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "| server, --batch_wait_ms 2 |" in r.stdout and "lost requests: 0" in r.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [row["answered"] for row in rows] == ["4/4"] * 3 and rows[-1]["max_abs_diff"] <= TOL
