"""
The restructuring rules, checked mechanically (ast only, plus one subprocess; a couple of seconds):

  1. no function is longer than MAX_LINES lines, argparse builders included (a parser is built a group at a time);
  2. no script imports another script: shared code lives in library modules;
  3. `import model` loads neither checkpoint nor hf_interop, and `import hf_interop` does not
     load checkpoint (the model stays usable without the checkpoint and HF layers);
  4. the layers: the root holds at most MAX_ROOT_FILES .py files (the scripts a user runs, the design
     card's library modules and configurator.py); libraries never import scripts; the core (the
     root's modules, core/ and the scripts of the method itself) never imports experiment/, the
     wing of run_cycles.py;
  5. the project's own modules are imported at the top of a file, never inside a function (optional
     third-party packages may be: transformers, datasets, wandb, MAUVE, TensorBoard);
  6. run_cycles.py has at most MAX_RUN_CYCLES_LINES lines;
  7. the floors: counting a package (core/, lib/, experiment/, bench/, docs/, data/) as one room and every
     other root file as a room, no two rooms import each other both ways and no imports run in a circle;
     model.py imports nothing from engine.py (the engine wraps the model, as nanochat's does), and no
     private name crosses a module boundary;
  8. no library module is over MAX_LIBRARY_LINES lines.

A script is a file run from a shell: one with an `if __name__ == "__main__":` block, or a
flat benchmark bench/bench_*.py. reward_dataset_loader.py is a library with a small
inspection CLI, so importing it is allowed. Tests may import scripts; they are not checked.
"""
import ast
import glob
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 80
MAX_RUN_CYCLES_LINES = 360  # (588 before its flags moved to experiment/cli.py)
MAX_ROOT_FILES = 23  # (+ serve_reward.py and train_distill.py: scripts a user runs)
MAX_LIBRARY_LINES = 500
PACKAGES = ("core", "lib", "experiment", "bench", "docs", "data")  # each one room of the floors
# the scripts of the experiment (run_cycles.py and what it measures with): they may import experiment/
EXPERIMENT_SCRIPTS = {"run_cycles.py", "human_eval.py", "measure_residual.py", "aa_test.py", "compare.py",
                      "docs/results.py"}
LIBRARIES_WITH_CLI = {"reward_dataset_loader.py"}
# scripts that must be found (guards the detection itself against silently finding nothing)
KNOWN_SCRIPTS = {"train.py", "sample.py", "evaluate.py", "export_hf.py", "prepare_data.py", "prepare_reward_data.py",
                 "train_reward_model.py", "train_grpo.py", "train_spin.py", "run_cycles.py", "human_eval.py", "compare.py",
                 "data/shakespeare/prepare.py", "data/shakespeare_char/prepare.py", "docs/gen_flags.py",
                 "bench/bench_detector.py", "bench/bench_generate.py", "bench/bench_prepare_data.py",
                 "bench/bench_reward_data.py", "bench/bench_train.py"}


def source_files():
    """Repository-relative paths of the project's Python files (tests excluded)."""
    pats = ("*.py", "core/*.py", "lib/*.py", "experiment/*.py", "bench/*.py", "data/*.py", "data/*/*.py", "docs/*.py")
    return sorted(os.path.relpath(p, ROOT) for pat in pats for p in glob.glob(os.path.join(ROOT, pat)))


def parse(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return ast.parse(f.read(), filename=rel)


def has_main_block(tree):
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            names = [n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)]
            consts = [n.value for n in ast.walk(node.test) if isinstance(n, ast.Constant)]
            if "__name__" in names and "__main__" in consts:
                return True
    return False


TREES = {rel: parse(rel) for rel in source_files()}
SCRIPTS = sorted(rel for rel, tree in TREES.items()
                 if rel not in LIBRARIES_WITH_CLI
                 and (has_main_block(tree) or (rel.startswith("bench/") and os.path.basename(rel).startswith("bench_"))))


def module_names(rel):
    """The names a script can be imported under: its stem (its directory on sys.path) and its
    dotted path from the repository root."""
    stem = rel[:-3]
    return {os.path.basename(stem), stem.replace("/", ".")}


def imported_modules(tree):
    """Every module an ast imports, at any depth (function-level imports included), plus
    importlib.import_module / __import__ calls with a literal name."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)  # from data.x import prepare
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                out.add(node.args[0].value)
    return out


def test_run_cycles_reads_on_a_few_screens():
    """run_cycles.py stays the experiment's outline (flags, cycle 0, the cycle loop, the report); the
    steps, arms, presets and report live in experiment/."""
    with open(os.path.join(ROOT, "run_cycles.py"), encoding="utf-8") as f:
        n = len(f.read().splitlines())
    assert n <= MAX_RUN_CYCLES_LINES, f"run_cycles.py has {n} lines (at most {MAX_RUN_CYCLES_LINES})"


def test_script_detection_finds_the_known_scripts():
    assert KNOWN_SCRIPTS <= set(SCRIPTS), sorted(KNOWN_SCRIPTS - set(SCRIPTS))


def test_no_function_over_80_lines():
    long = []
    for rel, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_LINES:
                    long.append(f"{rel}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "functions over %d lines (split them into named helpers):\n%s" % (MAX_LINES, "\n".join(long))


def test_no_script_imports_another_script():
    script_modules = {name: rel for rel in SCRIPTS for name in module_names(rel)}
    bad = []
    for rel in SCRIPTS:
        own = module_names(rel)
        for mod in sorted(imported_modules(TREES[rel])):
            if mod in script_modules and mod not in own:
                bad.append(f"{rel} imports {mod} (the script {script_modules[mod]})")
    assert not bad, "move the shared code into a library module:\n" + "\n".join(bad)


def test_model_and_hf_interop_do_not_load_the_layers_above_them():
    code = ("import sys\n"
            "import model\n"
            "print(sorted(m for m in ('lib.checkpoint', 'lib.hf_interop') if m in sys.modules))\n"
            "import lib.hf_interop\n"
            "print(sorted(m for m in ('lib.checkpoint',) if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    after_model, after_hf = r.stdout.split("\n")[:2]
    assert after_model == "[]", f"import model loaded {after_model}"
    assert after_hf == "[]", f"import hf_interop loaded {after_hf}"


def test_the_root_holds_the_scripts_and_the_cards_modules_only():
    root = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "*.py")))
    assert len(root) <= MAX_ROOT_FILES, root
    libraries = [rel for rel in TREES if "/" not in rel and rel not in SCRIPTS]
    # engine.py: the decode engine beside model.py, as nanochat keeps engine.py beside gpt.py
    assert set(libraries) <= {"model.py", "engine.py", "tokenization_manager.py", "data_loader.py",
                              "reward_data_config.py", "reward_dataset_loader.py", "configurator.py"}, libraries


def test_model_py_reads_like_nanogpts():
    """model.py holds the dual-mode GPT, its config and generate's entry point in 500 lines at most (issue 33:
    it had grown to 1,031 with the decode engine and the fused log-probs, which live in engine.py and
    core/logprobs.py now)."""
    with open(os.path.join(ROOT, "model.py"), encoding="utf-8") as f:
        lines = len(f.read().splitlines())
    assert lines <= 500, f"model.py has {lines} lines: move what is not the GPT itself beside it (engine.py, core/)"


def test_libraries_never_import_scripts_and_the_core_never_imports_the_experiment():
    script_modules = {name: rel for rel in SCRIPTS for name in module_names(rel)}
    bad = []
    for rel, tree in TREES.items():
        mods = imported_modules(tree)
        if rel not in SCRIPTS:
            bad += [f"{rel} (a library) imports the script {script_modules[m]}" for m in sorted(mods)
                    if m in script_modules]
        if not rel.startswith(("experiment/", "bench/")) and rel not in EXPERIMENT_SCRIPTS:
            bad += [f"{rel} (the core) imports {m} (the experiment's wing)" for m in sorted(mods)
                    if m == "experiment" or m.startswith("experiment.")]
    assert not bad, "\n".join(bad)


def project_modules():
    """Every name the project's own modules are imported under."""
    names = {"core", "lib", "experiment"}
    for rel in TREES:
        names |= module_names(rel)
    return names


def test_project_imports_sit_at_the_top_of_each_file():
    own = project_modules()
    inner = []
    for rel, tree in TREES.items():
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(fn):
                mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                        [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
                inner += [f"{rel}:{node.lineno} ({fn.name}) imports {m}" for m in mods
                          if m in own or m.split(".")[0] in ("core", "lib", "experiment")]
    assert not inner, "move these imports to the top of the file:\n" + "\n".join(sorted(set(inner)))


def room(rel):
    """A file's room: its package (the first folder), or the root file itself."""
    top = rel.split("/")[0]
    return top if top in PACKAGES else rel[:-3]


def room_imports():
    """{room: the other rooms it imports} over every source file (function-level imports included; bench/'s
    scripts import bench/common_hf.py as a top-level module)."""
    rooms = {room(rel) for rel in TREES}
    edges = {r: set() for r in rooms}
    for rel, tree in TREES.items():
        for mod in imported_modules(tree):
            top = mod.split(".")[0]
            to = top if top in rooms else "bench" if rel.startswith("bench/") and f"bench/{top}.py" in TREES else None
            if to is not None and to != room(rel):
                edges[room(rel)].add(to)
    return edges


def circles(edges):
    """The strongly connected groups of more than one room (Tarjan's algorithm)."""
    index, low, stack, out = {}, {}, [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                out.append(sorted(group))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_floors_import_one_way_with_no_circle():
    edges = room_imports()
    assert {"core", "lib", "experiment", "model", "engine"} <= set(edges), sorted(edges)
    both = sorted({tuple(sorted((a, b))) for a in edges for b in edges[a] if a in edges[b]})
    assert not both, f"rooms that import each other both ways: {both}"
    assert not circles(edges), f"imports in a circle: {circles(edges)}"
    assert edges["core"] == set(), f"core/ is the ground floor: it imports {sorted(edges['core'])}"


def test_the_floor_rules_see_a_circle():
    """The check itself: a circle through three rooms, and two rooms that import each other."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_model_imports_nothing_from_the_engine():
    """The engine wraps the model (it reads model.hidden_states, new_kv_cache and the head); the model knows
    no engine."""
    assert not {m for m in imported_modules(TREES["model.py"]) if m.split(".")[0] == "engine"}


def test_nothing_private_crosses_a_module_boundary():
    """No source file imports a project module's _private name, or reads one off a project module it imported
    (engine imported core.logprobs._head_logits; frontier called plots._save)."""
    own, bad = project_modules(), []
    for rel, tree in TREES.items():
        modules = set()  # the local names of project modules imported whole
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                if node.module.split(".")[0] in own or node.module in own:
                    bad += [f"{rel}: from {node.module} import {a.name}" for a in node.names if a.name.startswith("_")]
                    modules |= {a.asname or a.name for a in node.names if f"{node.module}.{a.name}" in own
                                or node.module in ("core", "lib", "experiment")}
            elif isinstance(node, ast.Import):
                modules |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name in own}
        bad += [f"{rel}:{node.lineno} {node.value.id}.{node.attr}" for node in ast.walk(tree)
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")]
    assert not bad, "private names used across modules:\n" + "\n".join(bad)


def test_no_library_module_is_over_500_lines():
    long = {}
    for rel in TREES:
        if rel in SCRIPTS or rel.startswith(("bench/", "docs/")) or rel == "run_cycles.py":
            continue
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            n = len(f.read().splitlines())
        if n > MAX_LIBRARY_LINES:
            long[rel] = n
    assert not long, f"library modules over {MAX_LIBRARY_LINES} lines (split them by role): {long}"


def token_file_reads(tree):
    """The lines of a tree that read a flat uint16 token file themselves: a memmap without a shape (the
    reward dataset's and the feature cache's have one), or np.fromfile / np.frombuffer of uint16."""
    def uint16(call):
        return any(k.arg == "dtype" and (getattr(k.value, "attr", None) == "uint16" or
                                         getattr(k.value, "id", None) == "uint16") for k in call.keywords)
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and ((node.func.attr == "memmap" and not any(k.arg == "shape" for k in node.keywords))
                 or (node.func.attr in ("fromfile", "frombuffer") and uint16(node)))]


def test_token_files_have_one_opener():
    """A uint16 token file (train.bin, val.bin) is opened by lib.corpus.open_tokens alone (8 places called
    np.memmap on one; train.py's batches and data_loader's binary mode go through lib/corpus too): nothing
    else reads one with np.memmap, np.fromfile or np.frombuffer."""
    found = [f"{rel}:{line}" for rel, tree in TREES.items() for line in token_file_reads(tree)]
    assert len(found) == 1 and found[0].startswith("lib/corpus.py:"), found


MAX_REQUIRED_PARAMS = 6


def required_params(fn):
    """The parameters a call of fn must pass (self and cls not counted; keyword-only ones without a default too)."""
    a = fn.args
    pos = a.posonlyargs + a.args
    n = len(pos) - len(a.defaults) + sum(d is None for d in a.kw_defaults)
    return n - bool(pos and pos[0].arg in ("self", "cls"))


def is_kernel(rel, fn):
    """A kernel whose arguments are tensors (the fused log-prob's backward, the compiled decode step) may take more,
    with the line above it saying why: `# kernel: ...`."""
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        lines = f.read().splitlines()
    first = min([fn.lineno] + [d.lineno for d in fn.decorator_list])  # the comment above it or its decorators
    return any(line.strip().startswith("# kernel:") for line in lines[first - 2:fn.lineno - 1])


def test_no_function_takes_more_than_6_required_parameters_outside_the_named_kernels():
    """A trainer's loop keeps its changing state in one object and reads its set-up from one read-only context:
    nothing takes ten parameters (38 functions did)."""
    over = [f"{rel}:{fn.lineno} {fn.name} ({required_params(fn)})" for rel, tree in TREES.items()
            for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            and required_params(fn) > MAX_REQUIRED_PARAMS and not is_kernel(rel, fn)]
    assert not over, f"functions with more than {MAX_REQUIRED_PARAMS} required parameters: {over}"


def test_the_parameter_rule_counts_what_a_call_must_pass():
    fn = ast.parse("def f(self, a, b, c=1, *, d, e=2): pass").body[0]
    assert required_params(fn) == 3  # a, b, d
    fn = ast.parse("def g(a, b, c, d, e, f, g): pass").body[0]
    assert required_params(fn) == 7


def test_the_token_file_rule_sees_every_kind_of_read():
    src = ("np.memmap(p, dtype=np.uint16, mode='r')\nnp.memmap(p, dtype=np.uint16, shape=(2, 3))\n"
           "np.fromfile(p, dtype=np.uint16)\nnp.frombuffer(b, dtype=np.uint8)\nnp.frombuffer(b, dtype=uint16)\n")
    assert token_file_reads(ast.parse(src)) == [1, 3, 5]
