import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """The slow tests first, so that a run under xdist ends on short tests: with --dist worksteal
    (pytest.ini) an idle worker takes half of the other's queue, but not the test it is running. Tests
    marked cuda skip, and say why, where no GPU is visible."""
    items.sort(key=lambda item: "slow" not in item.keywords)  # stable: each tier in collection order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marked cuda)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models: a second OpenMP thread only spins, badly so on a busy 2-core machine.
    (Tests that check thread-count invariance set the count themselves.)"""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def cpu_unless_marked_cuda(request, monkeypatch):
    """A test not marked cuda runs on CPU also where a GPU is visible (the GPU check runs the whole suite
    there): one that resolves --device auto in-process, which would take the GPU (bf16, a compiled decoder)
    under thresholds set for CPU, fails on any machine and names the fix."""
    if "cuda" in request.keywords:
        yield
        return
    real, auto = torch.cuda.is_available, []

    def is_available():
        if sys._getframe(1).f_code.co_name in ("resolve_device", "init_distributed"):  # their 'auto' branches
            auto.append(sys._getframe(1).f_code.co_name)
        return real()

    monkeypatch.setattr(torch.cuda, "is_available", is_available)
    yield
    if auto:
        pytest.fail(f"this test resolved --device auto ({auto[0]}), which a visible GPU would answer: pass "
                    "--device cpu (or mark the test cuda)", pytrace=False)


@pytest.fixture(autouse=True)
def backend_flags():
    """An entry point's main sets process-wide backend flags (train.py turns TF32 on for CUDA); tests call
    mains in-process, so each test gets the flags back as they were, and a later float32 test in the
    same worker does not run in TF32 because of the order the tests ran in."""
    from helpers import backend_flags_kept
    with backend_flags_kept():
        yield


TOOL_CACHES = {"__pycache__", ".pytest_cache", ".benchmarks", ".hypothesis"}


@pytest.fixture(autouse=True)
def checkout_stays_clean():
    """Tests write under tmp_path: one that leaves a new file or directory in the repository's root
    (a run directory named by a relative path, say) fails, instead of littering every clone's tree."""
    before = set(os.listdir(ROOT))
    yield
    new = sorted(set(os.listdir(ROOT)) - before - TOOL_CACHES)
    if new:
        pytest.fail(f"a test wrote {', '.join(new)} into the checkout ({ROOT}); write under tmp_path "
                    "(with -n, the test may be one running beside this one)", pytrace=False)


@pytest.fixture(scope="session")
def tiny_char_ckpt(tmp_path_factory):
    """Built once per session, READ ONLY: the default char corpus of helpers.prepare_char_data
    (make_split_text) and a tiny GPT (helpers.TINY, block_size 32) trained 40 steps on it, saved
    like train.py saves. A test that modifies or corrupts any of these files copies them first.
    Returns dict(text=input.txt, data_dir, meta=meta.pkl, ckpt)."""
    from helpers import prepare_char_data, train_tiny_checkpoint
    root = tmp_path_factory.mktemp("tiny_char_ckpt")
    text, data_dir = prepare_char_data(str(root / "corpus"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ckpt = train_tiny_checkpoint(data_dir, str(root / "ckpt.pt"), steps=40, block_size=32)
    finally:
        torch.set_num_threads(threads)
    return {"text": text, "data_dir": data_dir, "meta": os.path.join(data_dir, "meta.pkl"), "ckpt": ckpt}
