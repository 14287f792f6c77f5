r"""A real vocabulary: the GCIDE corpus (40 MB of English, from Debian's packages) and byte-level BPE on it.

    python -m lm.bpe install          # fetch dict-gcide with apt-get download (no root), verify, unpack
    python -m lm.bpe install --deb dict-gcide_0.48.5+nmu2_all.deb   # a .deb fetched by hand (any machine)
    python -m lm.bpe status           # where the corpus and the cached tokenizers are

Debian's ``dict-gcide`` is pinned by sha256 and never downloaded at run time (the README says why this package).
The corpus lives under ``$RMSGAUGE_DATA`` (default ``~/.cache/rmsgauge``).  The tokenizer (Hugging Face
``tokenizers``: GPT-2's pre-tokenizer and byte alphabet, no special tokens) is trained on the training split only
and each split is tokenized on its own, so no validation byte reaches a training token; every token stands for a
known number of bytes, which makes bits per byte exact (:func:`lm.scoring.full_split_bpb`).
"""

from __future__ import annotations

import gzip
import io
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rmsgauge import atomic_write_bytes
from rmsgauge.atomic import sha256_bytes
from rmsgauge.cli import add_subcommand, add_subcommands, make_parser, run_main
from rmsgauge.corpus import ByteCorpus, load_bytes


@dataclass(frozen=True)
class CorpusSource:
    name: str
    package: str
    version: str
    deb_sha256: str
    member: str  # the file inside the package's data.tar
    text_sha256: str  # of the installed corpus (UTF-8)
    text_bytes: int


GCIDE = CorpusSource("gcide", "dict-gcide", "0.48.5+nmu2",
                     "7b0af5cfde3cbdef5e9d6e78f92ec335ced7c2790f37a40f49bebc6f7347ac0f",
                     "./usr/share/dictd/gcide.dict.dz",
                     "86a086f9e4cc2c8325e97bd4d7ccccf1d39c613d337512c736c7e831f115c0f6", 39_952_325)
SOURCES = {GCIDE.name: GCIDE}
INSTALL_HINT = "python -m lm.bpe install"
CP1252_UNDEFINED = (0x81, 0x8D, 0x8F, 0x90, 0x9D)


def data_root() -> Path:
    return Path(os.environ.get("RMSGAUGE_DATA") or Path.home() / ".cache" / "rmsgauge")


def corpus_file(src: CorpusSource = GCIDE) -> Path:
    return data_root() / "corpora" / f"{src.name}-{src.version}.txt"


def as_utf8(raw: bytes) -> bytes:
    """``raw`` as UTF-8: valid sequences kept, each invalid byte read as cp1252 (latin-1 where cp1252 is undefined)."""
    out, i = [], 0
    while i < len(raw):
        try:
            out.append(raw[i:].decode("utf-8"))
            break
        except UnicodeDecodeError as e:
            out.append(raw[i:i + e.start].decode("utf-8"))
            bad = raw[i + e.start:i + e.end]
            out.append("".join(chr(b) if b in CP1252_UNDEFINED else bytes([b]).decode("cp1252") for b in bad))
            i += e.end
    return "".join(out).encode("utf-8")


def _deb_member(deb: bytes, member: str) -> bytes:
    """One file out of a .deb (an ``ar`` archive holding ``data.tar.xz``), read in Python: no dpkg needed."""
    if not deb.startswith(b"!<arch>\n"):
        raise ValueError("not a Debian package (no ar header)")
    pos = 8
    while pos + 60 <= len(deb):
        name, size = deb[pos:pos + 16].decode().strip().rstrip("/"), int(deb[pos + 48:pos + 58].decode().strip())
        body = deb[pos + 60:pos + 60 + size]
        if name.startswith("data.tar"):
            raw = lzma.decompress(body) if name.endswith(".xz") else body
            with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
                f = tar.extractfile(member)
                if f is None:
                    raise ValueError(f"{member} is not a file in the package")
                return f.read()
        pos += 60 + size + (size % 2)
    raise ValueError("the package has no data.tar member")


def install(src: CorpusSource = GCIDE, deb_path: str | None = None) -> Path:
    """Fetch (``apt-get download``, or ``deb_path``), verify both sha256 pins, write the corpus atomically."""
    dest = corpus_file(src)
    if dest.is_file() and sha256_bytes(dest.read_bytes()) == src.text_sha256:
        return dest
    if deb_path is None:
        if shutil.which("apt-get") is None:
            raise RuntimeError(f"apt-get is not on this machine: download {src.package}_{src.version}_all.deb "
                               f"from a Debian mirror (pool/main/d/{src.package}/) and pass it with --deb")
        with tempfile.TemporaryDirectory() as tmp:
            out = subprocess.run(["apt-get", "download", f"{src.package}={src.version}"], cwd=tmp,
                                 capture_output=True, text=True)
            debs = list(Path(tmp).glob("*.deb"))
            if out.returncode != 0 or not debs:
                msg = (out.stderr.strip().splitlines() or ["no .deb written"])[-1]
                raise RuntimeError(f"apt-get download {src.package}={src.version} failed: {msg}")
            deb = debs[0].read_bytes()
    else:
        deb = Path(deb_path).read_bytes()
    if sha256_bytes(deb) != src.deb_sha256:
        raise RuntimeError(f"{src.package} {src.version}: the package's sha256 {sha256_bytes(deb)[:16]}... is not the "
                           f"pinned {src.deb_sha256[:16]}...; refusing it")
    text = as_utf8(gzip.decompress(_deb_member(deb, src.member)))
    if sha256_bytes(text) != src.text_sha256:
        raise RuntimeError(f"the unpacked corpus's sha256 {sha256_bytes(text)[:16]}... is not the pinned "
                           f"{src.text_sha256[:16]}...")
    atomic_write_bytes(dest, text)
    return dest


def resolve_data(data: str) -> str | None:
    """A ``TrainConfig.data`` value as a path: ``""`` the bundled corpus (None), a source name (``"gcide"``) its
    installed file (one line naming the install command if it is missing), else the path itself."""
    if data == "":
        return None
    if data in SOURCES:
        path = corpus_file(SOURCES[data])
        if not path.is_file():
            raise FileNotFoundError(f"the {data} corpus is not installed at {path}; install it with {INSTALL_HINT}")
        return str(path)
    return data


def split_point(data: bytes, val_fraction: float) -> int:
    """The byte where validation starts: the first line start at or after ``(1 - val_fraction)`` of the bytes
    (a split inside a line or a UTF-8 sequence would hand one word to both sides)."""
    at = int(len(data) * (1.0 - val_fraction))
    nl = data.find(b"\n", at)
    return len(data) if nl < 0 else nl + 1


def _chunks(text: str, size: int = 1 << 20) -> list[str]:
    """``text`` cut before a line start whose line begins with a non-space, about every ``size`` characters (the
    pre-tokenizer never joins across such a cut, so the tokens do not depend on the chunking)."""
    out, start = [], 0
    while start < len(text):
        cut = len(text) if start + size >= len(text) else text.find("\n", start + size)
        while 0 <= cut < len(text) - 1 and text[cut + 1].isspace():
            cut = text.find("\n", cut + 1)
        cut = len(text) if cut < 0 or cut >= len(text) - 1 else cut + 1
        out.append(text[start:cut])
        start = cut
    return out


def train_tokenizer(train: bytes, vocab_size: int):
    """Byte-level BPE with ``vocab_size`` tokens trained on ``train`` (UTF-8 text; the size is checked by
    :meth:`lm.trainconfig.TrainConfig.check_model`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[], show_progress=False, min_frequency=2)
    tok.train_from_iterator(_chunks(train.decode("utf-8")), trainer=trainer)
    return tok


def cached_tokenizer(train: bytes, vocab_size: int, corpus_sha: str):
    """:func:`train_tokenizer`, cached under the data root by (corpus sha256, vocabulary size)."""
    from tokenizers import Tokenizer

    path = data_root() / "tokenizers" / f"bpe{vocab_size}-{corpus_sha[:16]}.json"
    if path.is_file():
        return Tokenizer.from_file(str(path))
    tok = train_tokenizer(train, vocab_size)
    atomic_write_bytes(path, tok.to_str().encode("utf-8"))
    return tok


def encode(tok, data: bytes) -> np.ndarray:
    ids = [e.ids for e in tok.encode_batch(_chunks(data.decode("utf-8")), add_special_tokens=False)]
    return np.fromiter((i for chunk in ids for i in chunk), dtype=np.int32)


def _cached_encoding(tok, data: bytes, at: int, key: str) -> tuple[np.ndarray, np.ndarray]:
    """Both splits' ids, cached beside the tokenizer (encoding 40 MB takes minutes; every run needs it)."""
    path = data_root() / "tokenizers" / f"{key}.npz"
    if path.is_file():
        with np.load(path) as z:
            return z["train"], z["val"]
    train, val = encode(tok, data[:at]), encode(tok, data[at:])
    buf = io.BytesIO()
    np.savez(buf, train=train, val=val)
    atomic_write_bytes(path, buf.getvalue())
    return train, val


def token_byte_lengths(tok) -> np.ndarray:
    """Bytes each token id stands for: one byte-level alphabet character is one byte."""
    out = np.zeros(tok.get_vocab_size(), dtype=np.int64)
    for s, i in tok.get_vocab().items():
        out[i] = len(s)
    return out


@dataclass
class TokenCorpus:
    """BPE tokens of a byte corpus with the same interface as :class:`rmsgauge.corpus.ByteCorpus`: the train and
    validation splits (tokenized apart), ``sha256`` (of the bytes and the vocabulary size: a resume checks it) and
    ``token_bytes`` (the bytes each id stands for)."""

    tokens: np.ndarray  # (N,) int32: the train split's tokens, then the validation split's
    split_at: int  # token index where validation starts
    vocab_size: int
    token_bytes: np.ndarray  # (vocab_size,) int64
    split_bytes: dict[str, int]  # bytes of each split
    val_fraction: float = 0.1
    sha256: str = field(default="", compare=False)

    @classmethod
    def load(cls, path: str | None, val_fraction: float, vocab_size: int) -> TokenCorpus:
        data = load_bytes(path)
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"corpus {path or 'bundled'} is not UTF-8 text (byte {e.start}): BPE reads text; "
                             f"use the byte tokenizer for it") from None
        at = split_point(data, val_fraction)
        if not 0 < at < len(data):
            raise ValueError(f"corpus {path or 'bundled'} ({len(data)} bytes) is too short to split at "
                             f"val_fraction {val_fraction} on a line start")
        sha = sha256_bytes(data)
        tok = cached_tokenizer(data[:at], vocab_size, sha)
        train, val = _cached_encoding(tok, data, at, f"bpe{vocab_size}-{sha[:16]}-at{at}")
        return cls(np.concatenate([train, val]), len(train), tok.get_vocab_size(), token_byte_lengths(tok),
                   {"train": at, "val": len(data) - at}, val_fraction, f"{sha}-bpe{vocab_size}")

    split = ByteCorpus.split  # the tokens before / from split_at
    batch = ByteCorpus.batch

    def tokens_per_byte(self, name: str) -> float:
        return len(self.split(name)) / self.split_bytes[name]


def load_corpus(data: str, val_fraction: float, tokenizer: str = "bytes",
                vocab_size: int = 256) -> ByteCorpus | TokenCorpus:
    """The corpus a run trains on: ``data`` (:func:`resolve_data`) read as bytes, or as BPE tokens of
    ``vocab_size``."""
    path = resolve_data(data)
    if tokenizer == "bpe":
        return TokenCorpus.load(path, val_fraction, vocab_size)
    return ByteCorpus.load(path, val_fraction)


def build_parser():
    ap = make_parser("python -m lm.bpe", __doc__)
    sub = add_subcommands(ap)
    p = add_subcommand(sub, "install", "fetch, verify and unpack the corpus (apt-get download: no root needed)")
    p.add_argument("--deb", metavar="PATH", help="a dict-gcide .deb fetched by hand instead of apt-get download")
    add_subcommand(sub, "status", "where the corpus and the cached tokenizers are")
    return ap


def main(argv: list[str] | None = None) -> int:
    def work(args, _checked) -> int:
        if args.command == "install":
            path = install(GCIDE, args.deb)
            print(f"{GCIDE.name} {GCIDE.version}: {path} ({GCIDE.text_bytes:,} bytes, sha256 "
                  f"{GCIDE.text_sha256[:16]}... verified)")
            return 0
        path = corpus_file(GCIDE)
        print(f"corpus {GCIDE.name}: {path} ({'installed' if path.is_file() else 'not installed: ' + INSTALL_HINT})")
        for t in sorted((data_root() / "tokenizers").glob("*.json")):
            print(f"tokenizer {t.name}")
        return 0

    def check(args):
        if getattr(args, "deb", None) is not None and not Path(args.deb).is_file():
            raise ValueError(f"--deb {args.deb} is not a file")

    return run_main(build_parser(), argv, work, check=check)


if __name__ == "__main__":
    sys.exit(main())
