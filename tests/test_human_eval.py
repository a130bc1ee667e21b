"""human_eval.py (blind pairwise rating page and its scoring) and experiment/rating.py, its library:
the Wilson interval, pairing and blinding, scoring, every bad input, and a rating session
in a real headless Chromium (skipped where Chromium, chromedriver or Selenium is missing)."""
import html
import json
import os
import re
import shutil
import time

import pytest

from core.errors import ProjectError, TokenizationMismatchError
from experiment import rating
from helpers import make_text, prepare_char_data, run_script, train_tiny_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARMS = ("ARMALPHA", "ARMGAMMA", "ARMBETA")  # names that cannot occur in the play-like corpus


def run(*args):
    return run_script(["human_eval.py", *args], cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """One char corpus with two tiny generators, and a second corpus with another vocabulary."""
    d = tmp_path_factory.mktemp("heval")
    _, data = prepare_char_data(str(d / "a"), make_text(12000, lower=True))
    _, other = prepare_char_data(str(d / "b"), make_text(12000, seed=1, upper=True))
    ckpts = {"a": train_tiny_checkpoint(data, str(d / "a.pt"), steps=30, block_size=48),
             "b": train_tiny_checkpoint(data, str(d / "b.pt"), steps=3, block_size=48, seed=1),
             "other": train_tiny_checkpoint(other, str(d / "other.pt"), steps=3, block_size=48)}
    return d, data, ckpts


def make_page(setup, out, gens, *extra):
    d, data, _ = setup
    args = ["make", *sum((["--gen", g] for g in gens), []), "--data_dir", data, "--prompt_len", "12",
            "--sample_len", "30", "--seed", "3", "--out_dir", str(out), "--device", "cpu", *extra]
    r = run(*args)
    assert r.returncode == 0, r.stderr
    return str(out / "index.html"), str(out / "key.json")


@pytest.fixture(scope="module")
def page(setup):
    """Three generator arms (two of them the same checkpoint and temperature) plus natural, 3 prompts."""
    d, _, ck = setup
    gens = [f"ARMALPHA={ck['a']}@0.8", f"ARMGAMMA={ck['a']}@0.8", f"ARMBETA={ck['b']}"]
    return make_page(setup, d / "page", gens, "--n_items", "3", "--natural")


def page_items(page_path):
    """{item id: (prompt, A text, B text)} read back from the page's HTML."""
    with open(page_path, encoding="utf-8") as f:
        doc = f.read()
    out = {}
    for m in re.finditer(r'<section class="item" data-id="(\w+)">(.*?)</section>', doc, re.S):
        pres = re.findall(r"<pre>(.*?)</pre>", m.group(2), re.S)
        pres = [html.unescape(re.sub(r'<span class="ctx">.*?</span>', "", p, flags=re.S)) for p in pres]
        out[m.group(1)] = tuple(pres)
    return out


# ----------------------------------------------------------------------------- units

def test_wilson_interval_hand_computed():
    # 8 of 10: p = 0.8, z^2/n = 0.38415; centre (0.8 + 0.19207) / 1.38415 = 0.71681,
    # half 1.95996 / 1.38415 * sqrt(0.016 + 0.0096037) = 0.22658
    lo, hi = rating.wilson_interval(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    lo, hi = rating.wilson_interval(0, 5)  # never below 0, and not degenerate
    assert lo == 0.0 and 0.4 < hi < 0.5
    assert rating.wilson_interval(0, 0) is None
    lo, hi = rating.wilson_interval(2.5, 5)  # ties as halves: symmetric around 1/2
    assert lo == pytest.approx(1 - hi)


def test_items_cover_every_pair_and_prompt_with_balanced_sides():
    items = rating.make_items(5, ["x", "y", "z"], seed=0)
    assert len(items) == 15 and len({it["id"] for it in items}) == 15
    seen = {(frozenset((it["A"], it["B"])), it["prompt"]) for it in items}
    assert len(seen) == 15  # every pair of arms on every prompt, once
    for pair in ({"x", "y"}, {"x", "z"}, {"y", "z"}):
        first = sorted(pair)[0]
        n_a = sum(it["A"] == first for it in items if {it["A"], it["B"]} == pair)
        assert n_a in (2, 3)
    assert items == rating.make_items(5, ["x", "y", "z"], seed=0)
    assert items != rating.make_items(5, ["x", "y", "z"], seed=1)


def test_gen_spec_parsing():
    assert rating.parse_gen_spec("adv=out/ckpt.pt", 1.0) == ("adv", "out/ckpt.pt", 1.0)
    assert rating.parse_gen_spec("adv=out/ckpt.pt@0.7", 1.0) == ("adv", "out/ckpt.pt", 0.7)
    assert rating.parse_gen_spec("adv=runs/a@b/ckpt.pt", 0.9) == ("adv", "runs/a@b/ckpt.pt", 0.9)
    for bad in ("out/ckpt.pt", "=x.pt", "a b=x.pt", "adv=x.pt@0", "adv=x.pt@-1"):
        with pytest.raises(ProjectError):
            rating.parse_gen_spec(bad, 1.0)
    with pytest.raises(ProjectError, match="two arms"):
        rating.check_arm_names(["adv"], natural=False)
    with pytest.raises(ProjectError, match="more than once"):
        rating.check_arm_names(["adv", "adv"], natural=False)
    with pytest.raises(ProjectError, match="reserved"):
        rating.check_arm_names(["natural", "adv"], natural=False)
    rating.check_arm_names(["adv"], natural=True)


def test_page_escapes_text_and_fetches_nothing():
    items = [{"id": "i001", "prompt": 0, "A": "x", "B": "y"}]
    doc = rating.render_page("0123456789abcdef", "Which is <better>?", items, ["<b>KING</b> & co"],
                            {"x": ["</pre><script>alert(1)</script>"], "y": ["plain"]})
    assert "<script>alert(1)" not in doc and "&lt;script&gt;alert(1)&lt;/script&gt;" in doc
    assert "&lt;b&gt;KING&lt;/b&gt; &amp; co" in doc and "Which is &lt;better&gt;?" in doc
    assert not re.search(r"https?://|<link|\ssrc=", doc)


def toy_key():
    items = [{"id": f"i00{k}", "prompt": k, "A": a, "B": b}
             for k, (a, b) in enumerate([("x", "y"), ("y", "x"), ("x", "y"), ("y", "x"), ("x", "y")], 1)]
    return {"format": rating.KEY_FORMAT, "page_id": "p1", "arms": [{"name": "x"}, {"name": "y"}], "items": items}


def toy_ratings(choices, page_id="p1", n_items=5):
    return {"format": rating.RATINGS_FORMAT, "page_id": page_id, "n_items": n_items,
            "ratings": [{"item": f"i00{k}", "choice": c} for k, c in enumerate(choices, 1)]}


def test_score_counts_ties_as_half():
    key = toy_key()
    # i001 A=x -> x wins; i002 A=y chosen -> y wins; i003 tie; i004 B=x -> x wins; i005 B=y -> y wins
    rated = rating.check_ratings(toy_ratings(["A", "A", "tie", "B", "B"]), "r.json", key, "key.json")
    res = rating.score(key, rated)
    (row,) = res["pairs"]
    assert (row["first"], row["second"], row["wins"], row["losses"], row["ties"], row["n"]) == ("x", "y", 2, 2, 1, 5)
    assert row["win_rate"] == pytest.approx(0.5)
    assert row["ci95"] == pytest.approx(list(rating.wilson_interval(2.5, 5)))
    assert res["sides"] == {"A": 2, "B": 2, "tie": 1}
    table = rating.format_table(res)
    assert "x vs y" in table and "half a win" in table


@pytest.mark.parametrize("content, message", [
    ("", "is empty"),
    ("{not json", "is not JSON"),
    ("[1, 2]", "not an object"),
    (json.dumps({"hello": 1}), "not a ratings file"),
    (json.dumps(toy_ratings(["A"], page_id="other")), "foreign ratings"),
    (json.dumps(toy_ratings(["A"], n_items=7)), "does not match the page's items"),
    (json.dumps({**toy_ratings([]), "ratings": [{"item": "i999", "choice": "A"}]}), "does not match the page's items"),
    (json.dumps(toy_ratings(["A", "C"])), "unknown choice 'C'"),
    (json.dumps({**toy_ratings([]), "ratings": [{"item": "i001", "choice": "A"}] * 2}), "twice"),
    (json.dumps(toy_ratings([])), "no ratings"),
])
def test_bad_ratings_are_refused(tmp_path, content, message):
    p = tmp_path / "ratings.json"
    p.write_text(content)
    with pytest.raises(ProjectError, match=re.escape(message)):
        rating.check_ratings(rating.read_json(str(p), "--ratings", "ratings file"), str(p), toy_key(), "key.json")


def test_bad_key_is_refused(tmp_path):
    p = tmp_path / "key.json"
    p.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ProjectError, match="not a key"):
        rating.check_key(rating.read_json(str(p), "--key", "key"), str(p))
    key = toy_key()
    key["items"][0]["A"] = "ghost"
    with pytest.raises(ProjectError, match="not in the key's arm list"):
        rating.check_key(key, "key.json")


# ----------------------------------------------------------------------------- make / score

@pytest.mark.slow  # a command line in a subprocess
def test_page_is_blind_and_key_unblinds(setup, page):
    _, _, ck = setup
    page_path, key_path = page
    with open(page_path, encoding="utf-8") as f:
        doc = f.read()
    for secret in (*ARMS, "natural", ck["a"], ck["b"], os.path.basename(ck["a"]), "temperature", "0.8"):
        assert secret not in doc, secret
    key = json.load(open(key_path))
    assert key["page_id"] in doc and [a["name"] for a in key["arms"]] == [*ARMS, "natural"]
    assert key["arms"][0]["temperature"] == 0.8 and len(key["arms"][0]["sha256"]) == 64
    items = page_items(page_path)
    assert sorted(items) == sorted(it["id"] for it in key["items"]) and len(items) == 3 * 6
    prompts = {}
    for it in key["items"]:
        prompt, a, b = items[it["id"]]
        assert prompts.setdefault(it["prompt"], prompt) == prompt  # one prompt text per prompt index
        if {it["A"], it["B"]} == {"ARMALPHA", "ARMGAMMA"}:
            assert a == b  # same checkpoint and temperature: the same noise gives the same text
        elif it["A"] != it["B"]:
            assert a != b


@pytest.mark.slow  # a command line in a subprocess
def test_make_refuses_generators_with_different_tokenizers(setup, tmp_path):
    _, data, ck = setup
    r = run("make", "--gen", f"x={ck['a']}", "--gen", f"y={ck['other']}", "--data_dir", data, "--n_items", "2",
            "--prompt_len", "4", "--sample_len", "8", "--out_dir", str(tmp_path / "out"), "--device", "cpu")
    assert r.returncode == 2, r.stderr
    assert "different tokenizers" in r.stderr and ck["a"] in r.stderr and ck["other"] in r.stderr
    assert not (tmp_path / "out").exists()
    with pytest.raises(TokenizationMismatchError):  # the same check against the corpus
        rating.check_same_tokenizer([("x", {"method": "char", "vocab_size": 3, "chars": "abc"}),
                                    ("corpus", {"method": "char", "vocab_size": 3, "chars": "abd"})])


def test_make_names_a_missing_data_dir(setup, tmp_path):
    """Not a tokenizer mismatch: a missing directory read as a BPE corpus said that before."""
    import human_eval
    _, data, ck = setup
    for bad, what in ((tmp_path / "nodata", "is not a directory"), (tmp_path, "holds no val.bin")):
        with pytest.raises(ProjectError, match=f"^--data_dir {re.escape(str(bad))} {what}$"):
            human_eval.main(["make", "--gen", f"x={ck['a']}", "--gen", f"y={ck['b']}", "--data_dir", str(bad),
                             "--out_dir", str(tmp_path / "out"), "--device", "cpu"])
    assert not (tmp_path / "out").exists()


def test_make_slides_the_window_past_block_size(setup, tmp_path, capsys):
    """The README's rating command (prompt_len + sample_len past the generators' block_size, as with
    the main job's models) runs: the continuations are sampled with a sliding window, like sample.py."""
    import human_eval
    from experiment.measures import corpus_tokenizer, decode_rows, generated_blocks, val_tokens
    from lib.checkpoint import load_model
    d, data, ck = setup
    small = train_tiny_checkpoint(data, str(tmp_path / "small.pt"), steps=3, block_size=16)
    human_eval.main(["make", "--gen", f"x={small}", "--gen", f"y={ck['b']}", "--natural", "--data_dir", data,
                     "--n_items", "2", "--prompt_len", "12", "--sample_len", "30", "--seed", "3",
                     "--out_dir", str(tmp_path / "page"), "--device", "cpu"])
    assert "it samples with a sliding window" in capsys.readouterr().out
    key = json.load(open(tmp_path / "page" / "key.json"))
    texts = {}
    for it in key["items"]:
        _, a, b = page_items(str(tmp_path / "page" / "index.html"))[it["id"]]
        texts.setdefault((it["A"], it["prompt"]), a)
        texts.setdefault((it["B"], it["prompt"]), b)
    # the page shows exactly what the rolling generate gives (the same seeded noise as any arm)
    model, _, _ = load_model(small, require_mode="generator")
    rows = generated_blocks(model, val_tokens(data), 2, 42, 3, "cpu", 1.0, 128, 12)
    want = decode_rows(corpus_tokenizer(data), rows[:, 12:])
    assert [texts[("x", p)] for p in (0, 1)] == want and all(len(t) == 30 for t in want)


@pytest.mark.slow  # a command line in a subprocess
def test_make_never_overwrites_a_key(setup, page):
    page_path, key_path = page
    before = open(key_path).read(), open(page_path).read()
    _, data, ck = setup
    r = run("make", "--gen", f"x={ck['a']}", "--natural", "--data_dir", data, "--n_items", "2",
            "--prompt_len", "4", "--sample_len", "8", "--out_dir", os.path.dirname(key_path), "--device", "cpu")
    assert r.returncode == 2 and "already exists" in r.stderr and "--overwrite" in r.stderr
    assert (open(key_path).read(), open(page_path).read()) == before


@pytest.mark.slow  # a command line in a subprocess
def test_score_cli_and_its_errors_keep_outputs(page, tmp_path):
    _, key_path = page
    key = json.load(open(key_path))
    good = tmp_path / "ratings.json"
    good.write_text(json.dumps({"format": rating.RATINGS_FORMAT, "page_id": key["page_id"],
                                "n_items": len(key["items"]),
                                "ratings": [{"item": it["id"], "choice": "A"} for it in key["items"]]}))
    out = tmp_path / "score.json"
    r = run("score", "--key", key_path, "--ratings", str(good), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "ARMALPHA vs ARMGAMMA" in r.stdout and "95% Wilson" in r.stdout
    res = json.load(open(out))
    assert res["ratings"] == 18 and sum(p["n"] for p in res["pairs"]) == 18 and res["sides"]["A"] == 18
    before = out.read_text()
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({**json.loads(good.read_text()), "page_id": "0000000000000000"}))
    empty = tmp_path / "empty.json"
    empty.write_text("")
    for bad, message in ((foreign, "foreign ratings"), (empty, "is empty")):
        r = run("score", "--key", key_path, "--ratings", str(bad), "--out", str(out))
        assert r.returncode == 2 and message in r.stderr and str(bad) in r.stderr, r.stderr
    assert out.read_text() == before


# ----------------------------------------------------------------------------- in a browser

@pytest.fixture(scope="module")
def browser_paths():
    """(chromium, chromedriver), or pytest.skip saying what is missing (before any model is trained)."""
    pytest.importorskip("selenium", reason="selenium is not installed (pip install selenium): browser test skipped")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip("chromium or chromedriver not found (apt-get install chromium chromium-driver): "
                    "browser test skipped")
    return browser, driver


def chrome_driver(paths, download_dir, monkeypatch):
    """A headless Chromium driven by Selenium. Selenium Manager is never asked for anything:
    the browser and the driver are given explicitly."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    browser, driver = paths
    monkeypatch.setenv("SE_OFFLINE", "true")
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1200,800"):
        opts.add_argument(a)
    opts.add_experimental_option("prefs", {"download.default_directory": str(download_dir),
                                           "download.prompt_for_download": False})
    d = webdriver.Chrome(service=Service(driver), options=opts)
    d.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(download_dir)})
    return d


@pytest.mark.slow
def test_rating_session_in_headless_chromium(browser_paths, setup, tmp_path, monkeypatch):
    from_dir = tmp_path / "downloads"
    from_dir.mkdir()
    _, _, ck = setup
    d = chrome_driver(browser_paths, from_dir, monkeypatch)
    try:
        page_path, key_path = make_page(setup, tmp_path / "page", [f"ARMALPHA={ck['a']}", f"ARMBETA={ck['b']}"],
                                        "--n_items", "4")
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.keys import Keys

        def keys(*k):
            ActionChains(d).send_keys(*k).perform()

        def shown():
            return [s.get_attribute("data-id") for s in d.find_elements("css selector", "section.item")
                    if s.is_displayed()]

        d.get("file://" + page_path)
        status = lambda: d.find_element("id", "status").text  # noqa: E731
        assert status().startswith("0 of 4 rated") and shown() == ["i001"]
        keys("a", "b")
        assert status().startswith("2 of 4 rated") and shown() == ["i003"]
        # the ratings and the position survive a reload. Chromium hands a page's localStorage writes
        # to its storage service asynchronously, so a reload within milliseconds of the last key may
        # read the state from before them (seen once, in a full-suite run on both cores); reload until the
        # fresh page shows them. The page writes nothing on load, so a stale load changes nothing,
        # and a write that is lost for good still fails here.
        deadline = time.time() + 10
        d.refresh()
        while not status().startswith("2 of 4 rated") and time.time() < deadline:
            time.sleep(0.2)
            d.refresh()
        assert status().startswith("2 of 4 rated") and shown() == ["i003"]
        keys(Keys.BACKSPACE)
        assert shown() == ["i002"]
        assert d.find_element("css selector", 'button[data-choice="B"]').get_attribute("class") == "choice selected"
        keys(Keys.ARROW_RIGHT, "t", "a")
        assert status().startswith("4 of 4 rated") and d.find_element("id", "done").is_displayed()
        assert d.execute_script("return document.getElementById('bar').style.width") == "100%"
        page_id = json.load(open(key_path))["page_id"]
        assert d.execute_script(f"return localStorage.getItem('human_eval:{page_id}')") is not None
        d.find_element("id", "download").click()
        target = from_dir / f"ratings-{page_id}.json"
        for _ in range(100):
            if target.exists() and not list(from_dir.glob("*.crdownload")):
                break
            time.sleep(0.1)
    finally:
        d.quit()
    ratings = json.loads(target.read_text())
    assert ratings["page_id"] == page_id and ratings["downloaded_at"]
    assert [(r["item"], r["choice"]) for r in ratings["ratings"]] == [("i001", "A"), ("i002", "B"),
                                                                      ("i003", "tie"), ("i004", "A")]
    r = run("score", "--key", key_path, "--ratings", str(target), "--out", str(tmp_path / "score.json"))
    assert r.returncode == 0, r.stderr
    key = {it["id"]: it for it in json.load(open(key_path))["items"]}
    alpha_wins = sum(key[i][c] == "ARMALPHA" for i, c in (("i001", "A"), ("i002", "B"), ("i004", "A")))
    (row,) = json.load(open(tmp_path / "score.json"))["pairs"]
    assert (row["first"], row["wins"], row["losses"], row["ties"]) == ("ARMALPHA", alpha_wins, 3 - alpha_wins, 1)
