"""The GRT experiment grid: run it, resume it, summarize it.

    python -m studies.experiments run [--groups ablation,stability,text_shape,depth] [--jobs 2]
    python -m studies.experiments status
    python -m studies.experiments summary [--json PATH] [--verbose]
    python -m studies.experiments run --groups reference --results results/compare-reference \
        --runs-dir runs/compare-reference     # the reference comparison, beside its committed records

``run`` trains every run of :func:`studies.grid.grid` not yet recorded, ``--jobs`` at a time, each in its own
process (:mod:`studies.job`), and merges each finished run's record into ``RESULTS/runs.json`` (its log under
``RESULTS/logs/``).  Run folders (checkpoints, not committed) live under ``--runs-dir``; Ctrl-C checkpoints the
running jobs, and the same command continues them bit-exactly.  A run that depends on others (a sweep's final,
an equal-wall-clock or equal-speed match, a tuning slot) waits until they are recorded; a speed match is sized
by a probe measured here (:mod:`studies.speed`, saved in ``RESULTS/speed_probes.json``).  Every command leaves
out the ``reference`` group unless ``--groups`` names it.  ``summary`` prints the tables and verdicts
(:mod:`studies.experiments_report`) from the committed records alone.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rmsgauge import atomic_write_json, atomic_write_text
from rmsgauge.cli import Failure, add_subcommand, add_subcommands, make_parser, run_main
from studies.grid import (
    DEFAULT_GROUPS,
    GRIDS,
    GROUPS,
    RunSpec,
    grid,
    needed_specs,
    sweep_points,
    sweep_score,
    widening_needed,
)
from studies.tuning import resolve_tuning, tuned_point

DEFAULT_RUNS_DIR = "runs/grt-experiments"
DEFAULT_RESULTS = "results/grt-experiments"
POLL_S = 5.0
# what makes a run the same run on a restart (the rest of a spec is bookkeeping: speed estimates, labels)
IDENTITY_KEYS = ("model", "model_config", "tokens", "seed", "resolved_lr", "batch_size", "evals", "warmup_frac",
                 "lr_mult", "data", "tokenizer")
PROGRESS_S = 60.0


@dataclass
class Job:
    spec: RunSpec
    run_dir: Path
    proc: subprocess.Popen | None = None
    started: float = 0.0
    start_step: int = 0  # the step its checkpoint held at launch (a resumed run)


def git_commit() -> str | None:
    """The source's commit: ``git rev-parse HEAD``, or a ``COMMIT`` file at the root of a copied tree (a frozen
    copy that runs the grid across sessions may have no git metadata)."""
    root = Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, cwd=root)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    stamp = root / "COMMIT"
    return stamp.read_text().strip() or None if stamp.is_file() else None


def read_records(results: Path) -> list[dict[str, Any]]:
    path = results / "runs.json"
    if not path.exists():
        return []
    try:
        recs = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e.msg} at line {e.lineno}); it holds the run records: "
                         f"restore it from git (git checkout -- {path}) or the run folders' record.json") from None
    if not isinstance(recs, list):
        raise ValueError(f"{path} must hold a JSON list of run records")
    for i, r in enumerate(recs):
        if not isinstance(r, dict) or not isinstance(r.get("name"), str) or not isinstance(r.get("group"), str):
            raise ValueError(f"{path}: record {i} is not a run record (an object with a 'name' and a 'group'), got "
                             f"{json.dumps(r)[:80]}")
    return recs


PROBES_FILE = "speed_probes.json"  # the wall-clock matches' speed probes, by run name


def read_probes(results: Path) -> dict[str, dict[str, Any]]:
    path = results / PROBES_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def merge_record(results: Path, rec: dict[str, Any], order: list[str]) -> None:
    """Put ``rec`` into ``runs.json`` (replacing a record of the same name), in grid order, atomically."""
    recs = {r["name"]: r for r in read_records(results)}
    recs[rec["name"]] = rec
    rank = {n: i for i, n in enumerate(order)}
    ordered = sorted(recs.values(), key=lambda r: (rank.get(r["name"], len(rank)), r["name"]))
    atomic_write_json(results / "runs.json", ordered)


def best_lr(sweep: str, records: dict[str, dict[str, Any]], specs: list[RunSpec]) -> float | None:
    """The lr of the sweep's run with the lowest sampled validation bits/byte, once every run of it is recorded
    (a diverged run counts as worst; the widening point its best needs included: :func:`studies.grid.sweep_points`);
    ``None`` while any is missing."""
    points = sweep_points(sweep, records, specs)
    return None if points is None else min((sweep_score(records[s.name]), s.lr) for s in points)[1]


def resolve(spec: RunSpec, records: dict[str, dict[str, Any]], specs: list[RunSpec],
            probes: dict[str, dict[str, Any]] | None = None, running: list[RunSpec] | None = None,
            prior: dict[str, float] | None = None) -> RunSpec | None:
    """The run with every field fixed (its lr from its sweep, its tokens or width from a wall-clock match, a
    tuning run's multipliers from its search), or ``None`` while a run it depends on is not recorded (or, for a
    wall-clock match, its speed probe not yet measured: saved in ``probes`` under :func:`probe_key`)."""
    if spec.imported:
        return spec  # not trained here: its lr and tokens come from its model card
    if spec.search is not None:
        return resolve_tuning(spec, records, specs, running or [], prior)
    if spec.tuned_from is not None:
        best = tuned_point(spec.tuned_from, records, specs)
        if best is None:
            return None
        spec = replace(spec, lr_mult=best)
    if spec.widens is not None and not widening_needed(spec, records, specs):
        return None  # undecided until its sweep's other points are recorded; or not needed
    lr = spec.lr if spec.lr is not None else best_lr(spec.sweep or "", records, specs)
    if lr is None:
        return None
    tokens, extra = spec.tokens, spec.extra
    if "match_width" in spec.extra:
        probe = (probes or {}).get(spec.variant)
        if probe is None:
            return None
        ref = next(s for s in specs if s.variant == spec.extra["match_width"])  # as fast: as often checkpointed
        spec = replace(spec, model_config=probe["model_config"], est_tok_s=ref.est_tok_s)
        extra = {**spec.extra, "wallclock_match": {k: v for k, v in probe.items() if k != "model_config"}}
    if spec.match_wallclock is not None:
        ref = records.get(spec.match_wallclock[0])
        probe = (probes or {}).get(spec.name)
        if ref is None or probe is None:
            return None
        tokens = round(ref["tokens"] * probe["speed_ratio"])
        extra = {**spec.extra, "wallclock_match": {k: v for k, v in probe.items() if k != "step_s"}}
    return replace(spec, lr=lr, tokens=tokens, extra=extra)


def probe_key(spec: RunSpec) -> str | None:
    """Where a run's speed probe is kept: a token match's under its name, a width match's under its variant (every
    lr of that model trains the same width); ``None`` for a run sized without one."""
    return spec.name if spec.match_wallclock is not None else spec.variant if "match_width" in spec.extra else None


def needs_probe(spec: RunSpec, records: dict[str, dict[str, Any]], probes: dict[str, dict[str, Any]]) -> bool:
    """A width match, or a wall-clock match whose two runs are recorded, whose speed probe is not measured yet."""
    key = probe_key(spec)
    return key is not None and key not in probes and all(n in records for n in spec.match_wallclock or ())


def measure_probe(spec: RunSpec, specs: list[RunSpec], records: dict[str, dict[str, Any]],
                  threads: int) -> dict[str, Any]:
    """The speed probe of a wall-clock match (:func:`studies.speed.probe`) with the two runs it compares and
    the ratio their own records' tokens/s would have given (kept for the record, not used); of a width match,
    the matched width (:func:`studies.speed.matched_width`)."""
    from studies.speed import matched_width, probe

    if spec.match_wallclock is None:
        ref = next(s for s in specs if s.variant == spec.extra["match_width"])
        return {**matched_width((ref.model, ref.model_config), spec.model_config, batch_size=spec.batch_size,
                                threads=threads, seed=spec.seed), "reference_variant": ref.variant}
    ref, fast = (next(s for s in specs if s.name == n) for n in spec.match_wallclock)
    out = probe((ref.model, ref.model_config), (fast.model, fast.model_config), batch_size=ref.batch_size,
                threads=threads, seed=spec.seed)
    r_rec, f_rec = records[ref.name], records[fast.name]
    return {**out, "reference_run": ref.name, "fast_run": fast.name, "reference_tokens": r_rec["tokens"],
            "records_ratio": f_rec["tok_per_s"] / r_rec["tok_per_s"]
            if r_rec.get("tok_per_s") and f_rec.get("tok_per_s") else None}


def last_step(run_dir: Path) -> int:
    """The last step a run folder's log records (0: none yet): training, evaluation, and the step a stop
    checkpointed or a resume started from (those two can be past the last training record)."""
    path = run_dir / "log.jsonl"
    if not path.exists():
        return 0
    for line in reversed(path.read_text().splitlines()[-50:]):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill
            continue
        if rec.get("event") in ("train", "eval", "stopped", "resume"):
            return int(rec["step"])
    return 0


def _duration(seconds: float) -> str:
    m = round(seconds / 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m"


def _progress(job: Job) -> str:
    """``name step/steps (elapsed, eta)``: the eta from this process's own steps per second (a resumed run counts
    from the step it resumed at), so it reads the current load."""
    step, total = last_step(job.run_dir), job.spec.steps()
    elapsed = time.perf_counter() - job.started
    done = step - job.start_step
    eta = f", eta {_duration((total - step) * elapsed / done)}" if done > 0 and step < total else ""
    return f"{job.spec.name} {step}/{total} ({elapsed:.0f}s{eta})"


def _field_default(key: str) -> Any:
    """A spec field's default: what a run folder started before the field existed was trained with."""
    from dataclasses import MISSING, fields

    f = next((f for f in fields(RunSpec) if f.name == key), None)
    if f is None or (f.default is MISSING and f.default_factory is MISSING):
        return None
    return f.default if f.default is not MISSING else f.default_factory()


class Driver:
    def __init__(self, args: argparse.Namespace, specs: list[RunSpec]) -> None:
        self.args, self.specs = args, specs
        self.runs_dir, self.results = Path(args.runs_dir), Path(args.results)
        self.all_specs = grid(args.grid)  # the whole grid: a final's sweep or a match's runs may be outside --only
        self.order = [s.name for s in self.all_specs]
        self.running: list[Job] = []
        self.failed: dict[str, str] = {}
        self.stopped: set[str] = set()
        self.stopping = False

    def say(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    def records(self) -> dict[str, dict[str, Any]]:
        return {r["name"]: r for r in read_records(self.results)}

    def pending(self) -> list[RunSpec]:
        done, busy = self.records(), {j.spec.name for j in self.running}
        skip = busy | set(self.failed) | self.stopped
        return [s for s in needed_specs(self.specs, done, self.all_specs) if s.name not in done and s.name not in skip]

    def prior_point(self, spec: RunSpec) -> dict[str, float] | None:
        """The lr multipliers a tuning run's folder was started with (a restart keeps them), if any."""
        path = self.runs_dir / spec.name / "spec.json"
        if spec.search is None or not path.is_file():
            return None
        return json.loads(path.read_text()).get("lr_mult")

    def launch(self, spec: RunSpec, lr: float) -> Job:
        run_dir = self.runs_dir / spec.name
        spec_path = run_dir / "spec.json"  # written first: its atomic write creates the folder
        want = json.loads(json.dumps({**spec.to_dict(), "resolved_lr": lr}))
        old = json.loads(spec_path.read_text()) if spec_path.exists() else None
        if old is not None and any(old.get(k, _field_default(k)) != want[k] for k in IDENTITY_KEYS):
            raise ValueError(f"{spec_path} describes a different run than the grid's {spec.name} (the grid changed "
                             f"since it started); move {run_dir} aside to start it again")
        atomic_write_json(spec_path, want)
        env = {**os.environ, "OMP_NUM_THREADS": str(self.args.threads), "MKL_NUM_THREADS": str(self.args.threads)}
        job = Job(spec, run_dir, start_step=last_step(run_dir))
        with (run_dir / "stderr.txt").open("a") as err:
            job.proc = subprocess.Popen([sys.executable, "-m", "studies.job", str(run_dir), str(self.args.threads)],
                                        stdout=subprocess.DEVNULL, stderr=err, env=env,
                                        cwd=Path(__file__).resolve().parents[1], start_new_session=True)
        job.started = time.perf_counter()
        mult = f", lr_mult {spec.lr_mult}" if spec.lr_mult else ""
        self.say(f"start {spec.name} ({spec.group}, {spec.model}, lr {lr:g}{mult}, {spec.steps()} steps)")
        return job

    def collect(self, job: Job) -> None:
        rc = job.proc.returncode
        rec_path = job.run_dir / "record.json"
        if rc in (0, 3) and rec_path.exists():
            rec = json.loads(rec_path.read_text())
            rec["commit"] = self.args.commit
            merge_record(self.results, rec, self.order)
            log = job.run_dir / "log.jsonl"
            if log.exists():  # (atomic writes create their folder)
                atomic_write_text(self.results / "logs" / f"{job.spec.name}.log.jsonl", log.read_text())
            claims = job.run_dir / "trained_claims.json"
            if claims.exists():  # the trained-model claims of the text-shape GRT, beside the shipped model's
                atomic_write_text(self.results / f"trained_claims_{job.spec.group}.json", claims.read_text())
            bpb = rec.get("val_bpb_full")
            self.say(f"done  {job.spec.name}: {rec['status']}, full-split {bpb if bpb is None else f'{bpb:.4f}'} "
                     f"bits/byte, {time.perf_counter() - job.started:.0f}s")
        elif rc == 130 or self.stopping:
            self.stopped.add(job.spec.name)  # not restarted by this driver: run the command again to continue
            self.say(f"stopped {job.spec.name} (checkpoint kept; run again to continue)")
        else:
            tail = (job.run_dir / "stderr.txt").read_text().strip().splitlines()[-1:] or ["(no message)"]
            self.failed[job.spec.name] = tail[0]
            self.say(f"FAILED {job.spec.name} (exit {rc}): {tail[0]}")

    def step(self) -> bool:
        """Collect finished jobs, start ready ones; ``False`` when nothing is running or startable."""
        for job in [j for j in self.running if j.proc.poll() is not None]:
            self.running.remove(job)
            self.collect(job)
        if self.stopping:
            return bool(self.running)
        records = self.records()
        for spec in self.pending():
            if len(self.running) >= self.args.jobs:
                break
            probes = read_probes(self.results)
            if needs_probe(spec, records, probes):
                key = probe_key(spec) or ""
                self.say(f"speed probe for {key}: alternating training steps in this process ...")
                p = probes[key] = measure_probe(spec, self.all_specs, records, self.args.threads)
                atomic_write_json(self.results / PROBES_FILE, probes)
                by_width = ", ".join(f"{w['d_model']} {w['speed_ratio']:.2f}" for w in p.get("widths", []))
                self.say(f"speed probe for {key}: " + (
                    f"width {p['d_model']} (speed ratio by width: {by_width})" if "widths" in p else
                    f"{p['fast_tok_s']:,.0f} vs {p['reference_tok_s']:,.0f} tokens/s, ratio {p['speed_ratio']:.3f} "
                    f"(the records' own tokens/s gave {p['records_ratio'] or math.nan:.3f})"))
            fixed = resolve(spec, records, self.all_specs, probes, running=[j.spec for j in self.running],
                            prior=self.prior_point(spec))
            if fixed is None:
                continue
            try:
                self.running.append(self.launch(fixed, fixed.lr or 0.0))
            except ValueError as e:  # its folder holds another run: never overwritten, and the jobs already
                self.failed[spec.name] = str(e)  # running must not be orphaned by a driver that exits here
                self.say(f"NOT STARTED {spec.name}: {e}")
        return bool(self.running)

    def stop(self, signum: int, frame: Any) -> None:
        if not self.stopping:
            self.say("stopping: the running jobs write a checkpoint and exit (Ctrl-C again does not hurry them)")
        self.stopping = True
        for job in self.running:
            if job.proc.poll() is None:
                job.proc.send_signal(signal.SIGINT)

    def run(self) -> int:
        last = 0.0
        while self.step():
            if time.perf_counter() - last > PROGRESS_S and self.running:
                last = time.perf_counter()
                left = len(self.pending())
                self.say("running: " + "; ".join(_progress(j) for j in self.running) + f" | {left} waiting")
            time.sleep(POLL_S if self.args.grid == "full" else 0.2)
        if self.stopping or self.stopped:
            return 130
        waiting = [s.name for s in self.pending()]  # failed runs are not pending
        if self.failed:
            self.say(f"{len(self.failed)} run(s) failed or could not start: {', '.join(sorted(self.failed))} "
                     f"(see the lines above and their stderr.txt)")
        if waiting:
            self.say(f"{len(waiting)} run(s) could not start (a run they depend on failed): {', '.join(waiting)}")
        self.say(f"{len(self.records())} records in {self.results / 'runs.json'}")
        return 1 if self.failed or waiting else 0


def build_parser() -> argparse.ArgumentParser:
    ap = make_parser("python -m studies.experiments", __doc__)
    sub = add_subcommands(ap)
    for name, text in (("run", "train every run not yet recorded (resumes unfinished ones)"),
                       ("status", "which runs are recorded, unfinished or waiting"),
                       ("summary", "tables and verdicts from the records")):
        p = add_subcommand(sub, name, text)
        p.add_argument("--grid", default="full", choices=GRIDS, help="full: the experiment grid; tiny: a seconds-long "
                       "grid of the same shape (tests)")
        p.add_argument("--results", default=DEFAULT_RESULTS, help=f"records, logs, tables (default {DEFAULT_RESULTS})")
        p.add_argument("--runs-dir", default=DEFAULT_RUNS_DIR,
                       help=f"run folders with checkpoints (default {DEFAULT_RUNS_DIR}; not committed)")
        p.add_argument("--groups", default=",".join(DEFAULT_GROUPS),
                       help=f"comma list of {', '.join(GROUPS)} (default: all but reference, whose records are "
                            f"results/compare-reference's)")
        if name == "run":
            p.add_argument("--only", action="append", default=[], metavar="NAME", help="only these runs")
            p.add_argument("--jobs", type=int, default=2, help="runs at a time, in [1, 64] (default 2)")
            p.add_argument("--threads", type=int, default=1, help="CPU threads per run, in [1, 64] (default 1)")
        if name == "summary":
            p.add_argument("--json", metavar="PATH", help="also write the tables and verdicts as JSON")
            p.add_argument("--verbose", action="store_true", help="every run's row, not only the tables")
    return ap


def _check(args: argparse.Namespace) -> list[RunSpec]:
    from rmsgauge.cli import check_output_file, check_outputs_against_inputs

    everything = grid(args.grid)
    groups = [g for g in args.groups.split(",") if g]
    if not groups or any(g not in GROUPS for g in groups):
        raise ValueError(f"--groups must be a comma list of {', '.join(GROUPS)}, got {args.groups!r}")
    specs = [s for s in everything if s.group in groups]
    if args.command != "run":
        if getattr(args, "json", None) is not None:  # the records, logs and probes it reads are never replaced
            check_output_file("--json", args.json)
            check_outputs_against_inputs({"--results": args.results, "--runs-dir": args.runs_dir},
                                         {"--json": args.json})
        return specs
    for name in ("jobs", "threads"):
        v = getattr(args, name)
        if not 1 <= v <= 64:
            raise ValueError(f"--{name} must be an integer in [1, 64], got {v}")
    names = {s.name for s in everything}
    unknown = [n for n in args.only if n not in names]
    if unknown:
        raise ValueError(f"--only: no run called {unknown[0]!r} in the {args.grid} grid (see the status command)")
    runs, res = Path(args.runs_dir).resolve(), Path(args.results).resolve()
    if runs == res or res in runs.parents or runs in res.parents:
        raise ValueError(f"--runs-dir ({args.runs_dir}) and --results ({args.results}) must be separate folders "
                         f"(checkpoints are not results)")
    for p in (runs, res):
        if p.exists() and not p.is_dir():
            raise ValueError(f"{p} exists and is not a folder")
    return [s for s in specs if not args.only or s.name in args.only]


def status(args: argparse.Namespace, specs: list[RunSpec]) -> int:
    recs = {r["name"]: r for r in read_records(Path(args.results))}
    counts: dict[str, dict[str, int]] = {}
    everything = grid(args.grid)
    for s in specs:
        run_dir = Path(args.runs_dir) / s.name
        state = ("recorded" if s.name in recs else "unfinished" if (run_dir / "ckpt.pt").exists()
                 else "not needed" if widening_needed(s, recs, everything) is False else "waiting")
        counts.setdefault(s.group, {"recorded": 0, "unfinished": 0, "waiting": 0, "not needed": 0})[state] += 1
        if state != "waiting":
            at = f" at step {last_step(run_dir):,} of {s.steps():,}" if state == "unfinished" and s.tokens > 0 else ""
            print(f"  {s.name:34s} {state}{at}")
    for g, c in counts.items():
        print(f"{g:11s} {c['recorded']:3d} recorded, {c['unfinished']:3d} unfinished, {c['waiting']:3d} waiting"
              + (f", {c['not needed']:d} widening point(s) not needed" if c["not needed"] else ""))
    return 0


def _work(args: argparse.Namespace, specs: list[RunSpec]) -> int:
    if args.command == "status":
        return status(args, specs)
    if args.command == "summary":
        from studies.experiments_report import summary

        path = Path(args.results) / "runs.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no records yet (python -m studies.experiments run writes them)")
        return summary(read_records(Path(args.results)), path, specs, json_path=args.json, verbose=args.verbose)
    if any(s.group == "reference" for s in specs):  # the comparison compares like with like, or trains nothing
        from studies.reference_report import param_match_claim

        cfg = {s.variant: s.model_config for s in grid(args.grid)}
        claim = param_match_claim(cfg["reference-grt"], cfg["reference-dense-params"])
        if not claim.holds:
            raise Failure(f"{claim.id} fails ({claim.summary}; {claim.details}): no reference run started")
    Path(args.runs_dir).mkdir(parents=True, exist_ok=True)
    Path(args.results).mkdir(parents=True, exist_ok=True)
    with (Path(args.runs_dir) / ".driver.lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"another python -m studies.experiments run is using {args.runs_dir} (its lock "
                             f"{args.runs_dir}/.driver.lock is held); wait for it or stop it first") from None
        args.commit = git_commit()
        driver = Driver(args, specs)
        signal.signal(signal.SIGINT, driver.stop)
        signal.signal(signal.SIGTERM, driver.stop)
        return driver.run()


def main(argv: list[str] | None = None) -> int:
    return run_main(build_parser(), argv, _work, check=_check)


if __name__ == "__main__":
    sys.exit(main())
