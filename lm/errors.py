"""The two kinds of error a user of ``lm``'s CLIs meets, and the exit status each gives.

- a *usage* error (``ValueError`` / ``FileNotFoundError``: a flag, config key, path or memory estimate
  is wrong) is found before any work and exits 2;
- a *failure* (:class:`RunFailure`: the loss went non-finite, a checkpoint is corrupt) stops a run that
  was valid to start and exits 1.

Both print one line (``rmsgauge.cli.run_guarded``); ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

from rmsgauge.cli import Failure


class RunFailure(Failure):
    """A run that started correctly could not go on; the message says what is kept and how to continue."""


class NonFiniteError(RunFailure):
    """The loss or the gradient norm became NaN or infinite; the step was not applied."""


class CheckpointError(RunFailure):
    """A checkpoint (or shipped model, or save_pretrained folder) cannot be read, has no checksum (and the user
    did not say ``--trust-unverified``), its sha256 does not match, or its contents are not what a checkpoint
    holds: names the file and what is wrong."""


class RunFolderBusy(RunFailure):
    """Another process holds the run folder's lock (``run.lock``): two trainings never share a folder."""
