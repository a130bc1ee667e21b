"""mauve_metric: MAUVE with features from a local Hugging Face GPT-2 directory (optional package)."""
import pytest

from experiment import mauve_score
from helpers import make_text


def test_unavailable_names_the_missing_part(tmp_path):
    why = mauve_score.unavailable(str(tmp_path))
    assert "pip install mauve-text" in why or f"{tmp_path} is not a local Hugging Face model directory" in why


def test_mauve_tells_text_from_noise_with_a_tiny_featurizer(tmp_path):
    pytest.importorskip("mauve")
    transformers = pytest.importorskip("transformers")
    import torch
    torch.manual_seed(0)
    transformers.GPT2Model(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=64,
                                                   vocab_size=50257)).save_pretrained(tmp_path / "feat")
    assert mauve_score.unavailable(str(tmp_path / "feat")) is None
    text = make_text(20000, seed=1).split("\n\n")
    natural, same = text[:60], text[60:120]
    noise = ["".join(chr(97 + (i * 7 + j * 3) % 26) for j in range(40)) for i in range(60)]
    close = mauve_score.mauve_score(same, natural, str(tmp_path / "feat"))
    far = mauve_score.mauve_score(noise, natural, str(tmp_path / "feat"))
    assert close["samples"] == 60 and close["buckets"] == 6
    assert 0 <= far["mauve"] < close["mauve"] <= 1, (far, close)
