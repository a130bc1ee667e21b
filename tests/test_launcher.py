"""The warm launcher (experiment/launcher.py): a step forked from it starts as a fresh `python script.py`
would, ends as one would, and trains the same bits; it dies with its runner, and a runner whose launcher died
goes on with fresh processes."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from core.errors import ProjectError
from experiment.runner import StepRunner
from helpers import make_text, prepare_char_data, tiny_train_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.slow,  # a launcher process (torch imported in it), or run_cycles in-process
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="steps are forked on Linux only")]

FACTS = """import json, os, sys, torch
print("on stderr", file=sys.stderr)
facts = {"argv": sys.argv, "cwd": os.getcwd(), "name": __name__, "path0": sys.path[0], "file": __file__,
         "env": os.environ.get("MY_VAR"), "threads": torch.get_num_threads(), "leader": os.getsid(0) == os.getpid(),
         "unbuffered": os.environ.get("PYTHONUNBUFFERED")}
print("FACTS " + json.dumps(facts), flush=True)
exit_as = sys.argv[1]
if exit_as == "raise":
    raise ValueError("boom")
if exit_as == "text":
    sys.exit("a message")
sys.exit(int(exit_as))
"""


def facts(log):
    lines = [line for line in log.read_text().splitlines() if line.startswith("FACTS ")]
    return [json.loads(line[len("FACTS "):]) for line in lines]


@pytest.mark.parametrize("threads", ["1", "2"])
def test_a_forked_step_starts_and_ends_as_a_fresh_python_would(tmp_path, monkeypatch, threads):
    """argv, __name__, __file__, sys.path[0], working directory, environment (its own, not the launcher's),
    torch threads (its OMP_NUM_THREADS, which torch read in the launcher at import), a session of its own,
    stderr on the same pipe, exit statuses (sys.exit's int and text, an exception's 1): the same facts forked
    as fresh."""
    script = tmp_path / "facts.py"
    script.write_text(FACTS)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the launcher's torch: the machine's default threads
    seen = {}
    for warm in (False, True):
        log = tmp_path / f"{warm}.log"
        runner = StepRunner(str(log), warm=warm)
        env = {"MY_VAR": "mine", "OMP_NUM_THREADS": threads}
        assert runner.run_together([("ok", [str(script), "0"])], env=env)[0] > 0
        for exit_as, rc in (("3", 3), ("raise", 1), ("text", 1)):
            with pytest.raises(ProjectError, match=rf"step 's' failed \(exit {rc}\)"):
                runner.run_together([("s", [str(script), exit_as])], env=env)
        runner.close()
        text = log.read_text()
        assert text.count("on stderr") == 4 and "ValueError: boom" in text and "\na message\n" in text
        seen[warm] = facts(log)
    assert len(seen[True]) == 4 and seen[True] == seen[False]
    first = seen[True][0]
    assert first["argv"] == [str(script), "0"] and first["cwd"] == str(here) and first["name"] == "__main__"
    assert first["path0"] == str(tmp_path) and first["env"] == "mine" and first["threads"] == int(threads)
    assert first["leader"] and first["unbuffered"] == "1"


PLOT = """import sys
warm = all(m in sys.modules for m in ("matplotlib.pyplot", "torch.utils.tensorboard"))
from core.plots import plot_loss_curves, pyplot
plot_loss_curves([{"step": i, "train_loss": 1 / (i + 1)} for i in range(20)], sys.argv[1])
print("PLOT " + str(warm) + " " + pyplot().get_backend().lower(), flush=True)
"""


def test_a_forked_step_finds_pyplot_imported_and_plots_the_same_bytes(tmp_path, monkeypatch):
    """Most steps plot at their end, and write TensorBoard events: the launcher imports pyplot (Agg) and
    tensorboard's writer once, about 1.6 s a step saved, and a forked step's figure is byte for byte a fresh one's."""
    script = tmp_path / "plot.py"
    script.write_text(PLOT)
    monkeypatch.setenv("PYTHONPATH", ROOT)
    seen = {}
    for warm in (False, True):
        runner = StepRunner(str(tmp_path / f"{warm}.log"), warm=warm)
        runner.run_together([("plot", [str(script), str(tmp_path / f"{warm}.png")])])
        runner.close()
        seen[warm] = [line for line in (tmp_path / f"{warm}.log").read_text().splitlines() if line.startswith("PLOT")]
    assert seen == {False: ["PLOT False agg"], True: ["PLOT True agg"]}
    assert (tmp_path / "True.png").read_bytes() == (tmp_path / "False.png").read_bytes()


def test_a_forked_train_step_writes_the_same_bits_as_a_fresh_one(tmp_path):
    """train.py forked from the launcher (torch, dynamo, the optimizer's state from the launcher's imports)
    trains the same model, bit for bit, as a fresh process."""
    _, data_dir = prepare_char_data(str(tmp_path / "corpus"), text=make_text(3000, seed=1))
    cfg = tmp_path / "tiny.py"
    cfg.write_text(tiny_train_config(max_iters=12, eval_interval=6, log_interval=6))
    models = []
    for warm in (False, True):
        out = tmp_path / f"out_{warm}"
        runner = StepRunner(str(tmp_path / "steps.log"), warm=warm)
        runner.run("train", ["train.py", str(cfg), f"--data_dir={data_dir}", f"--out_dir={out}", "--device=cpu"],
                   parallel=False)
        runner.close()
        models.append(torch.load(out / "ckpt.pt", weights_only=True)["model"])
    assert models[0].keys() == models[1].keys()
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0])


def test_a_forked_step_past_its_limit_ends_with_its_process_group(tmp_path):
    """The runner's limit reaches a forked step's whole process group (a process it started too), as it
    reaches a fresh one's; the runner then goes on."""
    script = tmp_path / "sleep.py"
    script.write_text("import os, subprocess, sys, time\n"
                      "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                      "open(os.path.join(os.path.dirname(__file__), 'child'), 'w').write(str(child.pid))\n"
                      "print('up', flush=True)\ntime.sleep(60)\n")
    (tmp_path / "quick.py").write_text("print('quick')\n")
    runner = StepRunner(str(tmp_path / "steps.log"), stop_grace=2.0, warm=True)
    runner.run("warm up", [str(tmp_path / "quick.py")])  # the launcher's imports are not the step's limit
    t0 = time.time()
    with pytest.raises(ProjectError, match="'s' was stopped after its limit of 3 s"):
        runner.run("s", [str(script)], timeout=3.0)
    assert time.time() - t0 < 30 and "up" in (tmp_path / "steps.log").read_text()
    assert not alive(int((tmp_path / "child").read_text()))
    assert runner.run("quick", [str(tmp_path / "quick.py")], timeout=30) < 30
    runner.close()


KEEPER = """import os, sys, time
from experiment.runner import StepRunner
runner = StepRunner(sys.argv[1], warm=True)
runner.run("quick", [sys.argv[2], "quick"])  # the launcher is up
runner.run("sleeper", [sys.argv[2], "sleep"])
"""
STEP = """import os, sys, time
if sys.argv[1] == "sleep":
    open(os.path.join(os.path.dirname(__file__), "pids"), "w").write(f"{os.getpid()} {os.getppid()}")
    time.sleep(120)
"""


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_kill_9_of_the_runner_ends_the_launcher_and_its_step(tmp_path):
    (tmp_path / "keeper.py").write_text(KEEPER)
    (tmp_path / "step.py").write_text(STEP)
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.Popen([sys.executable, str(tmp_path / "keeper.py"), str(tmp_path / "log"), str(tmp_path / "step.py")],
                         env=env, stdout=subprocess.DEVNULL)
    try:
        t0 = time.time()
        while not (tmp_path / "pids").exists() or not (tmp_path / "pids").read_text():
            assert p.poll() is None and time.time() - t0 < 120
            time.sleep(0.05)
        step, launcher = map(int, (tmp_path / "pids").read_text().split())
        assert launcher != p.pid and alive(launcher)  # a step of the launcher's, not of the runner's
        p.kill()
        p.wait()
        t0 = time.time()
        while (alive(step) or alive(launcher)) and time.time() - t0 < 10:
            time.sleep(0.05)
        assert not alive(step) and not alive(launcher)
    finally:
        p.kill()


def test_a_runner_whose_launcher_died_fails_the_step_and_goes_on_fresh(tmp_path, capsys):
    """kill -9 of the launcher while its step runs: the step dies with it and fails as killed (no hang), and
    the next step starts as a fresh process, with a note."""
    (tmp_path / "step.py").write_text(STEP)
    runner = StepRunner(str(tmp_path / "steps.log"), warm=True)
    runner.run("quick", [str(tmp_path / "step.py"), "quick"])
    launcher = runner.launcher.proc.pid
    killer = subprocess.Popen([sys.executable, "-c", (
        f"import os, time\nwhile not os.path.exists({str(tmp_path / 'pids')!r}): time.sleep(0.05)\n"
        f"time.sleep(0.2); os.kill({launcher}, 9)")])
    with pytest.raises(ProjectError, match=rf"step 'sleeper' failed \(exit -{signal.SIGKILL.value}\)"):
        runner.run("sleeper", [str(tmp_path / "step.py"), "sleep"], timeout=60)
    killer.wait()
    step = int((tmp_path / "pids").read_text().split()[0])
    t0 = time.time()
    while alive(step) and time.time() - t0 < 10:
        time.sleep(0.05)
    assert not alive(step)
    assert runner.run("after", [str(tmp_path / "step.py"), "quick"]) > 0
    assert "note: the warm launcher has ended; steps start as fresh processes" in capsys.readouterr().out
    assert runner.launcher is None and not runner.warm


@pytest.mark.parametrize("flags, warm", [([], True), (["--cold_steps"], False)])
def test_run_cycles_forks_its_steps_on_a_cpu_unless_cold_steps(tmp_path, monkeypatch, flags, warm):
    """run_cycles' StepRunner is warm for a CPU run by default, fresh under --cold_steps (as a GPU run's is)."""
    import run_cycles
    made = []

    class Recorder(StepRunner):
        def __init__(self, *args, **kwargs):
            made.append(kwargs.get("warm"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(run_cycles, "StepRunner", Recorder)
    with pytest.raises(ProjectError, match="has no train.bin"):  # fails after making its runner
        run_cycles.main(["--out_dir", str(tmp_path / "run"), "--data_dir", str(tmp_path / "no_data"),
                         "--device", "cpu", *flags])
    assert made == [warm]


TWO_STREAMS = """import os, sys
print("out line\\r\\nsecond", flush=True)
print("err line", os.getcwd(), os.environ.get("MINE"), file=sys.stderr, flush=True)
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.parametrize("code", [0, 3])
def test_a_forked_command_gives_what_subprocess_run_gives(tmp_path, code):
    """The tests' run_script (helpers.py): a script forked from a warm launcher, its stderr on a pipe of its own
    (Launcher.spawn(stderr=True)), returns what subprocess.run(capture_output=True, text=True) returns for the
    same command: exit status, stdout and stderr apart, newlines as text=True reads them, cwd and environment."""
    from helpers import run_script
    script = tmp_path / "two.py"
    script.write_text(TWO_STREAMS)
    env = {**os.environ, "MINE": "mine"}
    warm = run_script([script, str(code)], cwd=tmp_path, env=env)
    fresh = subprocess.run([sys.executable, str(script), str(code)], cwd=tmp_path, env=env, capture_output=True,
                           text=True)
    assert (warm.returncode, warm.stdout, warm.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert warm.returncode == code and warm.stdout == "out line\nsecond\n" and "mine" in warm.stderr
