"""The errors of ``lm``'s CLIs: a usage error (``ValueError`` / ``FileNotFoundError``, found before any work) exits
2; a :class:`RunFailure` (a run valid to start could not go on) exits 1.  Both print one line
(``rmsgauge.cli.run_guarded``); ``--debug`` shows the traceback."""

from __future__ import annotations

from rmsgauge.cli import Failure


class RunFailure(Failure):
    """A run that started correctly could not go on; the message says what is kept and how to continue."""


class NonFiniteError(RunFailure):
    """The loss or the gradient norm became NaN or infinite; the step was not applied."""


class CheckpointError(RunFailure):
    """A checkpoint, shipped model or save_pretrained folder is unreadable, unverified (no checksum, and no
    ``--trust-unverified``), fails its sha256, or does not hold what a checkpoint holds."""


class RunFolderBusy(RunFailure):
    """Another process holds the run folder's lock (``run.lock``)."""
