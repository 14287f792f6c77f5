"""Plant realistic one-line bugs, one at a time, and report which check catches each.

``python -m tools.mutate`` copies the working tree (without ``.git``, runs, figure output, byte code and
numba's kernel cache) into a temporary folder once per mutation, gives each mutant a fresh kernel cache
(:func:`mutant_env`), replaces one line there (never in the working tree), runs the checks
named for that mutation in the copy, and prints a table: mutation, the checks that caught it, the score.
A check *catches* a bug when it fails: a claim prints FAILS (exit status 1) or a pytest run fails.

    python -m tools.mutate                 # all mutations (~15 min on 2 cores: fresh kernel caches)
    python -m tools.mutate --only stride_off_by_one,census_powers_of_two
    python -m tools.mutate --list
    python -m tools.mutate --json out.json # the results as JSON (written atomically)

A mutation whose line is not in the file is reported ``not applied`` (the code changed: update the
mutation), never counted as caught.  Exit status 0 when every applied mutation is caught, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rmsgauge import atomic_write_json, check_output_file
from rmsgauge.cli import make_parser, run_main

ROOT = Path(__file__).resolve().parent.parent
# left out of the copy: git, runs, figure output, byte code and numba's on-disk kernel cache (every __pycache__)
IGNORE = shutil.ignore_patterns(".git", "runs", "out", "*.egg-info", ".hypothesis", "*.pt", "__pycache__", "*.pyc",
                                "*.nbi", "*.nbc")


def mutant_env(root: Path) -> dict[str, str]:
    """The environment of a mutant's checks: the copy first on the path, no byte code written, and a fresh numba
    kernel cache of its own (``$NUMBA_CACHE_DIR`` inside the mutant's temporary folder, empty at the start).

    Why fresh: a cache carried over from another tree is only as good as its key; a key that missed an edit to a
    callee kernel file would run the mutated kernel's unmutated machine code, and a "caught" could not be trusted.
    A mutant whose checks run the fused kernels pays their compile (about a minute)."""
    return {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1",
            "NUMBA_CACHE_DIR": str(root.parent / "numba-cache")}
TINY_GAUGE = ["gauge.py", "--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--batch-size", "2", "--block-size",
              "8", "--train-steps", "2", "--dtype", "float64", "--quiet"]
GRT_CLAIMS = ("import sys; from grt_model.claims import CLAIMS; from rmsgauge import run_claims; "
              "cs = run_claims(CLAIMS, seed=0, only=tuple(sys.argv[1:])); "
              "bad = [c.id for c in cs if not c.holds]; print('FAILS', bad); sys.exit(1 if bad else 0)")


def grt(*ids: str) -> tuple[str, list[str]]:
    """A check: ``python -m grt_model --claims`` restricted to ``ids`` (the same records, fewer of them)."""
    return "grt " + ",".join(i.removeprefix("grt.") for i in ids), [sys.executable, "-c", GRT_CLAIMS, *ids]


def pytest(path: str, k: str) -> tuple[str, list[str]]:
    """A check: one test file, the tests matching ``-k``."""
    return f"pytest {Path(path).name} -k {k}", [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:xdist",
                                                 "-p", "no:randomly", path, "-k", k]


GAUGE_CLI = ("python gauge.py (tiny)", [sys.executable, *TINY_GAUGE])
# in float32 the census's weakest non-gauge sits within a few tolerances of the bound: a looser bound flips it
GAUGE_CLI_F32 = ("python gauge.py (tiny, float32)", [sys.executable, *TINY_GAUGE[:-2], "float32", "--quiet"])


@dataclass
class Mutation:
    name: str
    path: str  # relative to the repository root
    old: str  # the exact line fragment replaced (must occur exactly once)
    new: str
    why: str
    checks: list[tuple[str, list[str]]] = field(default_factory=list)


MUTATIONS = [
    Mutation("rotation_sign", "grt_model/cascade_ops.py", "c, sn = torch.cos(theta), torch.sin(theta)",
             "c, sn = torch.cos(theta), -torch.sin(theta)", "eager cascade turns clockwise",
             [grt("grt.butterfly_wiring", "grt.fast_equals_reference")]),
    Mutation("stride_off_by_one", "grt_model/butterfly.py", "return 1 << (stage % n_strides(width))",
             "return 1 << ((stage + 1) % n_strides(width))", "stage s uses the stride of stage s+1",
             [grt("grt.butterfly_wiring")]),
    Mutation("wrong_pairing", "grt_model/butterfly.py", "(2 * h * j + k, 2 * h * j + h + k)",
             "(2 * h * j + 2 * k, 2 * h * j + 2 * k + 1)", "written-out pairs always adjacent",
             [grt("grt.butterfly_wiring", "grt.fast_equals_reference")]),
    Mutation("softplus_to_exp", "grt_model/cascade_ops.py", "scales = F.softplus(raw_scales)",
             "scales = torch.exp(raw_scales)", "eager scales exp instead of softplus",
             [grt("grt.fast_equals_reference", "grt.jacobian")]),
    Mutation("clifford_area_sign", "grt_model/cascade_ops.py",
             "area = x0 * x1.roll(-1, dims=-1) - x1 * x0.roll(-1, dims=-1)",
             "area = x1 * x0.roll(-1, dims=-1) - x0 * x1.roll(-1, dims=-1)", "signed area flipped in the eager path",
             [grt("grt.fast_equals_reference")]),
    Mutation("fused_backward_factor", "grt_model/kernels/fused.py", "return gx, g_ang, g_raw, None, None, None, None",
             "return 1.01 * gx, g_ang, g_raw, None, None, None, None", "fused backward 1% too large",
             [grt("grt.fast_equals_reference")]),
    Mutation("kernel_angle_grad_factor", "grt_model/kernels/coupled.py", "gth[p] += acc_t",
             "gth[p] += 1.01 * acc_t", "coupled kernel's angle gradient 1% too large (a callee kernel file)",
             [pytest("tests/test_fast_cascade.py", "fused_matches_eager")]),
    Mutation("pearlnorm_mean_to_max", "grt_model/pearlnorm.py", "return safe_pair_radius(x).mean(dim=-1, keepdim=True)",
             "return safe_pair_radius(x).amax(dim=-1, keepdim=True)", "PearlNorm divides by the largest radius",
             [grt("grt.pearlnorm_invariance")]),
    Mutation("radial_gelu_per_coordinate", "grt_model/radial_gelu.py", "r2 = (v * v).sum(dim=-1, keepdim=True)",
             "r2 = v * v", "GELU of each coordinate's magnitude, not the pair radius",
             [grt("grt.radial_gelu_angle")]),
    Mutation("embedding_cos_sin_swapped", "grt_model/embedding.py", "(r * torch.cos(phi), r * torch.sin(phi))",
             "(r * torch.sin(phi), r * torch.cos(phi))", "x0 = r sin, x1 = r cos",
             [grt("grt.embedding_rebuild")]),
    Mutation("tolerance_1e6", "rmsgauge/tolerance.py", "DEFAULT_SAFETY = 16.0", "DEFAULT_SAFETY = 16.0e6",
             "every round-off tolerance a million times looser",
             [pytest("tests/test_foundation.py", "tolerance"), GAUGE_CLI_F32]),
    Mutation("equilibrium_law", "dynamics/laws.py", "return (q + momentum) / (1.0 + momentum * q)",
             "return (q + momentum) / (1.0 + momentum)", "momentum equilibrium angle law",
             [pytest("tests/test_dynamics.py", "equilibrium_angle")]),
    Mutation("census_powers_of_two", "gauge/model.py", "census_c: tuple[float, ...] = (10.0, 0.1)",
             "census_c: tuple[float, ...] = (2.0, 0.5)", "census scales exact in floats",
             [pytest("tests/test_gauge.py", "census_scales"), GAUGE_CLI]),
    Mutation("euler_measures_k_proj", "gauge/model.py",
             "return self.models[dtype].blocks[self.config.layer].attn.q_proj.weight",
             "return self.models[dtype].blocks[self.config.layer].attn.k_proj.weight",
             "the Euler check measures W_k while its label says W_q",
             [pytest("tests/test_gauge.py", "measured_tensor")]),
    Mutation("rmsnorm_hidden_eps", "lm/rmsnorm.py", "keepdim=True) + eps)  # (..., 1)\n    out = z / rho",
             "keepdim=True) + eps + 1e-6)  # (..., 1)\n    out = z / rho",
             "an eps hidden inside RMSNorm", [GAUGE_CLI]),
    Mutation("rmsnorm_jacobian_closed_form", "lm/rmsnorm.py", "return (eye - outer / (n * rho.unsqueeze(-1) ** 2))",
             "return (eye - outer / (rho.unsqueeze(-1) ** 2))", "closed-form Jacobian misses 1/n",
             [pytest("tests/test_gauge.py", "jacobian_null_space")]),
    Mutation("census_instancenorm_eval_rule", "gauge/census/norms.py", "m.training or not m.track_running_stats",
             "m.training and not m.track_running_stats",
             "InstanceNorm's reason says running statistics where it normalizes by its own (the verdict is measured)",
             [pytest("tests/test_census_families.py", "instancenorm")]),
    Mutation("stability_bound_against_final", "studies/job.py", "max_train <= BLOWUP_FACTOR * initial",
             "max_train <= BLOWUP_FACTOR * final",
             "the blow-up bound measured against the final loss: a run that fell far reads as blown up",
             [pytest("tests/test_experiments.py", "stability_rule")]),
    Mutation("content_adaptive_smaller_spread", "studies/experiments_report.py",
             'spread_tok, spread_wall = (max(ship["seed_range"], r["seed_range"]) for r in (off, off_wall))',
             'spread_tok, spread_wall = (min(ship["seed_range"], r["seed_range"]) for r in (off, off_wall))',
             "the coupling's gap compared with the smaller seed range: a gap inside the noise reads as a verdict",
             [pytest("tests/test_experiments.py", "spread_is_the_larger")]),
    Mutation("monitor_x0_after_step", "dynamics/monitor/equilibrium.py", "self._x0.setdefault(g.name, norm0**2)",
             "self._x0.setdefault(g.name, norm**2)",
             "the monitor's first squared norm x0 read after the first step instead of before it",
             [pytest("tests/test_monitor.py", "x0_is_the_squared_norm_before_the_first_step")]),
    Mutation("hf_import_unlisted_files", "lm/checkpoint.py",
             "unlisted = [n for n in folder_entries(folder) if n not in listed]", "unlisted = []",
             "an export folder's files off its SHA256SUMS are trusted: code trust_remote_code runs goes unchecked",
             [pytest("tests/test_hf.py", "import_refuses_a_file_the_sums_do_not_cover")]),
]


@dataclass
class Result:
    name: str
    applied: bool
    caught_by: list[str]
    missed_by: list[str]
    seconds: float
    note: str = ""


def run_one(m: Mutation, timeout: float = 900.0) -> Result:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"mutate-{m.name}-") as tmp:
        root = Path(tmp) / "repo"
        shutil.copytree(ROOT, root, ignore=IGNORE)
        target = root / m.path  # the copy's file: the working tree is never touched
        text = target.read_text(encoding="utf-8")
        if text.count(m.old) != 1:
            return Result(m.name, False, [], [], time.perf_counter() - t0, f"line not found in {m.path}")
        target.write_text(text.replace(m.old, m.new), encoding="utf-8")
        env = mutant_env(root)
        caught, missed = [], []
        for label, cmd in m.checks:
            try:
                rc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                rc = None
            (caught if rc not in (0, None) else missed).append(label if rc is not None else f"{label} (timed out)")
    return Result(m.name, True, caught, missed, time.perf_counter() - t0)


def score(results: list[Result]) -> tuple[int, int]:
    applied = [r for r in results if r.applied]
    return sum(bool(r.caught_by) for r in applied), len(applied)


def build_parser() -> argparse.ArgumentParser:
    ap = make_parser("python -m tools.mutate", __doc__, usage="%(prog)s [options]")
    ap.add_argument("--only", default=None, help="comma-separated mutation names (default: all)")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON (atomic)")
    return ap


def check(args: argparse.Namespace) -> list[str]:
    """The mutations to run and the output path, before any copy is made (a ``ValueError``: exit 2)."""
    names = [m.name for m in MUTATIONS]
    chosen = names if args.only is None else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in names]
    if unknown or not chosen:
        raise ValueError(f"--only must name mutations among {', '.join(names)}; got {args.only!r}")
    check_output_file("--json", args.json)
    return chosen


def work(args: argparse.Namespace, chosen: list[str]) -> int:
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:30s} {m.path:28s} {m.why}")
        return 0
    results = []
    for m in MUTATIONS:
        if m.name in chosen:
            print(f"mutation {m.name}: {m.why} ...", file=sys.stderr, flush=True)
            results.append(run_one(m))
    print(f"{'mutation':30s} {'caught by':58s} {'s':>5s}")
    for r in results:
        what = ", ".join(r.caught_by) if r.caught_by else ("NOT CAUGHT" if r.applied else f"not applied: {r.note}")
        print(f"{r.name:30s} {what[:58]:58s} {r.seconds:5.0f}")
    caught, applied = score(results)
    print(f"{caught} of {applied} planted bugs caught")
    if args.json:
        atomic_write_json(args.json, {"caught": caught, "applied": applied, "results": [asdict(r) for r in results]})
    return 0 if caught == applied else 1


def main(argv: list[str] | None = None) -> int:
    return run_main(build_parser(), argv, work, check=check)


if __name__ == "__main__":
    sys.exit(main())
