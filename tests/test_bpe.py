"""A real vocabulary: the pinned corpus install, byte-level BPE trained on the training split only, bits per
byte counted against the bytes themselves, and the driver on a tiny BPE grid."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import lzma
import math
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("tokenizers", reason="tokenizers is in the test extra")

from lm import bpe
from lm.scoring import full_split_bpb

ROOT = Path(__file__).resolve().parents[1]
TEXT = ("the quick brown fox jumps over the lazy dog\n" * 40 + "a cat sat on the mat, naïvely\n" * 40
        + "zyzzogeton zyzzogeton zyzzogeton\n" * 8).encode()  # the last 272 bytes: inside the validation 10%


@pytest.fixture(autouse=True)
def _data_root(tmp_path, monkeypatch):
    monkeypatch.setenv("RMSGAUGE_DATA", str(tmp_path / "data"))


def _corpus(tmp_path, vocab=300):
    (tmp_path / "t.txt").write_bytes(TEXT)
    return bpe.TokenCorpus.load(str(tmp_path / "t.txt"), 0.1, vocab)


def test_splits_cut_at_a_line_start_and_round_trip(tmp_path):
    c = _corpus(tmp_path)
    at = bpe.split_point(TEXT, 0.1)
    assert TEXT[at - 1:at] == b"\n" and c.split_bytes == {"train": at, "val": len(TEXT) - at}
    tok = bpe.cached_tokenizer(TEXT[:at], 300, hashlib.sha256(TEXT).hexdigest())
    for name, part in (("train", TEXT[:at]), ("val", TEXT[at:])):
        ids = c.split(name)
        assert tok.decode(ids.tolist()).encode("utf-8") == part  # every byte, no more
        assert int(c.token_bytes[ids].sum()) == len(part)  # the direct count


def test_the_tokenizer_never_sees_the_validation_split(tmp_path):
    c = _corpus(tmp_path)
    tok = bpe.cached_tokenizer(TEXT[:bpe.split_point(TEXT, 0.1)], 300, hashlib.sha256(TEXT).hexdigest())
    # "zyzzogeton" is frequent, but only in the last 10%: no merge learned it
    assert not any("zyzz" in t for t in tok.get_vocab())
    assert c.tokens_per_byte("val") > c.tokens_per_byte("train")


def test_tokenizer_training_is_deterministic(tmp_path):
    a = bpe.train_tokenizer(TEXT[:1500], 290).to_str()
    b = bpe.train_tokenizer(TEXT[:1500], 290).to_str()
    assert a == b


class _Uniform(torch.nn.Module):
    """Equal logits: every token costs exactly log2(V) bits."""

    def __init__(self, vocab, block):
        super().__init__()
        self.vocab = vocab
        self.config = type("C", (), {"block_size": block})()

    def forward(self, x):
        return torch.zeros(*x.shape, self.vocab), None


@pytest.mark.parametrize("block", [4, 7])
def test_bits_per_byte_is_token_bits_over_the_bytes_they_stand_for(tmp_path, block):
    c = _corpus(tmp_path)
    val = c.split("val")
    got = full_split_bpb(_Uniform(c.vocab_size, block), c, batch_windows=3)
    scored_bytes = c.split_bytes["val"] - int(c.token_bytes[val[0]])  # every token after the first
    assert got["bytes_scored"] == scored_bytes
    assert got["bpb"] == pytest.approx((len(val) - 1) * math.log2(c.vocab_size) / scored_bytes, rel=1e-12)


def test_byte_corpus_scoring_is_unchanged():
    from rmsgauge.corpus import ByteCorpus

    c = ByteCorpus(np.frombuffer(TEXT, dtype=np.uint8).copy())
    got = full_split_bpb(_Uniform(256, 8), c)
    assert got["bytes_scored"] == len(c.split("val")) - 1 and got["bpb"] == pytest.approx(8.0, rel=1e-12)


def _fake_deb(member: str, payload: bytes) -> bytes:
    tar_buf = io.BytesIO()
    with tarfile.open(fileobj=tar_buf, mode="w") as tar:
        info = tarfile.TarInfo(member)
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    data = lzma.compress(tar_buf.getvalue())
    out = b"!<arch>\n"
    for name, body in ((b"debian-binary", b"2.0\n"), (b"data.tar.xz", data)):
        out += name.ljust(16) + b"0".ljust(12) + b"0".ljust(6) + b"0".ljust(6) + b"100644".ljust(8)
        out += str(len(body)).encode().ljust(10) + b"`\n" + body + (b"\n" if len(body) % 2 else b"")
    return out


def test_install_verifies_both_pins_and_writes_utf8(tmp_path):
    raw = "défini \x92s\n".encode().replace("\x92".encode(), b"\x92")  # one cp1252 byte
    deb = _fake_deb("./usr/share/x.dz", gzip.compress(raw))
    text = bpe.as_utf8(raw)
    assert text == "défini ’s\n".encode()
    src = bpe.CorpusSource("fake", "pkg", "1", hashlib.sha256(deb).hexdigest(), "./usr/share/x.dz",
                           hashlib.sha256(text).hexdigest(), len(text))
    (tmp_path / "p.deb").write_bytes(deb)
    path = bpe.install(src, str(tmp_path / "p.deb"))
    assert path.read_bytes() == text
    bad = bpe.CorpusSource(**{**src.__dict__, "name": "fake2", "deb_sha256": "0" * 64})
    with pytest.raises(RuntimeError, match="not the pinned"):
        bpe.install(bad, str(tmp_path / "p.deb"))
    assert not bpe.corpus_file(bad).exists()


def test_a_missing_corpus_names_the_install_command():
    with pytest.raises(FileNotFoundError, match=r"python -m lm\.bpe install"):
        bpe.resolve_data("gcide")


def test_the_driver_runs_a_tiny_bpe_grid(tmp_path):
    # the tuning search is recorded already (3 slots); the BPE runs take its best point
    res = tmp_path / "res"
    res.mkdir()
    tuned = [{"name": f"tune-dense-0{k}", "group": "tuning", "variant": "tune-dense", "phase": "search",
              "model": "dense", "seed": 0, "lr_mult": m, "val_bpb_full": v}
             for k, (m, v) in enumerate([({}, 3.0), ({"matrices": 0.3}, 3.1), ({"matrices": 3.0}, 2.9)], 1)]
    # and the lr sweep (its best, 1e-2, is interior once the widening point 1e-1 is in): one BPE run to train
    sweep = [{"name": f"bpe-tiny-dense-sweep-lr{lr:g}", "group": "vocab", "variant": "bpe-tiny-dense",
              "phase": "sweep", "sweep": "bpe-tiny-dense", "model": "dense", "seed": 0, "lr": lr,
              "val_bpb_sample": v, "val_bpb_full": v} for lr, v in ((1e-3, 5.0), (1e-2, 4.0), (1e-1, 4.5))]
    (res / "runs.json").write_text(json.dumps(tuned + sweep))
    names = ["bpe-tiny-dense-final"]
    cmd = [sys.executable, "-m", "studies.experiments", "run", "--grid", "tiny", "--runs-dir", str(tmp_path / "r"),
           "--results", str(res), *[a for n in names for a in ("--only", n)]]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    recs = {r["name"]: r for r in json.loads((res / "runs.json").read_text())}
    final = recs["bpe-tiny-dense-final"]
    assert final["tokenizer"] == "bpe" and final["lr_mult"] == {"matrices": 3.0} and final["lr"] == 1e-2
    assert math.isfinite(final["val_bpb_full"]) and final["val_full_bytes"] > 0
    ckpt = torch.load(tmp_path / "r" / "bpe-tiny-dense-final" / "ckpt.pt", weights_only=False)
    assert ckpt["train_config"]["tokenizer"] == "bpe" and ckpt["model_config"]["vocab_size"] == 320


def test_a_cached_encoding_gives_the_same_tokens(tmp_path):
    first = _corpus(tmp_path)
    cached = list((tmp_path / "data" / "tokenizers").glob("*.npz"))
    assert len(cached) == 1
    again = _corpus(tmp_path)
    assert np.array_equal(first.tokens, again.tokens) and first.split_at == again.split_at
