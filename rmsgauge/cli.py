"""The one guard every rmsgauge CLI is built on: parsers with one-line usage errors and ``--debug``
(:func:`make_parser`, :func:`add_subcommands`), checks before any work and one line per error (:func:`run_main`),
and outputs that are writable and never one of the command's inputs (:func:`check_outputs_against_inputs`).
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rmsgauge.claims import DTYPE_ALIASES  # the one table of precision spellings

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
        lo_s = "-inf" if lo is None else f"{lo}" if isinstance(lo, int) else f"{lo:g}"
        hi_s = "inf" if hi is None else f"{hi}" if isinstance(hi, int) else f"{hi:g}"
        raise ValueError(f"{name} must be in {left}{lo_s}, {hi_s}{right}, got {value!r}")
    return value


def check_choice(name: str, value: str, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return value


def parse_dtype(value: str) -> str:
    """argparse ``type=``: accept float32/float64 (and the short f32/f64)."""
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
    if str(path) == "":
        raise ValueError(f"{name} must be a file path, got an empty string")
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{name} {p} is a directory; give a file path such as {p / 'claims.json'}")
    if protect and (why := protected_file(p)):
        raise ValueError(f"{name} {p} {why}: an output never replaces it; choose another path")
    _check_writable(name, p, p.parent)
    if p.exists() and not os.access(p, os.W_OK):
        raise ValueError(f"{name} {p}: not writable (permissions of {p})")
    return p


def check_output_dir(name: str, path: str | os.PathLike) -> Path:
    """Before any work: ``path`` must be a folder we can create or write into."""
    if str(path) == "":
        raise ValueError(f"{name} must be a folder path, got an empty string")
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{name} {p} is a file; give a folder")
    _check_writable(name, p, p)
    return p


def _check_writable(name: str, p: Path, folder: Path) -> None:
    """``folder`` (``p``'s) exists and takes a new file, or its first existing ancestor does (the folders can be
    made).  Permissions are not the whole story (root on a read-only or special file system passes
    ``os.access``), so a temporary file is made and removed."""
    probe = folder
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"{name} {p}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{name} {p}: not writable (permissions of {probe})")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".rmsgauge-write-check-", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise ValueError(f"{name} {p}: not writable ({e.strerror or type(e).__name__} of {probe})") from None


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
        """argparse's parse, after refusing a flag this parser does not know (argparse alone sets it aside and reads
        its value as the next positional: ``--d-modle 64`` became the subcommand ``64``).  A forwarding subcommand's
        flags belong to the CLI it forwards to, which checks them."""
        argv = list(sys.argv[1:] if args is None else args)
        flag = None if self.get_default("_cli_forward") else self._first_unknown_flag(argv)
        if flag is not None:
            self.error(self._unknown_flag_message(flag))
        return super().parse_known_args(argv, namespace)

    def _first_unknown_flag(self, argv: list[str]) -> str | None:
        """The first flag of ``argv`` that names no action here (an abbreviation of one names it), up to ``--`` or a
        subcommand's name that is not a flag's value (the subcommand's own parser reads what follows)."""
        commands = {n for a in self._actions if isinstance(a, argparse._SubParsersAction) for n in a.choices}
        value_next = False
        for token in argv:
            if token == "--" or (token in commands and not value_next):
                return None
            value_next = False
            if len(token) < 2 or token[0] not in self.prefix_chars or token[1] in "0123456789." or " " in token:
                continue  # a value, -1e-6 included
            flag = token.split("=", 1)[0] if token.startswith("--") else token[:2]
            actions = [a for o, a in self._option_string_actions.items()
                       if o == flag or (self.allow_abbrev and flag.startswith("--") and o.startswith(flag))]
            if not actions:
                return flag
            value_next = actions[0].nargs != 0 and flag == token
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


USAGE_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError)


def run_guarded(prog: str, fn: Any, *, debug: bool = False,
                failure_errors: tuple[type[BaseException], ...] = (Failure,)) -> int:
    """Call ``fn()`` and turn what escapes it into one line on stderr and an exit status: the classes in
    ``failure_errors`` -> 1 (checked first: a failure may subclass ValueError), :data:`USAGE_ERRORS` -> 2,
    Ctrl-C -> 130, a closed stdout pipe -> 141 silently, anything else -> 1.  ``debug``: re-raise instead, with
    the traceback."""
    try:
        status = int(fn() or 0)
        sys.stdout.flush()  # a reader that went away shows here, not as a traceback at interpreter exit
        return status
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
        if isinstance(e, failure_errors) or not isinstance(e, USAGE_ERRORS):
            kind = "" if isinstance(e, failure_errors) else f"{type(e).__name__}: "
            sys.stderr.write(f"{prog}: error: {kind}{one_line(e)} (--debug shows the traceback)\n")
            return EXIT_FAILURE
        sys.stderr.write(f"{prog}: error: {one_line(e)}\n")
        return EXIT_USAGE


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
    "rmsgauge-evaluate": ("lm.evaluate", "python -m lm.evaluate"),
    "rmsgauge-hf": ("lm.hf", "python -m lm.hf"),
    "rmsgauge-reference": ("lm.reference", "python -m lm.reference"),
    "rmsgauge-bench": ("lm.bench.__main__", "python -m lm.bench"),
    "rmsgauge-experiments": ("studies.experiments", "python -m studies.experiments"),
    "rmsgauge-trained": ("studies.trained.__main__", "python -m studies.trained"),
}


def _invoked_as() -> str:
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return name.removesuffix(".exe")


def console() -> int:
    """The entry of every console command: runs the ``main()`` of the command it is invoked as."""
    name = _invoked_as()
    if name not in CONSOLE_COMMANDS:
        sys.stderr.write(f"{name}: not an rmsgauge command; known: {', '.join(CONSOLE_COMMANDS)}\n")
        return EXIT_USAGE
    return int(importlib.import_module(CONSOLE_COMMANDS[name][0]).main() or 0)


def make_parser(prog: str, description: str | None = None, *, epilog: str | None = None, usage: str | None = None,
                formatter_class: type = argparse.RawDescriptionHelpFormatter) -> OneLineArgumentParser:
    """The parser of one CLI: one-line usage errors (exit 2) and ``--debug``.  ``prog`` is the ``python -m`` form;
    run as its console command, the parser names itself by that command."""
    prog = next((c for c, (_, py) in CONSOLE_COMMANDS.items() if py == prog and c == _invoked_as()), prog)
    p = OneLineArgumentParser(prog=prog, description=description, epilog=epilog, usage=usage,
                              formatter_class=formatter_class)
    p.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    p.set_defaults(_cli_parser=p)
    return p


def add_subcommands(parser: argparse.ArgumentParser, *, required: bool = True) -> Any:
    """Subcommands, the one way: argparse subparsers (``add_subcommand`` adds each)."""
    subs = parser.add_subparsers(dest="command", required=required, parser_class=OneLineArgumentParser,
                                 metavar="COMMAND")
    subs.parent_prog = parser.prog  # each subcommand is "<prog> <name>", whatever the parent's usage line says
    return subs


def add_subcommand(subs: Any, name: str, help: str, *, description: str | None = None,
                   forward: bool = False) -> OneLineArgumentParser:
    """One subcommand with its own ``--debug``.  ``forward``: the subcommand belongs to another module's CLI,
    whose own parser reads everything after the name (``args.rest``), ``--help`` included."""
    p = subs.add_parser(name, help=help, description=description or help, add_help=not forward,
                        formatter_class=argparse.RawDescriptionHelpFormatter, prog=f"{subs.parent_prog} {name}")
    if forward:  # run_main hands everything after the name to the other CLI as args.rest
        p.set_defaults(_cli_forward=True)
    else:  # SUPPRESS: a --debug before the subcommand name is not reset by the subcommand's default
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    p.set_defaults(_cli_parser=p)
    return p


def run_main(parser: argparse.ArgumentParser, argv: list[str] | None, work: Any, *, check: Any = lambda _args: None,
             failure_errors: tuple[type[BaseException], ...] = (Failure,)) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run ``check(args)`` before any work, then ``work(args, checked)``.

    A usage error in ``check`` (:data:`USAGE_ERRORS`: a flag, a path, an input that does not parse) is one line
    and exit 2, nothing written; what ``work`` raises is handled by :func:`run_guarded` (``failure_errors`` are
    failures, exit 1, printed without their class name)."""
    args, rest = parser.parse_known_args(argv)
    sub = getattr(args, "_cli_parser", parser)
    if getattr(args, "_cli_forward", False):
        args.rest = rest
    elif rest:
        sub.error(f"unrecognized arguments: {' '.join(rest)}")

    def body() -> int:
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
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()  # the name in (...) may hold spaces
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _same(a: Path, b: Path) -> bool:
    if a == b:
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)  # hard links, bind mounts
    except OSError:
        return False


def _items(named: Mapping[str, Any]) -> list[tuple[str, str, Path]]:
    """``(flag, path as given, absolute path)`` for every path of ``{flag: path | [paths] | None}``."""
    out = []
    for flag, value in named.items():
        values = value if isinstance(value, (list, tuple, set, frozenset)) else [value]
        out += [(flag, os.fspath(v), Path(os.path.abspath(os.path.expanduser(v))).resolve())
                for v in values if v is not None and os.fspath(v) != ""]
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
            if ai.is_dir() and ai in ao.parents:
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
            elif _same(ad, ai) or ad in ai.parents:
                raise ValueError(f"{dflag} {d} holds the input {iflag} {i}: this command writes there; choose "
                                 f"another {dflag}")
            if ai.is_dir() and ai in ad.parents:
                raise ValueError(f"{dflag} {d} lies inside the input folder {iflag} {i}: writing there would "
                                 f"change that input; choose a folder outside it")
