"""
A detector checkpoint as a reward for other trainers (TRL, OpenRLHF, verl): DetectorReward scores texts with
any detector train_reward_model.py writes (every recipe, char or BPE), as train_grpo.py turns the detector's
output into its sequence reward (grpo_objective.Reward.score; --reward p_natural or logit). serve_reward.py serves
it over HTTP.

    reward = DetectorReward("out-reward/reward_ckpt.pt")                   # reward="p_natural"
    reward(prompts=["ROMEO:\\n"], completions=["What light through yonder window breaks"])   # TRL's call
    rewards, truncated = reward.score(["ROMEO:\\nWhat light through yonder window breaks"])

A sequence is the prompt's tokens, then the text's (as GRPO scores a rollout: its prompt, then the generated
tokens), in the detector's own tokenizer. One longer than the detector's context keeps its last block_size
tokens, as a rollout is never longer, and is flagged truncated. A char detector refuses a text with characters
its vocabulary lacks (TextError, naming them) instead of mapping them to others: a reward for a text the
detector never read would be a made-up number.
"""
from typing import NamedTuple

import torch

from core.errors import CheckpointError, ProjectError
from core.objectives import logit_rewards
from lib.checkpoint import checkpoint_tokenization, load_model, sequence_length, tokenizer_for
from lib.hf_interop import source_sha256

REWARDS = ("p_natural", "logit")
# what each reward is, in words (serve_reward.py's /info shows it)
DEFINITIONS = {
    "p_natural": "P(natural) of the sequence (the prompt's tokens, then the text's), as train_grpo.py --reward "
                 "p_natural scores a rollout: the detector's forward, i.e. the mean over positions of the "
                 "per-position head's softmax, or the last-token head's softmax at the last token; in [0, 1], "
                 "higher = more natural",
    "logit": "the detector's log-ratio log p_data / p_generator summed over the text's positions (not the "
             "prompt's), as train_grpo.py --reward logit scores a rollout (core.objectives.logit_rewards, over "
             "the detector's trained sequence length N); in nats, higher = more natural; per-position detectors "
             "only",
}
MAX_SHOWN = 5  # characters named in an out-of-vocabulary error


class TextError(ProjectError, ValueError):
    """A text the detector cannot score (not a string, empty, characters outside a char detector's vocabulary):
    the caller's input, not a bug (serve_reward.py answers 422 with the message)."""


class Sequence(NamedTuple):
    """One text, ready to score: its token ids (at most block_size), how many of them are the prompt's, and
    whether its beginning was cut off to fit the detector's context."""
    ids: list
    prompt_len: int
    truncated: bool


def message_content(item, what):
    """A TRL completion or prompt as text: a string, or a conversation (a list of {"role", "content"}
    messages), whose contents are joined."""
    if isinstance(item, str):
        return item
    if isinstance(item, list) and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in item):
        return "".join(m["content"] for m in item)
    raise TextError(f"{what} is neither a string nor a list of {{'role', 'content'}} messages",
                    "pass completions as TRL does: strings, or conversations")


class DetectorReward:
    """A detector checkpoint (train_reward_model.py's reward_ckpt.pt, read with weights_only=True) as a reward:
    score(texts, prompts) -> (rewards, truncated flags); called as TRL calls reward_funcs, the rewards alone.
    reward: 'p_natural' or 'logit' (DEFINITIONS); batch_size: sequences per forward; meta_path: a char
    detector's meta.pkl where the one it records is not on this machine."""

    def __init__(self, ckpt_path, reward="p_natural", device="cpu", batch_size=64, meta_path=None):
        if reward not in REWARDS:
            raise ProjectError(f"reward must be one of {', '.join(REWARDS)}, got {reward!r}",
                               "use p_natural (P(natural)) or logit (the log-ratio)")
        self.model, ckpt, _ = load_model(ckpt_path, device=device, require_mode="reward")
        self.model.eval()  # no dropout: the same text always gets the same reward
        config = self.model.config
        if reward == "logit" and not config.reward_per_position:
            raise ProjectError(f"reward 'logit' (--reward logit) needs a per-position detector, but {ckpt_path} has "
                               f"a last-token head", "use reward p_natural, or train one with train_reward_model.py "
                                                     "--per_position")
        self.tokenizer = self.load_tokenizer(ckpt, ckpt_path, meta_path)
        self.ckpt_path, self.reward, self.device, self.batch_size = ckpt_path, reward, device, batch_size
        self.block_size = config.block_size  # the longest sequence the detector reads
        self.sequence_length = sequence_length(ckpt, ckpt_path)  # N of its reward data: logit_rewards' prior
        self.sha256 = source_sha256(ckpt_path)
        self.__name__ = f"detector_{reward}"  # TRL names each reward function's logged column by it

    def load_tokenizer(self, ckpt, ckpt_path, meta_path):
        """The detector's own tokenizer (the one its checkpoint records); meta_path only replaces a char
        vocabulary's file, and must hold the same vocabulary."""
        recorded = checkpoint_tokenization(ckpt)
        if meta_path is not None and recorded is not None and recorded.method != "char":
            raise ProjectError(f"meta_path {meta_path} is a char vocabulary, but {ckpt_path} reads {recorded}",
                               "leave meta_path out: the detector's own tokenizer is used")
        tok = tokenizer_for(ckpt, ckpt_path, meta_path=meta_path)
        size = recorded.vocab_size if recorded is not None else self.model.config.vocab_size
        if tok.method == "char" and tok.vocab_size != size:
            raise CheckpointError(f"the char vocabulary {tok.meta_path} has {tok.vocab_size} characters, but "
                                  f"{ckpt_path} was trained on {size}",
                                  "pass the meta.pkl of the corpus the detector was trained on")
        return tok

    def info(self):
        """What the scores are of (serve_reward.py's GET /info)."""
        c = self.model.config
        head = "per-position" if c.reward_per_position else "last-token"
        head += " with LM features" if c.reward_lm_features else ""
        head += " and the generator's" if c.reward_gen_features else ""
        return {"checkpoint": self.ckpt_path, "sha256": self.sha256, "tokenizer": str(self.tokenizer.info),
                "tokenizer_kind": self.tokenizer.method, "block_size": self.block_size,
                "sequence_length": self.sequence_length, "head": head, "reward": self.reward,
                "definition": DEFINITIONS[self.reward], "device": str(self.device), "dtype": "float32",
                "truncation": f"a sequence longer than {self.block_size} tokens is scored on its last "
                              f"{self.block_size}"}

    def __call__(self, prompts=None, completions=None, **kwargs):
        """TRL's reward function signature: the reward of each completion (TRL's other keyword arguments are
        not needed). String prompts come before their completions, as GRPO's prompts do; conversational
        prompts pass through a chat template first, whose text is not known here, so they are left out."""
        if completions is None:
            raise TextError("no completions to score", "call it as TRL does: reward(prompts=..., completions=...)")
        texts = [message_content(c, f"completions[{i}]") for i, c in enumerate(completions)]
        use_prompts = prompts is not None and all(isinstance(p, str) for p in prompts)
        return self.score_sequences(self.encode(texts, prompts if use_prompts else None, ("completions", "prompts")))

    def score(self, texts, prompts=None):
        """(rewards, truncated flags) of texts, each after its prompt if prompts are given."""
        seqs = self.encode(texts, prompts)
        return self.score_sequences(seqs), [s.truncated for s in seqs]

    def encode(self, texts, prompts=None, names=("text", "prompt")):
        """The Sequence of each text (after its prompt); a TextError names the first text that cannot be scored,
        as names[0][i] (names[1][i] for a prompt)."""
        if prompts is not None and len(prompts) != len(texts):
            raise TextError(f"{len(prompts)} prompts for {len(texts)} texts", "give one prompt per text, or none")
        return [self.sequence(t, None if prompts is None else prompts[i], [f"{n}[{i}]" for n in names])
                for i, t in enumerate(texts)]

    def sequence(self, text, prompt=None, names=("text", "prompt")):
        """One text's Sequence: the prompt's tokens then the text's, the last block_size of them."""
        head = self.token_ids(prompt, names[1]) if prompt else []
        ids = head + self.token_ids(text, names[0])
        if not ids:
            raise TextError(f"{names[0]} is empty: it has no token to score", "send a non-empty text")
        cut = max(0, len(ids) - self.block_size)
        return Sequence(ids[cut:], max(0, len(head) - cut), cut > 0)

    def token_ids(self, text, what):
        """The detector's tokens of a text; a char detector refuses characters outside its vocabulary by name."""
        if not isinstance(text, str):
            raise TextError(f"{what} is a {type(text).__name__}, not a string", "send every text as a JSON string")
        if self.tokenizer.method == "char":
            missing = [c for c in dict.fromkeys(text) if c not in self.tokenizer.stoi]
            if missing:
                shown = ", ".join(repr(c) for c in missing[:MAX_SHOWN]) + (", ..." if len(missing) > MAX_SHOWN else "")
                raise TextError(f"{what} has {len(missing)} character(s) outside the char detector's vocabulary "
                                f"({self.tokenizer.vocab_size} characters): {shown}",
                                "remove or replace them: a char detector reads only the characters of its corpus")
        return self.tokenizer.encode(text)

    @torch.no_grad()
    def score_sequences(self, seqs):
        """The reward of each Sequence. Sequences of one length share a forward (batch_size at most), as GRPO's
        rollouts of one step do: never padded, so the sequences batched with one cannot change its reward beyond
        float rounding."""
        rewards = [0.0] * len(seqs)
        by_length = {}
        for i, s in enumerate(seqs):
            by_length.setdefault(len(s.ids), []).append(i)
        for rows in by_length.values():
            for k in range(0, len(rows), self.batch_size):
                chunk = rows[k:k + self.batch_size]
                idx = torch.tensor([seqs[i].ids for i in chunk], dtype=torch.long, device=self.device)
                for i, r in zip(chunk, self.batch_rewards(idx, [seqs[i].prompt_len for i in chunk]).tolist()):
                    rewards[i] = r
        return rewards

    def batch_rewards(self, idx, prompt_lens):
        """The rewards (B,) of token ids idx (B, T), as GRPO's sequence reward (grpo_objective.Reward.score):
        P(natural) from the detector's forward, or the log-ratio of the positions after each prompt (logit_rewards)."""
        if self.reward == "p_natural":
            return self.model(idx)[0][:, 0].float()
        logits = self.model.position_logits(idx).float()
        logits = logits[..., 0] - logits[..., 1]  # log D / (1 - D), without forming D
        return torch.cat([logit_rewards(logits[r:r + 1], p, self.sequence_length) for r, p in enumerate(prompt_lens)])
