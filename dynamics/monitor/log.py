"""Where the equilibrium monitor's records go: its JSON-lines log and TensorBoard scalars.

**The log.**  One strict-JSON line per record (:func:`read_records` reads them back).  A log that exists is never
truncated: a monitor resumed the documented way (a new monitor on the same path, then
:meth:`dynamics.monitor.EquilibriumMonitor.load_state_dict`) appends after a ``{"event": "resume", "step": N}``
line (where a step appears twice, the later record holds); a file that is not a log of these gauge groups is
refused when the monitor is built, and one of these groups that the monitor does not resume is left as it is
(:class:`EquilibriumLogWarning` at the first record; the records stay in memory).  A last line a killed writer cut
short is skipped when read and gets its newline before the next line is appended.

**TensorBoard.**  A folder (the ``tensorboard`` package, ``pip install 'rmsgauge[monitor]'``) or a writer with
``add_scalar`` (:func:`tensorboard_writer`); the scalars :func:`record_scalars` names (no spaces or brackets).
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dynamics.monitor.table import DEFAULT_BAND, brief_names, positive_ratio
from rmsgauge import json_safe


class EquilibriumLogWarning(UserWarning):
    """The monitor's log exists and this monitor did not resume it: the file is left as it is."""


class MonitorLog:
    """A monitor's JSON-lines file and what may be done to it: ``new`` (nothing in it yet), ``pending`` (it holds a
    run of these groups: :meth:`resume` continues it, else it is left alone), ``appending`` or ``refused``."""

    def __init__(self, path: Path, names: list[str]) -> None:
        self.path, self.state = path, "new"
        if _holds_data(path):
            found = _last_groups(path)
            if found != names:
                held = "no equilibrium record" if found is None else f"the records of {brief_names(found)}"
                raise ValueError(f"log_path: {path} exists and holds {held}, not this monitor's "
                                 f"{brief_names(names)}; pass a new path (an existing log is never truncated)")
            self.state = "pending"
        else:
            path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, rec: Mapping[str, Any]) -> None:
        """One record; the first onto an earlier run's file that was not resumed refuses the file, once."""
        if self.state == "pending":
            self.state = "refused"
            # the warning points at the optimizer step that ran the monitor's hook (this method, the monitor's
            # writer and its post-step hook are the frames above it)
            warnings.warn(f"log_path: {self.path} holds an earlier run of these gauge groups and this monitor did not "
                          "resume it (load_state_dict): the file is left as it is and the records stay in memory; "
                          "pass a new log_path", EquilibriumLogWarning, stacklevel=4)
        if self.state in ("new", "appending"):
            self.state = "appending"
            append_lines(self.path, [rec])

    def check_resume(self, history: list[Mapping[str, Any]]) -> None:
        """Before a state is loaded: a file this monitor would resume holds the state's last record."""
        if self.state == "pending" and history:
            last = int(history[-1]["step"])
            if last not in {r["step"] for r in read_records(self.path, up_to=last)}:
                raise ValueError(f"log_path: {self.path} holds no record of step {last}, this state's last: it is not "
                                 "this run's log; pass the run's own log or a new path")

    def resume(self, step: int) -> None:
        """After a state is loaded: a file that holds records continues after a ``resume`` line."""
        if self.state in ("pending", "new") and _holds_data(self.path):
            append_lines(self.path, [{"event": "resume", "step": step}])
            self.state = "appending"


def tensorboard_writer(tb: Any) -> Any:
    """``tb`` itself when it is a writer (anything with ``add_scalar``) or None; a folder: a ``SummaryWriter``."""
    if tb is None or hasattr(tb, "add_scalar"):
        return tb
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ValueError("tensorboard: the tensorboard package is not installed (pip install 'rmsgauge[monitor]'); "
                         "pass tensorboard=None to write JSON lines and CSV only") from None
    return SummaryWriter(log_dir=str(tb))


def scalar_name(group: str) -> str:
    """A group's name as a scalar name with no spaces, brackets or colons (TensorBoard, W&B and MLflow take it):
    ``model.layers.0.q_proj.weight[rows 0:8]`` -> ``model.layers.0.q_proj.weight/rows_0-8``."""
    s = group.replace("[", "/").replace("]", "").replace(":", "-").replace(" ", "_")
    return re.sub(r"[^A-Za-z0-9_./-]", "_", s)


def record_scalars(rec: Mapping[str, Any], band: float = DEFAULT_BAND, *, groups: bool = True) -> dict[str, float]:
    """One record as named scalars: per group ``equilibrium/<group>/{norm, eff_lr, norm_over_eq, eff_lr_over_eq,
    norm_over_pred}`` (``groups=False`` leaves them out), and over all groups ``equilibrium/all/{eff_lr_median,
    eff_lr_over_eq_median, norm_over_eq_median, norm_over_eq_worst, at_equilibrium}`` (the worst is the group
    farthest from 1, the last the fraction of groups inside the band)."""
    out: dict[str, float] = {}
    over_eq, eff_over, eff, inside = [], [], [], []
    for name, r in rec["groups"].items():
        base = f"equilibrium/{scalar_name(name)}"
        vals = {"norm": r["norm"], "eff_lr": r["angle"], "norm_over_eq": positive_ratio(r["norm"], r.get("norm_eq")),
                "eff_lr_over_eq": positive_ratio(r["angle"], r.get("angle_eq")),
                "norm_over_pred": positive_ratio(r["norm"], r.get("norm_track"))}
        eff.append(r["angle"])
        if vals["norm_over_eq"] is not None:
            over_eq.append(vals["norm_over_eq"])
            inside.append(abs(vals["norm_over_eq"] ** 2 - 1.0) <= band)
        if vals["eff_lr_over_eq"] is not None:
            eff_over.append(vals["eff_lr_over_eq"])
        if groups:
            out.update({f"{base}/{k}": float(v) for k, v in vals.items() if v is not None})
    out["equilibrium/all/eff_lr_median"] = float(statistics.median(eff))
    if eff_over:
        out["equilibrium/all/eff_lr_over_eq_median"] = float(statistics.median(eff_over))
    if over_eq:
        out["equilibrium/all/norm_over_eq_median"] = float(statistics.median(over_eq))
        out["equilibrium/all/norm_over_eq_worst"] = float(max(over_eq, key=lambda v: abs(math.log(v))))
        out["equilibrium/all/at_equilibrium"] = sum(inside) / len(inside)
    return out


def _floats(x: Any) -> Any:
    """Undo :func:`rmsgauge.json_safe`'s non-finite floats (``'inf'``, ``'-inf'``, ``'nan'``)."""
    if isinstance(x, dict):
        return {k: _floats(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_floats(v) for v in x]
    return float(x) if x in ("inf", "-inf", "nan") else x


def read_records(path: str | Path, *, up_to: int | None = None) -> list[dict[str, Any]]:
    """The ``equilibrium`` records of a JSON-lines log in step order, one per step (where a resumed run recorded
    a step again, its later record), up to step ``up_to``; a line cut short by a killed writer is skipped."""
    by_step = {int(rec["step"]): _floats(rec) for rec in _equilibrium_records(Path(path))
               if up_to is None or rec["step"] <= up_to}
    return [by_step[s] for s in sorted(by_step)]


def append_lines(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    """Append strict-JSON lines (non-finite floats as text); a file whose last line a kill cut short gets its
    newline first, so the next record is not glued to it."""
    text = "".join(json.dumps(json_safe(dict(r))) + "\n" for r in records)
    if not text:
        return
    with path.open("ab") as f:
        if f.tell() > 0:
            with path.open("rb") as r:
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":
                    text = "\n" + text
        f.write(text.encode())


def _holds_data(path: Path) -> bool:
    return path.exists() and path.stat().st_size > 0


def _equilibrium_records(path: Path) -> Iterable[dict[str, Any]]:
    """The ``equilibrium`` records of a JSON-lines log in file order (a line a killed writer cut short is skipped)."""
    with path.open() as f:
        for line in f:
            if '"equilibrium"' not in line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and rec.get("event") == "equilibrium":
                yield rec


def _last_groups(path: Path) -> list[str] | None:
    """The group names of a log's last ``equilibrium`` record (None when it holds none)."""
    groups = [list(rec.get("groups", {})) for rec in _equilibrium_records(path)]
    return groups[-1] if groups else None
