"""
nanoGPT's command line without nanoGPT's exec: config files and `--key=value` overrides.

    python train.py config/train_shakespeare_char.py --max_iters=10 --compile=False

nanoGPT's configurator.py runs each config file with exec(). Here a config file is parsed
with `ast` and only READ, never executed, so a config file cannot run code. What nanoGPT's
own config files contain still loads:

- `name = value` assignments, where value is a constant (number, string, True/False/None),
  a tuple or list of them, or arithmetic on them (`5 * 8`, `'ft-' + name`, `-1e-4`), and may
  use names set earlier (in the file, an earlier config file, or the script's defaults);
- `import` lines, which are skipped (nothing is imported);
- comments and docstrings.

A value that would need code to run (a call such as `str(time.time())`, an attribute) is an
error that names the line, except on a setting the script ignores anyway, where it is
skipped with the setting's one-line warning. Config values become defaults; flags given on
the command line override them; of several config files, the later one wins.
"""
import argparse
import ast
import difflib
import operator
import os
import sys

from core.cli import str2bool
from core.errors import ProjectError


class DatasetAction(argparse.Action):
    """nanoGPT's `dataset`: --dataset NAME means --data_dir data/NAME (relative to the current
    directory, as in nanoGPT). Both set the same thing, so the later of the two wins."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, "data_dir", os.path.join("data", values))


def add_config_arguments(parser):
    """Config files: nanoGPT's positional form, and --config."""
    parser.add_argument("config_files", nargs="*", metavar="CONFIG",
                        help="config files, as in nanoGPT (e.g. config/train_shakespeare_char.py): `name = value` "
                             "lines, read and never executed; their values become defaults, flags override them, "
                             "a later file overrides an earlier one")
    parser.add_argument("--config", default=None, help="a config file, read before the positional ones")


def add_ignored_arguments(parser, ignored):
    """Flags for the nanoGPT settings in `ignored` ({name: why}): accepted on the command line
    or in a config file, warned about once (parse_args_with_config), then dropped."""
    group = parser.add_argument_group("nanoGPT settings that are accepted and ignored")
    for name, why in ignored.items():
        group.add_argument(f"--{name}", default=None, nargs="?", const=True, help=f"ignored: {why}")
    parser.set_defaults(_nanogpt_ignored=dict(ignored))


def add_unevaluated_default(parser, settings):
    """Settings ({name: what the default means}) whose value in a config file may be code that
    is not run (nanoGPT's `wandb_run_name = 'ft-' + str(time.time())`): warned about, and set to
    None (unset) instead of refusing the file."""
    parser.set_defaults(_unevaluated_default=dict(settings))


# ----------------------------------------------------------------------------- safe evaluation

class NotEvaluable(Exception):
    """The expression needs code to run (or is otherwise out of bounds); args[0] says why."""


class Unevaluated(str):
    """The source text of a value that was not evaluated (only kept for an ignored setting)."""


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARYOPS = {ast.UAdd: operator.pos, ast.USub: operator.neg, ast.Not: operator.not_}
_MAX_BITS = 4096  # integers beyond this are surely a mistake (and `9 ** 9 ** 9` would hang)
_MAX_LEN = 100_000  # longest string, tuple or list a `*` may build


def safe_eval(node, names, imported=()):
    """Value of a constant expression over `names` (a dict), without running any code."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, (bool, int, float, str)) or node.value is None:
            return node.value
        raise NotEvaluable(f"{type(node.value).__name__} constants are not supported")
    if isinstance(node, ast.Name):
        if node.id in imported:
            raise NotEvaluable(f"it uses the module {node.id!r}; imports are skipped, not run")
        if node.id not in names:
            raise NotEvaluable(f"{node.id!r} is not set earlier")
        if isinstance(names[node.id], Unevaluated):
            raise NotEvaluable(f"{node.id!r} was not evaluated either")
        return names[node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [safe_eval(e, names, imported) for e in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARYOPS:
        return _checked(_UNARYOPS[type(node.op)], safe_eval(node.operand, names, imported))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = safe_eval(node.left, names, imported), safe_eval(node.right, names, imported)
        if isinstance(node.op, ast.Pow) and isinstance(left, int) and isinstance(right, int):
            if right > 0 and abs(left) > 1 and abs(left).bit_length() * right > _MAX_BITS:
                raise NotEvaluable("the number is too large")
        if isinstance(node.op, ast.Mult):
            seq, n = (left, right) if isinstance(left, (str, tuple, list)) else (right, left)
            if isinstance(seq, (str, tuple, list)) and isinstance(n, int) and len(seq) * n > _MAX_LEN:
                raise NotEvaluable("the result is too long")
        return _checked(_BINOPS[type(node.op)], left, right)
    if isinstance(node, ast.Call):
        raise NotEvaluable("it calls a function")
    if isinstance(node, ast.Attribute):
        raise NotEvaluable("it reads an attribute")
    raise NotEvaluable(f"{type(node).__name__} expressions are not supported")


def _checked(op, *operands):
    for v in operands:  # only plain values take part: no objects whose operators could run code
        if not (v is None or isinstance(v, (bool, int, float, str, tuple, list))):
            raise NotEvaluable(f"unsupported operand {type(v).__name__}")
    try:
        result = op(*operands)
    except (TypeError, ArithmeticError, ValueError) as e:
        raise NotEvaluable(str(e)) from None
    if isinstance(result, int) and result.bit_length() > _MAX_BITS:
        raise NotEvaluable("the number is too large")
    if isinstance(result, (str, tuple, list)) and len(result) > _MAX_LEN:  # `s = s + s`, line after line
        raise NotEvaluable("the result is too long")
    return result


# ----------------------------------------------------------------------------- config files

def _type_ok(action, value):
    if value is None or isinstance(value, Unevaluated):
        return True
    if action.nargs == 0:  # store_true / store_false (--resume): a bool
        return isinstance(value, bool)
    if action.type is None:
        return isinstance(value, str)
    if action.type is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if action.type is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if action.type is str2bool:
        return isinstance(value, bool)
    return isinstance(value, str)


def read_config_tree(path):
    """(text, ast) of config file `path`, parsed and not run, or a ProjectError saying what is wrong
    with it: missing, a directory, not UTF-8 text, a syntax error."""
    label = f"config file {path}"
    if os.path.isdir(path):
        raise ProjectError(f"{label} is a directory", "pass a config file, e.g. config/train_shakespeare_char.py")
    if not os.path.isfile(path):
        hint = ("flags need two dashes: --key=value" if "=" in os.path.basename(path)
                else "see config/ for the presets")
        raise ProjectError(f"{label} not found", hint)
    try:
        with open(path, encoding="utf-8") as f:
            src = f.read()
    except UnicodeDecodeError:
        raise ProjectError(f"{label} is not valid UTF-8 text") from None
    try:
        return src, ast.parse(src, filename=path)
    except SyntaxError as e:
        raise ProjectError(f"{label}: syntax error on line {e.lineno}") from None


def load_config_file(path, parser, namespace, free_choices=()):
    """Apply the assignments of config file `path` to `namespace` (which holds the current
    defaults), in file order. `free_choices`: settings whose value is checked later by the
    script, not against the flag's choices here."""
    label = f"config file {path}"
    src, tree = read_config_tree(path)
    actions = {a.dest: a for a in parser._actions if a.dest not in ("help", "config", "config_files")}
    # a setting that falls back to its default when its value is code (nanoGPT's run names)
    ignored = {**getattr(namespace, "_nanogpt_ignored", {}), **getattr(namespace, "_unevaluated_default", {})}
    imported = set()
    for node in tree.body:
        where = f"{label} line {node.lineno}"
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imported.update((a.asname or a.name).split(".")[0] for a in node.names)
            continue  # nanoGPT configs import `time` for run names: skipped, nothing is imported
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        elif isinstance(node, ast.Assign):
            targets = node.targets
        else:
            targets = []
        if not targets or not all(isinstance(t, ast.Name) for t in targets):
            raise ProjectError(f"{where}: only `name = value` assignments (and import lines, which are "
                               f"skipped) are allowed", "config files are read, never executed: "
                               "no if/for/def, no function calls, one name per assignment")
        try:
            value = safe_eval(node.value, vars(namespace), imported)
        except NotEvaluable as e:
            value, why = Unevaluated(ast.get_source_segment(src, node.value) or "?"), e.args[0]
        for name in (t.id for t in targets):
            if name not in actions:
                raise ProjectError(f"{where}: unknown setting {name!r}",
                                   f"see python {parser.prog} --help for the settings")
            if isinstance(value, Unevaluated) and name not in ignored:
                raise ProjectError(f"{where}: cannot evaluate the value of {name} ({why}); config files "
                                   f"are read, never executed", "use numbers, strings, True/False/None, "
                                   "arithmetic on them (e.g. 5 * 8) and names set earlier")
            action = actions[name]
            if name not in ignored and (not _type_ok(action, value) or (
                    action.choices and value not in action.choices and name not in free_choices)):
                raise ProjectError(f"{where}: {name} = {value!r} has the wrong type or value",
                                   f"see --{name} in --help")
            if isinstance(action, DatasetAction):
                action(parser, namespace, value)  # dataset also sets data_dir
            else:
                setattr(namespace, action.dest, value)


def _is_number(s):
    try:
        float(s)
        return True
    except ValueError:
        return False


def check_flags(parser, argv):
    """Refuse an unknown flag by its name, with the closest known ones, before anything is read
    (otherwise its value would be taken for a config file: `--bogus 3` -> 'config file 3')."""
    known = [s for a in parser._actions for s in a.option_strings]
    for arg in argv:
        if arg == "--":
            break
        if not arg.startswith("-") or arg == "-" or _is_number(arg):
            continue
        name = arg.split("=", 1)[0]
        if name in known:
            continue
        prefixed = [k for k in known if k.startswith(name) and k.startswith("--")] if parser.allow_abbrev else []
        if len(prefixed) == 1 and name.startswith("--"):
            continue  # argparse's unambiguous abbreviation
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        raise ProjectError(f"unknown flag {name}" + (f" (ambiguous: {', '.join(prefixed)})" if len(prefixed) > 1 else ""),
                           (f"did you mean {' or '.join(close)}? " if close else "")
                           + f"see python {parser.prog} --help for the flags")


def parse_args_with_config(parser, argv=None, free_choices=()):
    """Parse the command line; config files named on it set the defaults first."""
    argv = list(sys.argv[1:] if argv is None else argv)
    check_flags(parser, argv)
    # first pass: which config files? (--help waits for the second pass, which shows their values)
    first, _ = parser.parse_known_args([a for a in argv if a not in ("-h", "--help")])
    files = ([first.config] if first.config else []) + list(first.config_files)
    if files:
        skip = ("help", "config", "config_files")
        defaults = argparse.Namespace(**{a.dest: a.default for a in parser._actions if a.dest not in skip})
        for k, v in parser._defaults.items():
            setattr(defaults, k, v)
        for path in files:
            load_config_file(path, parser, defaults, free_choices)
        parser.set_defaults(**{k: v for k, v in vars(defaults).items() if k not in skip})
    args = parser.parse_args(argv)
    for name, why in getattr(args, "_nanogpt_ignored", {}).items():
        value = getattr(args, name)
        if value is not None and os.environ.get("RANK", "0") == "0":  # one line, once per setting
            shown = f" (its value {value} was not evaluated)" if isinstance(value, Unevaluated) else ""
            print(f"warning: {name} is ignored{shown}: {why}", file=sys.stderr)
        delattr(args, name)
    for name, meaning in getattr(args, "_unevaluated_default", {}).items():
        value = getattr(args, name)
        if isinstance(value, Unevaluated):
            if os.environ.get("RANK", "0") == "0":
                print(f"warning: {name}'s value {value} was not evaluated (config files are read, never "
                      f"executed): {meaning}", file=sys.stderr)
            setattr(args, name, None)
    for hidden in ("_nanogpt_ignored", "_unevaluated_default"):
        if hasattr(args, hidden):
            delattr(args, hidden)
    return args
