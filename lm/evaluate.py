"""lm-evaluation-harness on a GRT or dense model: ``python -m lm.evaluate`` (``pip install -e ".[eval]"``).

    python -m lm.evaluate --model-dir DIR --tasks hellaswag,arc_easy,piqa [--num-fewshot N] [--json PATH]
    python -m lm.evaluate --reference grt --tasks my_task --include-path my_tasks/   # local task YAML

``DIR`` (``python -m lm.hf export``) is checked against its ``SHA256SUMS`` and a shipped model against its card
before any work; every task is loaded and every document rendered first too, so a broken task is one line naming
it.  The harness's ``hf`` model does the work; an empty context and a rolling request's first window are
conditioned on ``"\n"`` (the tokenizer's BOS).  **The claim** ``lm.harness_equals_direct_loglik``: the harness's
log-likelihood of every request of the first :data:`CLAIM_DOCS` documents of each task equals the module's own,
within the float32 tolerance; exit 1 when it fails.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch

from lm.dist import check_device, resolve_device
from lm.reference import NAMES, load_model, model_inputs
from rmsgauge import Claim, atomic_write_json, check_output_file, check_range, json_safe, tolerance
from rmsgauge.cli import check_outputs_against_inputs, make_parser, one_line, run_main
from rmsgauge.corpus import encode

EXTRA_HINT = 'pip install -e ".[eval]"'
NEWLINE_ID = 10  # the byte tokenizer's BOS / prefix token ("\n")
CLAIM_DOCS = 8  # documents per task whose requests the claim recomputes directly


def _require_harness():
    try:
        import lm_eval
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError as e:  # the extra is optional: say which one to install
        raise ModuleNotFoundError(f"python -m lm.evaluate needs lm-evaluation-harness: {EXTRA_HINT} ({e})") from e
    import lm.hf_classes  # noqa: F401  registers the GRT / dense classes with the Auto factories

    return lm_eval, HFLM, TaskManager


def load_tasks(tasks: list[str], *, include_path: str | os.PathLike | None = None, include_defaults: bool = True,
               limit: int | None = None) -> tuple[Any, dict[str, Any]]:
    """``(task_manager, {name: task})`` with every document of every task rendered once (:func:`check_task`)."""
    _, _, TaskManager = _require_harness()
    manager = TaskManager(include_path=str(include_path) if include_path else None, include_defaults=include_defaults)
    with _quiet_loading():
        try:
            loaded = manager.load(list(tasks))
        except Exception as e:  # the harness and datasets raise many kinds for a bad task or data file
            raise ValueError(f"--tasks {','.join(tasks)}: cannot load: {_why(e)}") from None
        for name, task in loaded["tasks"].items():
            check_task(name, task, limit)
    return manager, loaded["tasks"]


def _why(e: BaseException) -> str:
    """What a task-loading error means, in words (the harness reads the first document while it builds a task)."""
    import traceback

    frames = traceback.extract_tb(e.__traceback__)
    names = [f.name for f in frames]
    if isinstance(e, StopIteration) and any("datasets" in f.filename for f in frames):
        return "its data file holds no documents (empty data)"
    if names and names[-1] == "doc_to_target":
        return "its first document gives no target (does the task's YAML set doc_to_target?)"
    if isinstance(e, IndexError) and any(f.name == "__init__" and "lm_eval" in f.filename for f in frames):
        return "its first document's target is not an index into its choices"
    if type(e).__name__ == "DatasetGenerationError":
        return f"a data file does not parse ({one_line(e.__cause__ or e)[:200]})"
    return f"{type(e).__name__}: {one_line(e)[:240]}"


@contextlib.contextmanager
def _quiet_loading():
    """While the tasks load: no dataset progress bars, and no library log of a failure our one line reports."""
    import datasets

    loggers = [logging.getLogger(n) for n in ("datasets", "lm_eval")]
    levels, bars = [lg.level for lg in loggers], not datasets.are_progress_bars_disabled()
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
        if bars:
            datasets.enable_progress_bars()


def check_task(name: str, task: Any, limit: int | None = None) -> None:
    """Render every evaluation document's text, target and choices; refuse (``ValueError`` naming the task and the
    document) an empty split, a template field the document lacks, a missing target, an index outside the choices."""
    try:
        docs = list(task.eval_docs)
    except Exception as e:
        raise ValueError(f"task {name}: cannot read its documents ({type(e).__name__}: {one_line(e)[:200]})") from None
    if not docs:
        raise ValueError(f"task {name}: its evaluation split holds no documents (empty data)")
    mc = task.get_config("output_type") == "multiple_choice"
    for i, doc in enumerate(docs[:limit] if limit else docs):
        try:
            task.doc_to_text(doc)
            target = task.doc_to_target(doc)
            choices = task.doc_to_choice(doc) if mc else None
        except Exception as e:
            raise ValueError(f"task {name}, document {i}: {type(e).__name__}: {one_line(e)[:200]} (check the "
                             f"task's doc_to_text / doc_to_target / doc_to_choice and its data)") from None
        if target is None or (isinstance(target, str) and not target and mc):
            raise ValueError(f"task {name}, document {i}: no target (the task needs doc_to_target)")
        if mc:
            if not choices:
                raise ValueError(f"task {name}, document {i}: no choices")
            idx = target if isinstance(target, int) else (choices.index(target) if target in choices else None)
            if idx is None or not 0 <= idx < len(choices):
                raise ValueError(f"task {name}, document {i}: target {target!r} is not one of its {len(choices)} "
                                 f"choices (an index in [0, {len(choices) - 1}] or a choice's text)")


def evaluate(model_or_dir: str | os.PathLike | torch.nn.Module, tasks: list[str], *,
             include_path: str | os.PathLike | None = None, include_defaults: bool = True,
             num_fewshot: int | None = None, batch_size: int = 1, device: str = "cpu", limit: int | None = None,
             log_samples: bool = False, bootstrap_iters: int = 0, task_manager: Any = None) -> dict[str, Any]:
    """Run harness ``tasks`` on ``model_or_dir`` (a ``save_pretrained`` folder, or a project module wrapped in
    memory); returns the harness's results dict.  ``bootstrap_iters=0`` skips the (slow, random) bootstrap errors;
    ``include_defaults=False`` indexes only ``include_path``."""
    lm_eval, HFLM, TaskManager = _require_harness()
    if isinstance(model_or_dir, torch.nn.Module):
        from lm.hf_classes import ByteTokenizer, wrap

        hf = wrap(model_or_dir.float().to(device).eval())
        tok = ByteTokenizer(model_max_length=hf.config.max_position_embeddings)
        model = HFLM(pretrained=hf, tokenizer=tok, backend="causal", batch_size=batch_size)
    else:
        model = HFLM(pretrained=str(model_or_dir), backend="causal", device=device, batch_size=batch_size,
                     dtype="float32")
    manager = task_manager or TaskManager(include_path=str(include_path) if include_path else None,
                                          include_defaults=include_defaults)
    return lm_eval.simple_evaluate(model=model, tasks=list(tasks), num_fewshot=num_fewshot, limit=limit,
                                   task_manager=manager, log_samples=log_samples, bootstrap_iters=bootstrap_iters)


@torch.no_grad()
def _logprobs(model: torch.nn.Module, inp: list[int]) -> torch.Tensor:
    """``[len(inp), V]`` float64 log-probabilities of the byte after each input position (one forward pass)."""
    logits, _ = model(torch.tensor([inp], device=next(model.parameters()).device))
    return torch.log_softmax(logits[0].double(), dim=-1).cpu()


def direct_loglik(model: torch.nn.Module, context: str, continuation: str) -> float:
    """log p(continuation | context) from the module: trailing spaces of the context move to the continuation (the
    harness's split), an empty context is the prefix ``"\\n"``, the input is left-truncated to one window."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    ctx = encode(context).tolist() or [NEWLINE_ID]
    cont = encode(continuation).tolist()
    seq = (ctx + cont)[-(int(model.config.block_size) + 1):]
    lp = _logprobs(model, seq[:-1])[-len(cont):]
    return float(lp[torch.arange(len(cont)), torch.tensor(cont)].sum())


def direct_rolling_loglik(model: torch.nn.Module, text: str) -> float:
    """Sum of log p(byte) over ``text`` in disjoint windows of ``block_size`` predictions, each reading the
    ``block_size`` bytes before its last prediction (the first window starts from the prefix ``"\\n"``)."""
    block = int(model.config.block_size)
    toks = encode(text).tolist()
    seq = [NEWLINE_ID, *toks]  # seq[i] is the input that predicts toks[i]
    total = 0.0
    for a in range(0, len(toks), block):
        b = min(a + block, len(toks))
        lo = max(0, b - block)
        lp = _logprobs(model, seq[lo:b])[a - lo:]
        total += float(lp[torch.arange(b - a), torch.tensor(toks[a:b])].sum())
    return total


def _requests(sample: dict) -> list[tuple]:
    """The request arguments of one logged sample: a list of tuples (older harnesses) or ``gen_args_i`` dicts."""
    args = sample.get("arguments")
    if isinstance(args, dict):
        return [tuple(v[k] for k in sorted(v)) for _, v in sorted(args.items(), key=lambda kv: int(kv[0].rsplit(
            "_", 1)[-1]))]
    return [tuple(a) if isinstance(a, (list, tuple)) else (a,) for a in (args or [])]


def _response(r: Any) -> float:
    while isinstance(r, (list, tuple)):
        r = r[0]
    return float(r)


def harness_claim(model: torch.nn.Module, results: dict[str, Any], n_docs: int = CLAIM_DOCS) -> Claim:
    """Recompute the first ``n_docs`` documents' requests of every log-likelihood task directly and compare."""
    size = int(model.config.block_size) * int(model.config.d_model)
    worst, n, bad = 0.0, 0, []
    for task, samples in (results.get("samples") or {}).items():
        for s in sorted(samples, key=lambda s: s["doc_id"])[:n_docs]:
            for args, resp in zip(_requests(s), s.get("resps") or []):
                if len(args) == 2 and all(isinstance(a, str) for a in args):
                    direct = direct_loglik(model, *args)
                elif len(args) == 1 and isinstance(args[0], str):
                    direct = direct_rolling_loglik(model, args[0])
                else:  # generation requests: not a log-likelihood
                    continue
                got = _response(resp)
                tol = tolerance("float32", size=size, scale=max(1.0, abs(direct)))
                err = abs(got - direct) if math.isfinite(got) else math.inf
                worst, n = max(worst, err / tol.bound(direct)), n + 1
                if not tol.holds(err, direct):
                    bad.append({"task": task, "doc": s["doc_id"], "harness": got, "direct": direct})
    return Claim(
        id="lm.harness_equals_direct_loglik",
        statement="lm-evaluation-harness scores the project model exactly as the model scores the bytes itself",
        stated=None, measured={"requests": n, "max_error_over_tolerance": worst}, tolerance=1.0,
        holds=n > 0 and not bad, dtype="float32", source_status="unstated",
        exact_law="harness log p(continuation | context) = sum of the module's log-softmax over the continuation's "
                  "bytes (left-truncated window, prefix '\\n' for an empty context); rolling: disjoint windows",
        details={"documents_per_task": n_docs, "mismatches": bad[:5]})


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("python -m lm.evaluate", "Run lm-evaluation-harness tasks on a GRT or dense save_pretrained "
                    "folder, and check that the harness's log-likelihoods equal the model's own (exit 1 if not). "
                    "Exit status 2: a usage error, a task that does not load or render (nothing written).",
                    formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model-dir", help="folder written by python -m lm.hf export")
    src.add_argument("--reference", metavar="NAME", choices=NAMES,
                     help=f"a shipped model by name ({', '.join(NAMES)}), verified against its model card")
    p.add_argument("--tasks", required=True, help="comma-separated harness task names")
    p.add_argument("--include-path", help="folder of extra task YAML files (local data_files)")
    p.add_argument("--only-include-path", action="store_true",
                   help="index only --include-path, not the harness's built-in tasks (faster start)")
    p.add_argument("--num-fewshot", type=int, help="few-shot examples (task default when unset)")
    p.add_argument("--batch-size", type=int, default=1, help="requests per forward pass")
    p.add_argument("--limit", type=int, help="at most this many documents per task (quick checks)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--bootstrap-iters", type=int, default=0, help="bootstrap resamples for stderr; 0 = none")
    p.add_argument("--json", metavar="PATH", help="write the harness's results and the claim record (atomic)")
    p.add_argument("--trust-unverified", action="store_true",
                   help="evaluate a folder that has no SHA256SUMS (refused without this flag)")
    return p


def _check(args: argparse.Namespace) -> tuple[list[str], Any, torch.nn.Module]:
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    for flag, value, lo in (("--batch-size", args.batch_size, 1), ("--bootstrap-iters", args.bootstrap_iters, 0),
                            ("--num-fewshot", args.num_fewshot, 0), ("--limit", args.limit, 1)):
        if value is not None:  # --num-fewshot and --limit are optional
            check_range(flag, value, lo)
    if not tasks:
        raise ValueError("--tasks must name at least one task, e.g. --tasks hellaswag,piqa")
    if args.only_include_path and not args.include_path:
        raise ValueError("--only-include-path needs --include-path FOLDER")
    if args.include_path and not Path(args.include_path).is_dir():
        raise ValueError(f"--include-path {args.include_path} is not a folder")
    resolve_device(check_device("--device", args.device, ("cpu", "cuda")), name="--device")
    check_output_file("--json", args.json)
    inputs = {"--model-dir": args.model_dir, "--include-path": args.include_path,
              "--reference": model_inputs(reference=args.reference) if args.reference else None}
    check_outputs_against_inputs(inputs, {"--json": args.json})
    if args.reference:
        module, _ = load_model(reference=args.reference, device=args.device)
    else:  # verified (SHA256SUMS, loader shim) and loaded once: the harness reads the folder, the claim this module
        from lm.hf import load_verified

        module = load_verified(args.model_dir, trust_unverified=args.trust_unverified)[0].model
    manager, loaded = load_tasks(tasks, include_path=args.include_path, include_defaults=not args.only_include_path,
                                 limit=args.limit)
    check_outputs_against_inputs({**inputs, "a task's data file": _data_files(loaded)}, {"--json": args.json})
    return tasks, manager, module


def _data_files(loaded: dict[str, Any]) -> list[str]:
    """The local files the tasks read (``dataset_kwargs.data_files``), for the output/input check."""
    out: list[str] = []
    for task in loaded.values():
        files = ((task.get_config("dataset_kwargs") or {}).get("data_files")) or []
        for v in files.values() if isinstance(files, dict) else [files]:
            out += [str(f) for f in (v if isinstance(v, (list, tuple)) else [v]) if Path(str(f)).exists()]
    return out


def _work(args: argparse.Namespace, checked: tuple[list[str], Any, torch.nn.Module]) -> int:
    tasks, manager, module = checked
    results = evaluate(args.model_dir or module, tasks, num_fewshot=args.num_fewshot, batch_size=args.batch_size,
                       device=args.device, limit=args.limit, bootstrap_iters=args.bootstrap_iters, log_samples=True,
                       task_manager=manager)
    from lm_eval.utils import make_table

    claim = harness_claim(module.float().eval(), results)
    sys.stdout.write(make_table(results) + "\n")
    sys.stdout.write(f"[{'HOLDS' if claim.holds else 'FAILS'}] {claim.id}: {claim.measured['requests']} requests, "
                     f"max |harness - direct| / tolerance = {claim.measured['max_error_over_tolerance']:.3g}\n")
    if args.json:
        atomic_write_json(args.json, json_safe({
            "model_dir": args.model_dir, "reference": args.reference, "tasks": tasks, "results": results["results"],
            "versions": results.get("versions", {}), "n-samples": results.get("n-samples", {}),
            "claims": [claim.to_json()]}))
    return 0 if claim.holds else 1


def main(argv: list[str] | None = None) -> int:
    return run_main(build_parser(), argv, _work, check=_check)


if __name__ == "__main__":
    sys.exit(main())
