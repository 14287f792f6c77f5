"""Data parallel: 2 gloo processes reach the parameters of 1 process on the same global batch.

The two ranks run ``lm.train.train`` exactly as ``torchrun`` would (env RANK / WORLD_SIZE /
MASTER_ADDR / MASTER_PORT), spawned with ``torch.multiprocessing``.  Each rank trains on its half of
every global batch; DDP averages the gradients.  The one-process run sums the same per-token terms in
a different order (one mean over B*T tokens vs two means over B*T/2, averaged), so the parameters agree
to float64 round-off, not bitwise.  Tolerance: ``rmsgauge.tolerance('float64', size=B*T*d_ff,
depth=K*(n_layers+2), scale=max|param|)`` -- the largest sum in a weight gradient (B*T tokens times
d_ff terms), through K steps of a network n_layers + 2 modules deep.  Adam's step
``g / (sqrt(v) + eps)`` passes a gradient's *relative* error on unchanged where ``|g| >> eps``; only
coordinates with ``|g|`` near ``eps = 1e-8`` could amplify it (by up to ``1/eps``), and this test would
catch that (none occur: the measured worst difference is about 2e-16 against a bound near 5e-13).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from lm.checkpoint import load_checkpoint
from lm.dense import DenseConfig
from lm.loop import train
from lm.runlog import read_log
from lm.trainconfig import TrainConfig
from rmsgauge import tolerance
from rmsgauge.corpus import bundled_corpus_files
from studies.train import monitor_hooks

TINY = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "block_size": 16}
K_STEPS = 3
WORLD = 2
BATCH = 4  # global: 2 windows per rank


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cfg(out: Path, data: Path) -> TrainConfig:
    return TrainConfig(lr=1e-2, warmup_steps=1, batch_size=BATCH, max_steps=K_STEPS, eval_interval=0, eval_batches=1,
                       log_interval=1, gauge_interval=1, ckpt_interval=0, device="cpu", dtype="float64", threads=1,
                       data=str(data), out_dir=str(out), grad_clip=0.0)


def _rank(rank: int, port: int, out: str, data: str) -> None:  # runs in a spawned process
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    cfg = _cfg(Path(out), Path(data))
    train("dense", DenseConfig(**TINY), cfg, progress=False, hooks=monitor_hooks(cfg))  # as the CLI runs it


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ddp") / "c.txt"
    path.write_text(bundled_corpus_files()[0].read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    return path


def test_ddp_two_gloo_ranks_match_one_process(tmp_path, corpus, monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    cfg = _cfg(tmp_path / "one", corpus)
    one = train("dense", DenseConfig(**TINY), cfg, progress=False, hooks=monitor_hooks(cfg))
    assert one["world_size"] == 1
    mp.spawn(_rank, args=(_free_port(), str(tmp_path / "two"), str(corpus)), nprocs=WORLD, join=True)

    a = load_checkpoint(tmp_path / "one" / "ckpt.pt")["model"]
    b = load_checkpoint(tmp_path / "two" / "ckpt.pt")["model"]
    scale = max(float(v.abs().max()) for v in a.values())
    tokens = BATCH * TINY["block_size"]
    tol = tolerance("float64", size=tokens * TINY["d_ff"], depth=K_STEPS * (TINY["n_layers"] + 2), scale=scale)
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= tol.atol, f"max |param difference| {worst:.3g} > {tol.atol:.3g} (float64)"
    # the logged losses agree as well (rank 0 logs the mean over ranks)
    la = [r["loss"] for r in read_log(tmp_path / "one" / "log.jsonl") if r["event"] == "train"]
    lb = [r["loss"] for r in read_log(tmp_path / "two" / "log.jsonl") if r["event"] == "train"]
    assert len(la) == len(lb) == K_STEPS
    for x, y in zip(la, lb):
        assert tolerance("float64", size=tokens * 256, depth=K_STEPS).holds(x - y, x)
    starts = [r for r in read_log(tmp_path / "two" / "log.jsonl") if r["event"] == "start"]
    assert len(starts) == 1 and starts[0]["world_size"] == WORLD  # only rank 0 logs
    # the equilibrium monitor watches on rank 0 only (the census ran there alone without stalling the other rank),
    # and sees the weights of the one-process run
    ea = [r for r in read_log(tmp_path / "one" / "log.jsonl") if r["event"] == "equilibrium"]
    eb = [r for r in read_log(tmp_path / "two" / "log.jsonl") if r["event"] == "equilibrium"]
    assert [r["step"] for r in eb] == [r["step"] for r in ea] == list(range(1, K_STEPS + 1))
    for x, y in zip(ea, eb):
        assert x["groups"].keys() == y["groups"].keys() and x["groups"]
        for name, g in x["groups"].items():
            assert abs(g["norm"] - y["groups"][name]["norm"]) <= tol.bound(g["norm"])
