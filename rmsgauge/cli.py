"""The one guard every rmsgauge CLI is built on: its parser, its flag names, its checks before work and
its exit statuses.

- :func:`make_parser` / :func:`add_subcommands` / :func:`add_subcommand`: argparse with one-line errors
  (exit 2), ``--debug`` on every parser and subcommand, subcommands as subparsers (never argv sniffing);
- :data:`SHARED_FLAGS`: one spelling per concept across every CLI (the old spellings, :data:`RENAMED_FLAGS`,
  are refused naming the new one);
- :func:`run_main`: parse, run the command's checks before any work (a ``ValueError`` there is a usage
  error, exit 2), then the work under :func:`run_guarded` (a :class:`Failure` or any other error: one line,
  exit 1; Ctrl-C: exit 130; ``--debug``: the traceback instead);
- :func:`check_output_file`, :func:`check_output_dir`, :func:`check_outputs_against_inputs`: every output path
  is writable and none of them is, or lies inside, one of the command's inputs (the same file, a file of an
  input folder, a checkpoint and its checksum, the files of the run folder a checkpoint belongs to).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

DTYPES = ("float32", "float64")


def check_range(name: str, value: float, lo: float | None = None, hi: float | None = None, *,
                lo_open: bool = False, hi_open: bool = False) -> float:
    """Raise ``ValueError`` naming ``name`` and the allowed interval unless ``value`` lies in it."""
    ok = isinstance(value, (int, float)) and math.isfinite(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value < hi if hi_open else value <= hi
    if not ok:
        left = "(" if lo_open or lo is None else "["
        right = ")" if hi_open or hi is None else "]"
        lo_s = "-inf" if lo is None else f"{lo:g}"
        hi_s = "inf" if hi is None else f"{hi:g}"
        raise ValueError(f"{name} must be in {left}{lo_s}, {hi_s}{right}, got {value!r}")
    return value


def check_positive(name: str, value: float) -> float:
    return check_range(name, value, 0.0, None, lo_open=True)


def check_choice(name: str, value: str, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return value


def parse_dtype(value: str) -> str:
    """argparse ``type=``: accept float32/float64 (and the short f32/f64)."""
    from rmsgauge.claims import DTYPE_ALIASES  # the one table of spellings

    v = DTYPE_ALIASES.get(value, value)
    if v not in DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {value!r}; allowed: {', '.join(DTYPES)}")
    return v


def parse_float_list(value: str) -> list[float]:
    """argparse ``type=``: comma-separated floats, e.g. ``0,1e-6,1e-5``."""
    try:
        out = [float(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {value!r}") from None
    if not out:
        raise argparse.ArgumentTypeError("expected at least one number")
    return out


def reject_unknown_keys(kind: str, given: Mapping[str, Any], allowed: Iterable[str]) -> None:
    allowed = set(allowed)
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise ValueError(f"unknown {kind} key(s) {unknown}; allowed: {sorted(allowed)}")


# One spelling of the shared flags across every CLI; the old spellings are refused with the new name.
SHARED_FLAGS = ("--d-model", "--n-heads", "--n-layers", "--batch-size", "--seq-len", "--seed", "--dtype",
                "--threads", "--device", "--json", "--verbose", "--quiet", "--out-dir", "--data", "--checkpoint",
                "--model-dir", "--resume", "--force", "--trust-unverified", "--debug")
RENAMED_FLAGS = {
    "--out": "--out-dir",
    "--output": "--out-dir",
    "--ckpt": "--checkpoint",
    "--corpus": "--data",
    "--heads": "--n-heads",
    "--layers": "--n-layers",
    "--n-blocks": "--n-layers",
    "--batch": "--batch-size",
    "--block": "--seq-len",
    "--block-size": "--seq-len",
}


def refuse_renamed_flags(argv: Iterable[str], renamed: Mapping[str, str] = RENAMED_FLAGS) -> None:
    """Raise ``ValueError`` (one line) when an old spelling of a shared flag is used, naming the new one."""
    for arg in argv:
        flag = arg.split("=", 1)[0]
        if flag in renamed:
            raise ValueError(f"{flag} was renamed {renamed[flag]} (the same name in every rmsgauge CLI); "
                             f"use {renamed[flag]}")


def parse_shared_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)`` after refusing old spellings of the shared flags (a usage error, exit 2)."""
    try:
        refuse_renamed_flags(argv)
    except ValueError as e:
        parser.error(str(e))
    return parser.parse_args(argv)


CHECKSUM_SUFFIX = ".sha256"  # a file with this sidecar is vouched for (a checkpoint): outputs never replace it
RUN_FOLDER_MARKS = ("ckpt.pt.sha256", "run.lock")  # a folder holding one of these holds a training run
RUN_FOLDER_FILES = ("log.jsonl", "summary.json")  # ... whose log and summary outputs never replace either


def protected_file(p: Path) -> str | None:
    """Why an existing file must never be replaced by a command's output (None: it may be): a checksummed file, a
    checksum file, or a training run's log or summary."""
    if not p.is_file():
        return None
    if p.with_name(p.name + CHECKSUM_SUFFIX).is_file():
        return f"is a checksummed file ({p.name}{CHECKSUM_SUFFIX} vouches for it)"
    if p.name.endswith(CHECKSUM_SUFFIX) and p.with_name(p.name[: -len(CHECKSUM_SUFFIX)]).is_file():
        return f"is the checksum of {p.name[: -len(CHECKSUM_SUFFIX)]}"
    if p.name in RUN_FOLDER_FILES and any((p.parent / m).exists() for m in RUN_FOLDER_MARKS):
        return f"is the {p.name} of the training run in {p.parent}"
    return None


def check_output_file(name: str, path: str | os.PathLike | None, *, protect: bool = True) -> Path | None:
    """Before any work: ``path`` must name a file we can create or replace (not a directory, its folder
    writable or creatable, and not a :func:`protected_file` unless ``protect=False``). Returns the path, or None
    when ``path`` is None."""
    if path is None:
        return None
    p = Path(path)
    if str(path) == "":
        raise ValueError(f"{name} must be a file path, got an empty string")
    if p.is_dir():
        raise ValueError(f"{name} {p} is a directory; give a file path such as {p / 'claims.json'}")
    why = protected_file(p) if protect else None
    if why:
        raise ValueError(f"{name} {p} {why}: an output never replaces it; choose another path")
    parent = p.parent if str(p.parent) else Path(".")
    probe = parent
    while not probe.exists():  # the first existing ancestor decides whether the folders can be made
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"{name} {p}: {probe} is a file, not a folder")
    why = _not_writable(probe) or (None if not p.exists() or os.access(p, os.W_OK) else "permissions")
    if why:
        raise ValueError(f"{name} {p}: not writable ({why} of {p if p.exists() else probe})")
    return p


def _not_writable(folder: Path) -> str | None:
    """Why nothing can be created in ``folder`` (None: it can).  Permissions are not the whole story (root on a
    read-only or special file system passes ``os.access``), so a temporary file is made and removed."""
    import tempfile

    if not os.access(folder, os.W_OK | os.X_OK):
        return "permissions"
    try:
        fd, tmp = tempfile.mkstemp(prefix=".rmsgauge-write-check-", dir=folder)
    except OSError as e:
        return e.strerror or type(e).__name__
    os.close(fd)
    os.unlink(tmp)
    return None


def check_output_dir(name: str, path: str | os.PathLike) -> Path:
    """Before any work: ``path`` must be a folder we can create or write into."""
    if str(path) == "":
        raise ValueError(f"{name} must be a folder path, got an empty string")
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{name} {p} is a file; give a folder")
    probe = p
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"{name} {p}: {probe} is a file, not a folder")
    why = _not_writable(probe)
    if why:
        raise ValueError(f"{name} {p}: not writable ({why} of {probe})")
    return p


# ---------------------------------------------------------------------------------------------
# One-line errors: exit 2 for usage errors, 1 for failures, a traceback only with --debug
# ---------------------------------------------------------------------------------------------

EXIT_FAILURE = 1  # the run could not complete (non-finite loss, corrupt file, disk full, ...)
EXIT_USAGE = 2  # a flag, config key or path is wrong (argparse's own status for usage errors)
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell's convention
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader of stdout went away (`| head`), as `cat` reports it


class Failure(RuntimeError):
    """A command that was valid to start could not complete (a corrupt file, a busy run folder, a failed
    claim): one line naming what and where, exit 1."""


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error: ``prog: error: message`` on stderr (no usage block), exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {one_line(message)}\n")

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        """argparse's parse, after refusing a flag this parser does not know.  Without this check argparse sets
        an unknown flag aside and reads its value as the next positional (``--d-modle 64`` became the
        subcommand ``64``: "invalid choice").  A subcommand's parser checks the flags after its name; a
        forwarding subcommand (another CLI reads its flags) is not checked."""
        import sys

        argv = list(sys.argv[1:] if args is None else args)
        if not self.get_default("_cli_forward"):
            flag = self._first_unknown_flag(argv)
            if flag is not None:
                self.error(self._unknown_flag_message(flag))
        return super().parse_known_args(argv, namespace)

    def _looks_like_flag(self, token: str) -> bool:
        """A token argparse reads as an option: a prefix character, then not a number (``-1e-6`` is a value)."""
        return (len(token) > 1 and token[0] in self.prefix_chars and not token[1].isdigit() and token[1] != "."
                and " " not in token)

    def _known_action(self, flag: str) -> argparse.Action | None:
        """The action ``flag`` names: exactly, or as argparse's unambiguous long-flag abbreviation."""
        actions = self._option_string_actions
        if flag in actions:
            return actions[flag]
        if flag[:2] in actions and not flag.startswith("--"):  # -x with its value or more short flags attached
            return actions[flag[:2]]
        if self.allow_abbrev and flag.startswith("--"):
            hits = {actions[o] for o in actions if o.startswith(flag)}
            if hits:  # several: argparse names them ("ambiguous option"), one: the flag it stands for
                return next(iter(hits))
        return None

    def _first_unknown_flag(self, argv: list[str]) -> str | None:
        """The first token of ``argv`` that is a flag of no action here, reading each known flag's values and
        stopping at ``--`` or at a subcommand name (its own parser reads the rest)."""
        commands = {name for a in self._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices}
        i = 0
        while i < len(argv):
            token = argv[i]
            i += 1
            if token == "--" or (token in commands and not self._looks_like_flag(token)):
                return None
            if not self._looks_like_flag(token):
                continue
            flag, eq, _ = token.partition("=")
            action = self._known_action(flag)
            if action is None:
                return flag
            if eq or (not flag.startswith("--") and len(flag) > 2):
                continue  # the value is attached
            if isinstance(action.nargs, int) or action.nargs is None:
                i += 1 if action.nargs is None else action.nargs  # argparse itself refuses a missing value
            elif action.nargs in ("?", "*", "+"):
                while i < len(argv) and argv[i] != "--" and not self._looks_like_flag(argv[i]):
                    i += 1
                    if action.nargs == "?":
                        break
        return None

    def _unknown_flag_message(self, flag: str) -> str:
        """``unknown flag --d-modle; did you mean --d-model?``: the real flag fewest edits away (a swap of two
        neighbouring letters is one edit), when it is within a third of the typed name's length; between flags as
        near, one with the same letters (``--modle``: ``--model``, not ``--mode``)."""
        typed = flag.lstrip(self.prefix_chars)
        known = sorted({o for a in self._actions for o in a.option_strings if o.startswith("--")})
        scored = sorted((edit_distance(typed, name := o.lstrip(self.prefix_chars)), sorted(name) != sorted(typed), o)
                        for o in known)
        if scored and scored[0][0] <= max(1, len(typed) // 3):
            return f"unknown flag {flag}; did you mean {scored[0][2]}?"
        return f"unknown flag {flag}; {self.prog} --help lists the flags"


def edit_distance(a: str, b: str) -> int:
    """Insertions, deletions, substitutions and swaps of two neighbouring characters that turn ``a`` into ``b``
    (the optimal-string-alignment distance)."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], prev2[j - 2] + 1)
        prev2, prev = prev, row
    return prev[-1]

def one_line(message: object) -> str:
    """``message`` on one line: newlines and runs of spaces become single spaces."""
    return " ".join(str(message).split())


USAGE_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, NotADirectoryError,
                                                IsADirectoryError)


def run_guarded(prog: str, fn: Any, *, debug: bool = False,
                usage_errors: tuple[type[BaseException], ...] = USAGE_ERRORS,
                failure_errors: tuple[type[BaseException], ...] = (Failure,)) -> int:
    """Call ``fn()`` and turn what escapes it into one line on stderr and an exit status: the classes in
    ``failure_errors`` -> 1 (checked first: a failure may subclass ValueError), ``usage_errors`` -> 2,
    Ctrl-C -> 130, a closed stdout pipe -> 141 silently, anything else -> 1.  ``debug``: re-raise instead, with
    the traceback."""
    import sys

    try:
        status = int(fn() or 0)
        sys.stdout.flush()  # a reader that went away shows here, not as a traceback at interpreter exit
        return status
    except SystemExit:
        raise
    except BrokenPipeError:  # `| head` read what it wanted: not this command's error, nothing to print
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit-time flush goes nowhere
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        if debug:
            raise
        sys.stderr.write(f"{prog}: interrupted\n")
        return EXIT_INTERRUPTED
    except Exception as e:  # the one place every error becomes a line
        if debug:
            raise
        if isinstance(e, failure_errors) or not isinstance(e, usage_errors):
            kind = "" if isinstance(e, failure_errors) else f"{type(e).__name__}: "
            sys.stderr.write(f"{prog}: error: {kind}{one_line(e)} (--debug shows the traceback)\n")
            return EXIT_FAILURE
        sys.stderr.write(f"{prog}: error: {one_line(e)}\n")
        return EXIT_USAGE


# ---------------------------------------------------------------------------------------------
# The one parser helper and the one main: every CLI is built and run through these
# ---------------------------------------------------------------------------------------------

HELPER_MARK = "_rmsgauge_cli"  # set on every parser the helper built (tests/test_entry_safety.py checks it)
DEBUG_HELP = "on an error, show the Python traceback instead of one line"


# The console commands ([project.scripts] in pyproject.toml, all pointing at :func:`console`), beside the
# ``python -m`` forms: command -> (module whose main() it runs, the python -m spelling of the same command)
CONSOLE_COMMANDS = {
    "rmsgauge-gauge": ("gauge.__main__", "python gauge.py"),
    "rmsgauge-dynamics": ("dynamics.__main__", "python dynamics.py"),
    "rmsgauge-proofs": ("proofs.__main__", "python -m proofs"),
    "rmsgauge-figures": ("figures.__main__", "python -m figures"),
    "rmsgauge-grt": ("grt_model.__main__", "python -m grt_model"),
    "rmsgauge-train": ("studies.train", "python -m studies.train"),  # lm.train with the equilibrium monitor
    "rmsgauge-sample": ("lm.sample", "python -m lm.sample"),
    "rmsgauge-compare": ("studies.compare", "python -m studies.compare"),
    "rmsgauge-evaluate": ("lm.evaluate", "python -m lm.evaluate"),
    "rmsgauge-hf": ("lm.hf_convert", "python -m lm.hf"),
    "rmsgauge-reference": ("lm.reference", "python -m lm.reference"),
    "rmsgauge-bench": ("lm.bench", "python -m lm.bench"),
    "rmsgauge-experiments": ("studies.experiments", "python -m studies.experiments"),
    "rmsgauge-trained": ("studies.trained.__main__", "python -m studies.trained"),
}


def _invoked_as() -> str:
    import sys

    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return name[:-4] if name.endswith(".exe") else name


def console() -> int:
    """The entry of every console command: imports the command's module with Ctrl-C answered by one line and
    exit 130 (the imports take seconds), then runs its ``main()``."""
    import importlib
    import sys

    name = _invoked_as()
    if name not in CONSOLE_COMMANDS:
        sys.stderr.write(f"{name}: not an rmsgauge command; known: {', '.join(CONSOLE_COMMANDS)}\n")
        return EXIT_USAGE
    try:
        main = importlib.import_module(CONSOLE_COMMANDS[name][0]).main
    except KeyboardInterrupt:
        sys.stderr.write(f"{name}: interrupted\n")
        return EXIT_INTERRUPTED
    return int(main() or 0)


def make_parser(prog: str, description: str | None = None, *, epilog: str | None = None, usage: str | None = None,
                formatter_class: type = argparse.RawDescriptionHelpFormatter) -> OneLineArgumentParser:
    """The parser of one CLI: one-line usage errors (exit 2) and ``--debug``.  ``prog`` is the ``python -m`` form;
    run as its console command, the parser names itself by that command."""
    prog = next((c for c, (_, py) in CONSOLE_COMMANDS.items() if py == prog and c == _invoked_as()), prog)
    p = OneLineArgumentParser(prog=prog, description=description, epilog=epilog, usage=usage,
                              formatter_class=formatter_class)
    p.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    p.set_defaults(_cli_parser=p)
    setattr(p, HELPER_MARK, True)
    return p


def add_subcommands(parser: argparse.ArgumentParser, *, required: bool = True, dest: str = "command") -> Any:
    """Subcommands, the one way: argparse subparsers (``add_subcommand`` adds each)."""
    subs = parser.add_subparsers(dest=dest, required=required, parser_class=OneLineArgumentParser,
                                 metavar="COMMAND")
    subs.parent_prog = parser.prog  # each subcommand is "<prog> <name>", whatever the parent's usage line says
    return subs


def add_subcommand(subs: Any, name: str, help: str, *, description: str | None = None, forward: bool = False,
                   formatter_class: type = argparse.RawDescriptionHelpFormatter) -> OneLineArgumentParser:
    """One subcommand with its own ``--debug``.  ``forward``: the subcommand belongs to another module's CLI,
    whose own parser reads everything after the name (``args.rest``), ``--help`` included."""
    p = subs.add_parser(name, help=help, description=description or help, formatter_class=formatter_class,
                        add_help=not forward, prog=f"{getattr(subs, 'parent_prog', '')} {name}".strip())
    if forward:  # run_main hands everything after the name to the other CLI as args.rest
        p.set_defaults(_cli_forward=True)
    else:  # SUPPRESS: a --debug before the subcommand name is not reset by the subcommand's default
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    p.set_defaults(_cli_parser=p)
    setattr(p, HELPER_MARK, True)
    return p


def run_main(parser: argparse.ArgumentParser, argv: list[str] | None, work: Any, *, check: Any = None,
             failure_errors: tuple[type[BaseException], ...] = (Failure,)) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run ``check(args)`` before any work, then ``work(args, checked)``.

    A usage error in ``check`` (:data:`USAGE_ERRORS`: a flag, a path, an input that does not parse) is one line
    and exit 2, nothing written; anything ``work`` raises is one line and exit 1 (``failure_errors`` print without
    their class name), Ctrl-C exit 130; ``--debug`` shows the traceback instead."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        refuse_renamed_flags(argv)
    except ValueError as e:
        parser.error(str(e))
    args, rest = parser.parse_known_args(argv)
    sub = getattr(args, "_cli_parser", parser)
    if getattr(args, "_cli_forward", False):
        args.rest = rest
    elif rest:
        sub.error(f"unrecognized arguments: {' '.join(rest)}")

    def body() -> int:
        checked = None
        if check is not None:
            try:
                checked = check(args)
            except USAGE_ERRORS as e:
                sub.error(str(e))
        return work(args, checked)

    return run_guarded(sub.prog, body, debug=bool(getattr(args, "debug", False)), failure_errors=failure_errors)


def seconds_since_process_start() -> float | None:
    """Wall-clock seconds since this process started, interpreter start-up and imports included (a command's own
    timer starts after its imports, seconds late on a loaded machine); None where the system does not say.  Linux
    records the start in ``/proc/self/stat`` (field 22, clock ticks since boot)."""
    import time

    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()  # the name in (...) may hold spaces
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return None


# ---------------------------------------------------------------------------------------------
# Outputs against inputs: no command writes over, or into, what it reads
# ---------------------------------------------------------------------------------------------

PathArg = str | os.PathLike


def _abs(p: PathArg) -> Path:
    return Path(os.path.abspath(os.path.expanduser(os.fspath(p)))).resolve()


def _same(a: Path, b: Path) -> bool:
    if a == b:
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)  # hard links, bind mounts
    except OSError:
        return False


def _inside(child: Path, folder: Path) -> bool:
    return folder in child.parents


def _items(named: Mapping[str, Any]) -> list[tuple[str, str, Path]]:
    """``(flag, path as given, absolute path)`` for every path of ``{flag: path | [paths] | None}``."""
    out = []
    for flag, value in named.items():
        if value is None or value == "":
            continue
        values = value if isinstance(value, (list, tuple, set, frozenset)) else [value]
        out += [(flag, os.fspath(v), _abs(v)) for v in values if v is not None and os.fspath(v) != ""]
    return out


def check_outputs_against_inputs(inputs: Mapping[str, Any], outputs: Mapping[str, Any] | None = None,
                                 out_dirs: Mapping[str, Any] | None = None,
                                 written: Mapping[str, Iterable[str]] | None = None) -> None:
    """Before any work: no output is one of the inputs, lies inside an input folder, or holds an input.

    ``inputs``: ``{flag: path | [paths]}`` of everything the command reads (files or folders; a checkpoint with
    its ``.sha256`` and its run's files, see ``lm.checkpoint.checkpoint_inputs``).  ``outputs``: files written.
    ``out_dirs``: folders written into; ``written[flag]`` the names the command writes there (an output file
    cannot be one of them, nor an input); without it the folder may hold no input at all.  Raises
    ``ValueError`` naming both flags and the fix."""
    ins, outs, dirs = _items(inputs), _items(outputs or {}), _items(out_dirs or {})
    for oflag, o, ao in outs:
        for iflag, i, ai in ins:
            if _same(ao, ai):
                raise ValueError(f"{oflag} {o} is the input {iflag} {i}: writing it would replace what this "
                                 f"command reads; choose another path for {oflag}")
            if ai.is_dir() and _inside(ao, ai):
                raise ValueError(f"{oflag} {o} lies inside the input folder {iflag} {i}: writing it would change "
                                 f"that input; choose a path outside it")
        for dflag, d, ad in dirs:
            if _same(ao, ad):
                raise ValueError(f"{oflag} {o} is the output folder {dflag}; give a file path")
            for name in (written or {}).get(dflag, ()):
                if _same(ao, ad / name):
                    raise ValueError(f"{oflag} {o} is the {name} that {dflag} {d} gets: choose another path")
    for (aflag, a, aa), (bflag, _, ab) in ((x, y) for k, x in enumerate(outs) for y in outs[k + 1:]):
        if _same(aa, ab):
            raise ValueError(f"{aflag} and {bflag} both name {a}: give each output its own path")
    for dflag, d, ad in dirs:
        names = (written or {}).get(dflag)
        for iflag, i, ai in ins:
            if names is not None:  # the folder's own files are known: only those may not be inputs
                hit = next((n for n in names if _same(ad / n, ai)), None)
                if hit is not None:
                    raise ValueError(f"{dflag} {d} would get a new {hit}, but {iflag} {i} is that file: choose "
                                     f"another {dflag}")
            elif _same(ad, ai) or _inside(ai, ad):
                raise ValueError(f"{dflag} {d} holds the input {iflag} {i}: this command writes there; choose "
                                 f"another {dflag}")
            if ai.is_dir() and _inside(ad, ai):
                raise ValueError(f"{dflag} {d} lies inside the input folder {iflag} {i}: writing there would "
                                 f"change that input; choose a folder outside it")
