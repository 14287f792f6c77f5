"""The two kinds of error a user of ``lm``'s CLIs meets, and the exit status each gives.

- a *usage* error (``ValueError`` / ``FileNotFoundError``: a flag, config key, path or memory estimate
  is wrong) is found before any work and exits 2;
- a *failure* (:class:`RunFailure`: the loss went non-finite, a checkpoint is corrupt) stops a run that
  was valid to start and exits 1.

Both print one line (``rmsgauge.cli.run_guarded``); ``--debug`` shows the traceback instead.
"""

from __future__ import annotations


class RunFailure(RuntimeError):
    """A run that started correctly could not go on; the message says what is kept and how to continue."""


class NonFiniteError(RunFailure):
    """The loss or the gradient norm became NaN or infinite; the step was not applied."""


class CheckpointError(RunFailure):
    """A checkpoint (or shipped model) cannot be read, or its sha256 does not match: names the file."""
