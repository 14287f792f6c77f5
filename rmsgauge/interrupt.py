"""A Ctrl-C while a ``python -m`` command is still importing: one line and exit status 130, not a traceback.

Every command's ``main`` answers Ctrl-C with one line (:func:`rmsgauge.cli.run_guarded`), but a command spends its
first seconds importing torch, numba and scipy, before ``main`` runs; a Ctrl-C there escaped as a traceback
through ``runpy``.  Python imports a ``python -m pkg.module`` command's package first, and every package of ours
imports :mod:`rmsgauge` first, whose first import is this module: importing it calls
:func:`quiet_interrupt_while_importing`, before any other import of ours.  Only
then, and only when ``sys.argv[0]`` is still ``"-m"`` (runpy is importing the command's package: a program that
imports rmsgauge as a library keeps its own hook), it replaces ``sys.excepthook`` for ``KeyboardInterrupt``.
Python still ends the process by SIGINT after the hook (exit status 130 in a shell): only the traceback goes.
This module imports nothing but ``sys``, so the hook is in place before any slow import starts.
"""

from __future__ import annotations

import sys


def _prog() -> str:
    argv = list(getattr(sys, "orig_argv", []))  # the interpreter's own argv: [python, -m, pkg.module, ...]
    if "-m" in argv[:-1]:
        return f"python -m {argv[argv.index('-m') + 1]}"
    return "rmsgauge"


def quiet_interrupt_while_importing() -> bool:
    """Install the one-line Ctrl-C hook when a ``python -m`` command is being imported; ``True`` if installed."""
    if not sys.argv or sys.argv[0] != "-m" or getattr(sys.excepthook, "_rmsgauge_quiet_interrupt", False):
        return False
    previous, prog = sys.excepthook, _prog()

    def hook(kind: type[BaseException], value: BaseException, tb: object) -> None:
        if issubclass(kind, KeyboardInterrupt):
            sys.stderr.write(f"{prog}: interrupted\n")
            return
        previous(kind, value, tb)

    hook._rmsgauge_quiet_interrupt = True  # type: ignore[attr-defined]
    sys.excepthook = hook
    return True


quiet_interrupt_while_importing()  # on import: the point of this module is to run before the slow imports
