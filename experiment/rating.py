"""
Blind pairwise human evaluation (the library of human_eval.py): the --gen specs, the check that
all generators share one tokenizer, the items (every pair of arms for every prompt, sides
randomised), the self-contained rating page, the unblinding key and the scoring.

Items. With k arms and n prompts the page holds n * k(k-1)/2 items: every pair of arms for every
prompt, so each pair is compared on exactly the same n prompts. For each pair, which arm is shown
as A is balanced (n/2 each way, the odd one random) and shuffled over the prompts; the items are
then shuffled over the whole page (seeded), so neither the position on the page nor the side says
which arm wrote a text. Item ids are their page positions (i001, i002, ...).

Page id: the first 16 hex digits of the sha256 of the page's items (texts and sides) and seed,
so the same inputs give the same page and any other page gets another id. The page keeps its
ratings in the browser's localStorage under "human_eval:<page id>".

Scoring. For a pair (X, Y), with X the arm listed first in the key: wins = items where the rater
preferred X, losses = Y preferred, ties. Win rate of X = (wins + ties / 2) / n: a tie counts as
half a win for each side. The 95% interval is Wilson's score interval with that rate as the
proportion and n ratings.
"""
import datetime
import hashlib
import html
import itertools
import json
import math
import os
import re

import numpy as np

from core.errors import ProjectError, TokenizationMismatchError
from core.files import sha256_file
from tokenization_manager import TokenizationInfo, load_meta

KEY_FORMAT = "human_eval_key"
RATINGS_FORMAT = "human_eval_ratings"
VERSION = 1
CHOICES = ("A", "B", "tie")
NATURAL = "natural"  # the arm of the val text's own continuation (--natural)
Z95 = 1.959963984540054
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


# ----------------------------------------------------------------------------- arms

def parse_gen_spec(spec, default_temperature):
    """'NAME=CKPT' or 'NAME=CKPT@T' -> (name, path, temperature)."""
    name, sep, rest = spec.partition("=")
    if not sep or not name or not rest:
        raise ProjectError(f"--gen {spec!r} is not NAME=CKPT or NAME=CKPT@TEMPERATURE",
                           "e.g. --gen adv=out-run/adv/ckpt.pt@0.8")
    path, temperature = rest, default_temperature
    head, at, tail = rest.rpartition("@")
    if at:
        try:
            path, temperature = head, float(tail)
        except ValueError:
            pass  # an '@' inside the path, no temperature
    if not NAME_RE.fullmatch(name):
        raise ProjectError(f"--gen {spec!r}: the arm name {name!r} may only hold letters, digits, '_', '.', '-'",
                           "use a short name such as adv or control")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ProjectError(f"--gen {spec!r}: temperature {temperature} must be a positive number",
                           "e.g. @1.0 (the model's own distribution) or @0.8")
    return name, path, temperature


def check_arm_names(names, natural):
    """At least two arms, unique names, 'natural' reserved for --natural."""
    if NATURAL in names:
        raise ProjectError(f"--gen: the arm name {NATURAL!r} is reserved for the val text itself",
                           "pass --natural to add that arm, and another name for the generator")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ProjectError(f"--gen: the arm name(s) {', '.join(dup)} are given more than once",
                           "give every generator its own name")
    if len(names) + bool(natural) < 2:
        raise ProjectError("a pairwise evaluation needs two arms: only one --gen was given",
                           "pass a second --gen, or --natural to compare with the val text's own continuation")


def checkpoint_tokenizer(ckpt, path, data_dir=None):
    """What a checkpoint's tokenization record says, comparable across checkpoints:
    {'method', 'vocab_size', 'chars'} with 'chars' the char vocabulary (None for BPE)."""
    rec = ckpt.get("tokenization")
    if not isinstance(rec, dict) or "method" not in rec:
        raise ProjectError(f"{path} does not record its tokenization (a nanoGPT checkpoint?), so it cannot be "
                           "checked against the other generators and the corpus",
                           "pass generator checkpoints written by train.py or train_grpo.py")
    info = TokenizationInfo.from_dict(rec)
    chars = None
    if info.method == "char":
        candidates = [info.meta_path, os.path.join((ckpt.get("data") or {}).get("data_dir") or "", "meta.pkl")]
        found = next((p for p in candidates if p and os.path.exists(p)), None)
        if found is None:
            raise ProjectError(f"the char vocabulary of {path} was not found (looked for "
                               f"{', '.join(p for p in candidates if p)})",
                               "run where the generator's prepared corpus (meta.pkl) is")
        meta = load_meta(found)
        chars = "".join(meta["itos"][i] for i in range(meta["vocab_size"]))
    return {"method": info.method, "vocab_size": info.vocab_size, "chars": chars}


def tokenizer_identity(tok):
    """The same dict for a TokenizationManager (e.g. the corpus')."""
    chars = "".join(tok.itos[i] for i in range(tok.vocab_size)) if tok.method == "char" else None
    return {"method": tok.method, "vocab_size": tok.vocab_size, "chars": chars}


def describe_tokenizer(t):
    if t["chars"] is None:
        return f"{t['method']} (vocab_size={t['vocab_size']})"
    return f"char (vocab_size={t['vocab_size']}, characters {t['chars']!r:.60})"


def check_same_tokenizer(named):
    """named: [(what, tokenizer dict)], e.g. ('adv checkpoint out/ckpt.pt', ...). All must agree."""
    (what0, t0), rest = named[0], named[1:]
    for what, t in rest:
        if t != t0:
            raise TokenizationMismatchError(
                f"{what0} and {what} use different tokenizers: {describe_tokenizer(t0)} vs {describe_tokenizer(t)}",
                "compare generators trained on the same prepared corpus (same meta.pkl or both GPT-2 BPE), "
                "and pass that corpus as --data_dir")


def file_sha256(path):
    """sha256 of a checkpoint file; None for a Hugging Face model directory."""
    return sha256_file(path) if os.path.isfile(path) else None


# ----------------------------------------------------------------------------- items

def make_items(n_prompts, arms, seed):
    """[{'id', 'prompt', 'A', 'B'}] (arm names): every pair of arms for every prompt, sides
    balanced per pair, the whole list shuffled (see the module doc)."""
    rng = np.random.default_rng([seed, 1])
    items = []
    for x, y in itertools.combinations(arms, 2):
        first = np.array([True, False] * (n_prompts // 2) + [bool(rng.integers(2))] * (n_prompts % 2))
        rng.shuffle(first)
        for p in range(n_prompts):
            a, b = (x, y) if first[p] else (y, x)
            items.append({"prompt": p, "A": a, "B": b})
    order = rng.permutation(len(items))
    width = max(3, len(str(len(items))))
    return [{"id": f"i{k + 1:0{width}d}", **items[j]} for k, j in enumerate(order)]


def page_id_of(items, prompts, texts, seed):
    """16 hex digits naming the page's content (texts, sides, seed)."""
    blob = json.dumps({"seed": seed, "items": [[it["id"], prompts[it["prompt"]], texts[it["A"]][it["prompt"]],
                                                texts[it["B"]][it["prompt"]]] for it in items]},
                      ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def make_key(page_id, items, arms_info, settings):
    """The unblinding key (written beside the page, never into it)."""
    return {"format": KEY_FORMAT, "version": VERSION, "page_id": page_id,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            **settings, "arms": arms_info,
            "items": [{"id": it["id"], "prompt": it["prompt"], "A": it["A"], "B": it["B"]} for it in items]}


# ----------------------------------------------------------------------------- page

def prompt_tail(prompt, width=50):
    """The end of the prompt's last line, shown greyed before each continuation so that a word cut
    by the prompt's end reads whole ('' when the prompt ends a line)."""
    tail = prompt.rsplit("\n", 1)[-1]
    return tail if len(tail) <= width else "\u2026" + tail[-width:]


def render_page(page_id, question, items, prompts, texts):
    """The rating page: one self-contained HTML string (inline CSS and JS, nothing fetched).
    Holds the texts and sides only: no arm names, checkpoints or temperatures."""
    esc = html.escape
    n = len(items)
    sections = []
    for it in items:
        p = it["prompt"]
        ctx = f'<span class="ctx">{esc(prompt_tail(prompts[p]))}</span>'
        sections.append(
            f'<section class="item" data-id="{it["id"]}">\n'
            f'<div class="prompt"><div class="tag">Prompt</div><pre>{esc(prompts[p])}</pre></div>\n'
            f'<div class="pair">\n'
            f'<div class="cont" data-side="A"><div class="tag">A</div><pre>{ctx}{esc(texts[it["A"]][p])}</pre></div>\n'
            f'<div class="cont" data-side="B"><div class="tag">B</div><pre>{ctx}{esc(texts[it["B"]][p])}</pre></div>\n'
            f'</div>\n</section>')
    meta = json.dumps({"page_id": page_id, "n_items": n, "format": RATINGS_FORMAT, "version": VERSION})
    return (PAGE_TEMPLATE.replace("@@QUESTION@@", esc(question)).replace("@@N@@", str(n))
            .replace("@@PAGE_ID@@", page_id).replace("@@META@@", meta.replace("<", "\\u003c"))
            .replace("@@ITEMS@@", "\n".join(sections)))


PAGE_TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Blind rating (@@N@@ items)</title>
<style>
body { font: 16px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; background: #f4f4f1; color: #222; }
.wrap { max-width: 1150px; margin: 0 auto; padding: 16px 20px 40px; }
h1 { font-size: 20px; margin: 0 0 4px; }
.question { margin: 0 0 12px; color: #444; }
.progress { height: 10px; background: #ddd; border-radius: 5px; overflow: hidden; }
#bar { height: 100%; width: 0; background: #3a7d44; transition: width .2s; }
#status { font-size: 14px; color: #555; margin: 6px 0 14px; }
.tag { font: bold 13px system-ui, sans-serif; color: #666; margin-bottom: 4px; letter-spacing: .05em; }
pre { white-space: pre-wrap; word-wrap: break-word; margin: 0; font: 16px/1.5 Georgia, "Times New Roman", serif; }
.prompt { background: #e9e9e4; border-radius: 6px; padding: 10px 14px; margin-bottom: 12px; }
.pair { display: grid; grid-template-columns: 1fr 1fr; gap: 14px; }
.cont { background: #fff; border: 2px solid #ddd; border-radius: 6px; padding: 10px 14px; }
.cont .tag { font-size: 16px; color: #234; }
.cont.chosen { border-color: #3a7d44; box-shadow: 0 0 0 2px #3a7d4433; }
.ctx { color: #999; }
.controls { display: flex; gap: 8px; flex-wrap: wrap; margin: 16px 0; }
button { font: 15px system-ui, sans-serif; padding: 8px 14px; border: 1px solid #aaa; border-radius: 6px;
         background: #fff; cursor: pointer; }
button.choice { font-weight: 600; }
button.selected { background: #3a7d44; border-color: #3a7d44; color: #fff; }
kbd { font: 12px ui-monospace, monospace; border: 1px solid #bbb; border-radius: 3px; padding: 0 4px;
      background: #f7f7f7; color: #333; }
#done { background: #fff; border-radius: 6px; padding: 16px; }
#warn { color: #a33; font-size: 14px; }
footer { border-top: 1px solid #ddd; padding-top: 12px; font-size: 14px; color: #555; }
@media (max-width: 700px) { .pair { grid-template-columns: 1fr; } }
</style>
</head>
<body>
<div class="wrap">
<h1>Blind rating: which continuation is better?</h1>
<p class="question">@@QUESTION@@</p>
<div class="progress"><div id="bar"></div></div>
<div id="status">@@N@@ items</div>
<noscript><p id="warn">JavaScript is off: the items are listed below, but ratings need JavaScript.</p></noscript>
<main id="items">
@@ITEMS@@
</main>
<section id="done" hidden><h2>Done</h2><p id="done-text"></p></section>
<div class="controls">
<button id="back" title="previous item">&larr; Back <kbd>Backspace</kbd></button>
<button class="choice" data-choice="A">A is better <kbd>a</kbd></button>
<button class="choice" data-choice="tie">Tie <kbd>t</kbd></button>
<button class="choice" data-choice="B">B is better <kbd>b</kbd></button>
<button id="next" title="next item without rating">Skip &rarr; <kbd>&rarr;</kbd></button>
</div>
<footer>
<button id="download">Download ratings</button>
<span id="saved"></span>
<p>Your ratings are kept in this browser (reloading loses nothing). When you are done, press
<b>Download ratings</b> and send the file to whoever gave you this page. Page id @@PAGE_ID@@.</p>
<p id="warn"></p>
</footer>
</div>
<script id="meta" type="application/json">@@META@@</script>
<script>
(function () {
  "use strict";
  var meta = JSON.parse(document.getElementById("meta").textContent);
  var storeKey = "human_eval:" + meta.page_id;
  var items = Array.prototype.slice.call(document.querySelectorAll("section.item"));
  var ids = items.map(function (s) { return s.getAttribute("data-id"); });
  var n = ids.length;
  var state = {pos: 0, ratings: {}};
  function warn(text) { document.getElementById("warn").textContent = text; }
  try {
    var saved = JSON.parse(window.localStorage.getItem(storeKey) || "null");
    if (saved && typeof saved.ratings === "object" && saved.ratings) { state = saved; }
  } catch (e) {
    warn("This browser does not keep the ratings (localStorage: " + e + "): do not reload; download before closing.");
  }
  function save() {
    try { window.localStorage.setItem(storeKey, JSON.stringify(state)); }
    catch (e) { warn("Could not save in this browser (" + e + "): download your ratings before closing."); }
  }
  function rated(id) { return Object.prototype.hasOwnProperty.call(state.ratings, id); }
  function nRated() { return ids.filter(rated).length; }
  function firstUnrated(from) {
    for (var k = 0; k < n; k++) { var j = (from + k) % n; if (!rated(ids[j])) { return j; } }
    return n;
  }
  function render() {
    var pos = Math.max(0, Math.min(state.pos, n));
    state.pos = pos;
    items.forEach(function (s, j) { s.hidden = j !== pos; });
    document.getElementById("done").hidden = pos < n;
    var id = ids[pos], choice = pos < n && rated(id) ? state.ratings[id].choice : null;
    Array.prototype.forEach.call(document.querySelectorAll("button.choice"), function (b) {
      b.disabled = pos >= n;
      b.classList.toggle("selected", b.getAttribute("data-choice") === choice);
    });
    if (pos < n) {
      Array.prototype.forEach.call(items[pos].querySelectorAll(".cont"), function (c) {
        c.classList.toggle("chosen", choice === c.getAttribute("data-side") || choice === "tie");
      });
    }
    var k = nRated();
    document.getElementById("bar").style.width = (n ? 100 * k / n : 100) + "%";
    document.getElementById("status").textContent = k + " of " + n + " rated" +
      (pos < n ? " \\u00b7 item " + (pos + 1) + " of " + n : "");
    document.getElementById("done-text").textContent = k === n
      ? "All " + n + " items are rated. Press Download ratings below."
      : (n - k) + " of " + n + " items are not rated yet: press Back, or Download ratings to send what you have.";
    document.getElementById("saved").textContent = k ? k + " rating(s) kept in this browser" : "";
  }
  function choose(c) {
    if (state.pos >= n) { return; }
    state.ratings[ids[state.pos]] = {choice: c, time: new Date().toISOString()};
    state.pos = firstUnrated(state.pos + 1);
    save(); render();
  }
  function move(d) { state.pos = Math.max(0, Math.min(n, state.pos + d)); save(); render(); }
  function ratingsJSON() {
    return JSON.stringify({format: meta.format, version: meta.version, page_id: meta.page_id, n_items: n,
      downloaded_at: new Date().toISOString(),
      ratings: ids.filter(rated).map(function (id) {
        return {item: id, choice: state.ratings[id].choice, time: state.ratings[id].time};
      })}, null, 1);
  }
  function download() {
    var url = URL.createObjectURL(new Blob([ratingsJSON()], {type: "application/json"}));
    var a = document.createElement("a");
    a.href = url; a.download = "ratings-" + meta.page_id + ".json";
    document.body.appendChild(a); a.click();
    setTimeout(function () { URL.revokeObjectURL(url); a.remove(); }, 2000);
  }
  Array.prototype.forEach.call(document.querySelectorAll("button.choice"), function (b) {
    b.addEventListener("click", function () { choose(b.getAttribute("data-choice")); });
  });
  document.getElementById("back").addEventListener("click", function () { move(-1); });
  document.getElementById("next").addEventListener("click", function () { move(1); });
  document.getElementById("download").addEventListener("click", download);
  document.addEventListener("keydown", function (e) {
    if (e.ctrlKey || e.metaKey || e.altKey) { return; }
    var k = e.key, map = {a: "A", A: "A", b: "B", B: "B", t: "tie", T: "tie"};
    if (map[k]) { choose(map[k]); }
    else if (k === "Backspace" || k === "ArrowLeft") { move(-1); }
    else if (k === "ArrowRight") { move(1); }
    else { return; }
    e.preventDefault();
  });
  render();
})();
</script>
</body>
</html>
"""


# ----------------------------------------------------------------------------- scoring

def wilson_interval(successes, n, z=Z95):
    """Wilson score interval of a proportion successes / n (successes may be fractional)."""
    if n <= 0:
        return None
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, center - half), min(1.0, center + half)


def read_json(path, flag, what):
    """A JSON object from `path`, with clear errors for missing, empty and non-JSON files."""
    if not os.path.exists(path):
        raise ProjectError(f"{flag} {path}: file not found", f"pass the {what}")
    if not os.path.isfile(path):
        raise ProjectError(f"{flag} {path} is not a regular file", f"pass the {what}")
    with open(path, "rb") as f:
        raw = f.read()
    if not raw.strip():
        raise ProjectError(f"{flag} {path} is empty", f"pass the {what}")
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProjectError(f"{flag} {path} is not JSON ({e})", f"pass the {what}") from None
    if not isinstance(obj, dict):
        raise ProjectError(f"{flag} {path} is JSON but not an object", f"pass the {what}")
    return obj


def check_key(key, path):
    """The fields score() needs, with a clear error if the file is not a key."""
    items = key.get("items")
    arms = key.get("arms")
    ok = (key.get("format") == KEY_FORMAT and isinstance(key.get("page_id"), str) and isinstance(items, list)
          and isinstance(arms, list) and all(isinstance(a, dict) and "name" in a for a in arms)
          and all(isinstance(it, dict) and {"id", "A", "B"} <= set(it) for it in items))
    if not ok:
        raise ProjectError(f"--key {path} is not a key written by human_eval.py make",
                           "pass the key.json that `human_eval.py make` wrote beside the page")
    names = {a["name"] for a in arms}
    bad = [it["id"] for it in items if it["A"] not in names or it["B"] not in names or it["A"] == it["B"]]
    if bad:
        raise ProjectError(f"--key {path}: item {bad[0]} names arms that are not in the key's arm list",
                           "the key was edited; use the one human_eval.py make wrote")


def check_ratings(ratings, path, key, key_path):
    """[(item id, choice)] of one ratings file, checked against the key."""
    if ratings.get("format") != RATINGS_FORMAT or not isinstance(ratings.get("ratings"), list):
        raise ProjectError(f"--ratings {path} is not a ratings file downloaded from a human_eval page",
                           "pass the file the page's Download ratings button saved")
    if ratings.get("page_id") != key["page_id"]:
        raise ProjectError(f"--ratings {path} was made on page {ratings.get('page_id')!r}, but --key {key_path} "
                           f"is the key of page {key['page_id']!r} (foreign ratings)",
                           "pass the key.json written beside the page the rater used")
    known = {it["id"] for it in key["items"]}
    if ratings.get("n_items") not in (None, len(known)):
        raise ProjectError(f"--ratings {path} comes from a page of {ratings.get('n_items')} items, but --key "
                           f"{key_path} lists {len(known)}: the key does not match the page's items",
                           "pass the key.json written beside that page")
    out, seen = [], set()
    for r in ratings["ratings"]:
        item, choice = (r.get("item"), r.get("choice")) if isinstance(r, dict) else (None, None)
        if item not in known:
            raise ProjectError(f"--ratings {path} rates item {item!r}, which --key {key_path} does not list: "
                               "the key does not match the page's items",
                               "pass the key.json written beside the page the rater used")
        if choice not in CHOICES:
            raise ProjectError(f"--ratings {path}: item {item} has the unknown choice {choice!r} "
                               f"(expected one of {', '.join(CHOICES)})",
                               "pass the file exactly as the page downloaded it")
        if item in seen:
            raise ProjectError(f"--ratings {path} rates item {item} twice", "pass the file as the page downloaded it")
        seen.add(item)
        out.append((item, choice))
    if not out:
        raise ProjectError(f"--ratings {path} holds no ratings", "rate at least one item, then download again")
    return out


def score(key, rated, n_files=1):
    """Per pair of arms (in the key's arm order): counts, win rate of the first arm (ties
    half), its 95% Wilson interval; plus how often A, B and tie were chosen."""
    names = [a["name"] for a in key["arms"]]
    by_id = {it["id"]: it for it in key["items"]}
    counts = {pair: [0, 0, 0] for pair in itertools.combinations(names, 2)}  # wins, losses, ties
    sides = dict.fromkeys(CHOICES, 0)
    for item, choice in rated:
        it = by_id[item]
        sides[choice] += 1
        x, y = sorted((it["A"], it["B"]), key=names.index)
        c = counts[(x, y)]
        if choice == "tie":
            c[2] += 1
        else:
            c[0 if it[choice] == x else 1] += 1
    rows = []
    for (x, y), (w, l, t) in counts.items():
        n = w + l + t
        ci = wilson_interval(w + t / 2, n)
        rows.append({"first": x, "second": y, "n": n, "wins": w, "losses": l, "ties": t,
                     "win_rate": (w + t / 2) / n if n else None, "ci95": list(ci) if ci else None})
    return {"page_id": key["page_id"], "ratings": len(rated), "items": len(key["items"]), "files": n_files,
            "pairs": rows,
            "sides": sides, "ties_count_half": True, "interval": "Wilson score, 95%"}


def format_table(result):
    """The score as a plain-text table."""
    lines = [f"{'pair (first vs second)':<32} {'n':>4} {'wins':>5} {'losses':>6} {'ties':>5} "
             f"{'win rate':>8}  95% Wilson"]
    for r in result["pairs"]:
        pair = f"{r['first']} vs {r['second']}"
        rate = f"{r['win_rate']:.3f}" if r["n"] else "-"
        ci = f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]" if r["n"] else "-"
        lines.append(f"{pair:<32} {r['n']:>4} {r['wins']:>5} {r['losses']:>6} {r['ties']:>5} {rate:>8}  {ci}")
    s, k = result["sides"], result["ratings"]
    lines.append(f"win rate = (wins + ties/2) / n of the first arm: a tie counts as half a win for each side; "
                 f"{k} ratings of {result['items']} items from {result['files']} file(s)")
    lines.append(f"sides chosen: A {s['A']}, B {s['B']}, tie {s['tie']} (arms are on random sides, so a strong "
                 "lean to A or B is a rater habit, not a model difference)")
    return "\n".join(lines)
