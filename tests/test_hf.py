"""The GRT and dense models as Hugging Face ``transformers`` models (lm/hf.py): loading, logits, generation.

Needs the ``hf`` extra (skipped without it).  Tiny models (d 32, 2 layers, context 32) keep this file fast;
"trained" weights come from 20 steps of ``lm.train.train`` (or the shipped references when present).
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("transformers", reason="the hf extra is not installed (pip install -e '.[hf]')")
pytest.importorskip("safetensors", reason="the hf extra is not installed (pip install -e '.[hf]')")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network here: nothing may be fetched from the Hub

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from grt_model import GRT, GRTConfig
from lm.checkpoint import load_checkpoint, model_from_checkpoint
from lm.dense import DenseConfig, DenseTransformer
from lm.hf import main, save_pretrained_dir, to_checkpoint
from lm.hf_classes import NEWLINE_ID, DenseForCausalLM, GRTForCausalLM, wrap
from lm.loop import train
from lm.sample import generate as project_generate
from lm.trainconfig import TrainConfig
from rmsgauge import assert_close, seed_everything
from rmsgauge.corpus import decode, encode

BLOCK = 32
TINY = {
    "dense": lambda: DenseConfig(d_model=32, n_heads=2, n_layers=2, d_ff=64, block_size=BLOCK),
    "grt": lambda: GRTConfig.small(d_model=32, n_heads=2, n_blocks=2, d_ff=64, block_size=BLOCK, qkvo_stages=3,
                                   ffn_stages=3),
}
HF_CLASS = {"dense": DenseForCausalLM, "grt": GRTForCausalLM}
TEXTS = ["ROMEO:\nBut soft!", "Héllo, wörld — ∑ 🙂", "", "\n\n  tabs\tand spaces  "]


def _layers(model) -> int:
    cfg = model.config
    return cfg.n_blocks if isinstance(cfg, GRTConfig) else cfg.n_layers


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """``{(kind, weights): (project module, save_pretrained dir)}`` for random and trained weights."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for kind in ("dense", "grt"):
        seed_everything(1)
        net = (DenseTransformer if kind == "dense" else GRT)(TINY[kind]()).eval()
        out[(kind, "random")] = (net, save_pretrained_dir(net, root / f"{kind}-random"))
        # trained: through the checkpoint converter, the path a user's run takes
        run = root / f"{kind}-run"
        cfg = TrainConfig(max_steps=20, batch_size=4, warmup_steps=2, lr=1e-2, eval_interval=0, eval_batches=1,
                          log_interval=20, gauge_interval=0, ckpt_interval=0, probe_gauges=False, device="cpu",
                          out_dir=str(run))
        train(kind, TINY[kind](), cfg, progress=False)
        ckpt = run / "ckpt.pt"
        trained = model_from_checkpoint(load_checkpoint(ckpt)).eval()
        out[(kind, "trained")] = (trained, save_pretrained_dir(ckpt, root / f"{kind}-trained"))
    return out


def _ids(text: str) -> torch.Tensor:
    return torch.from_numpy(encode(text).astype("int64")).unsqueeze(0)  # (1, t)


def test_tokenizer_is_the_project_bytes(models):
    tok = AutoTokenizer.from_pretrained(str(models[("grt", "random")][1]))
    assert tok.vocab_size == 256 and len(tok) == 256
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (NEWLINE_ID,) * 3
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        assert ids == encode(text).tolist(), text  # nothing added: the models were trained on raw bytes
        # "\n" is text even when special tokens are skipped (every id is a real byte)
        assert tok.decode(ids, skip_special_tokens=True) == decode(ids) == text
    batch = tok(["ab", "abcd"], padding=True, padding_side="left", return_tensors="pt")
    assert batch["input_ids"].tolist() == [[NEWLINE_ID, NEWLINE_ID, 97, 98], [97, 98, 99, 100]]
    assert batch["attention_mask"].tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]


@pytest.mark.parametrize("weights", ["random", "trained"])
@pytest.mark.parametrize("kind", ["dense", "grt"])
def test_from_pretrained_reproduces_project_logits(models, kind, weights):
    net, d = models[(kind, weights)]
    assert AutoConfig.from_pretrained(str(d)).model_type == f"rmsgauge-{kind}"
    hf = AutoModelForCausalLM.from_pretrained(str(d))
    assert type(hf) is HF_CLASS[kind] and hf.dtype == torch.float32
    for name, p in net.state_dict().items():  # every tensor round-trips through safetensors bit for bit
        assert torch.equal(hf.model.state_dict()[name], p), name
    x = torch.randint(0, 256, (3, BLOCK), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref, _ = net(x)
        out = hf(input_ids=x)
        assert torch.equal(out.logits, ref)  # no cache, no padding: the project's own forward
        # KV cache, fed in three uneven pieces: the same function to float32 tolerance
        pieces, cache, start = [], None, 0
        for stop in (5, 6, BLOCK):
            o = hf(input_ids=x[:, start:stop], cache=cache, use_cache=True)
            pieces.append(o.logits)
            cache, start = o.cache, stop
        assert cache.get_seq_length() == BLOCK
        assert_close(torch.cat(pieces, dim=1), ref, dtype=torch.float32, size=net.config.d_model,
                     depth=_layers(net), what=f"{kind} cached logits")
        # HF's label convention: position t predicts label t+1
        loss = hf(input_ids=x, labels=x).loss
        _, ref_loss = net(x[:, :-1], x[:, 1:])
    assert_close(loss, ref_loss, dtype=torch.float32, size=BLOCK, what="loss")


@pytest.mark.parametrize("kind", ["dense", "grt"])
def test_checkpoint_round_trip(models, kind, tmp_path):
    net, d = models[(kind, "trained")]
    ckpt = to_checkpoint(d, tmp_path / "back.pt")
    back = model_from_checkpoint(load_checkpoint(ckpt))
    assert type(back) is type(net) and back.config == net.config
    sd = back.state_dict()
    assert sd.keys() == net.state_dict().keys()
    assert all(torch.equal(sd[k], v) for k, v in net.state_dict().items())


@pytest.mark.parametrize("kind", ["dense", "grt"])
def test_generate_matches_project_sampler(models, kind):
    net, d = models[(kind, "trained")]
    hf = AutoModelForCausalLM.from_pretrained(str(d))
    prompt = _ids("ROMEO:\n")
    n = BLOCK  # prompt + n crosses the context window: the project crops, the cache must restart
    settings = [{"temperature": 0.0, "top_k": 0}, {"temperature": 1.0, "top_k": 0}, {"temperature": 0.7, "top_k": 5}]
    for s in settings:
        for use_cache in (False, True):
            gen = torch.Generator().manual_seed(7)
            ref = project_generate(net, prompt, n, temperature=s["temperature"], top_k=s["top_k"], generator=gen)
            torch.manual_seed(7)  # HF samples from the default generator: the same stream as Generator().manual_seed(7)
            kw = ({"do_sample": False} if s["temperature"] == 0 else
                  {"do_sample": True, "temperature": s["temperature"], "top_k": s["top_k"]})
            out = hf.generate(prompt, max_new_tokens=n, use_cache=use_cache, **kw)
            assert out.tolist() == ref.tolist(), (s, use_cache)
    # top-p has no lm.sample counterpart; a nucleus smaller than the top byte's mass is greedy decoding
    torch.manual_seed(7)
    nucleus = hf.generate(prompt, max_new_tokens=n, do_sample=True, top_p=1e-9, top_k=0)
    assert nucleus.tolist() == project_generate(net, prompt, n, temperature=0.0).tolist()


@pytest.mark.parametrize("kind", ["dense", "grt"])
def test_left_padded_batch_generates_like_each_row(models, kind):
    net, d = models[(kind, "trained")]
    hf = AutoModelForCausalLM.from_pretrained(str(d))
    tok = AutoTokenizer.from_pretrained(str(d))
    prompts = ["To be", "Now is the winter"]
    batch = tok(prompts, padding=True, padding_side="left", return_tensors="pt")
    n = 10  # stays inside the window: past it, lm.sample has no notion of padding to compare with
    out = hf.generate(**batch, max_new_tokens=n, do_sample=False)
    for row, p in zip(out, prompts):
        ref = project_generate(net, _ids(p), n, temperature=0.0)
        assert row[-(ref.shape[1]):].tolist() == ref[0].tolist(), p


def test_cli_export_and_errors(models, tmp_path, capsys):
    net, d = models[("dense", "trained")]
    ckpt = tmp_path / "back.pt"
    assert main(["import", "--model-dir", str(d), "--checkpoint", str(ckpt)]) == 0
    assert main(["export", "--checkpoint", str(ckpt), "--out-dir", str(tmp_path / "again")]) == 0
    again = AutoModelForCausalLM.from_pretrained(str(tmp_path / "again"))
    assert all(torch.equal(again.model.state_dict()[k], v) for k, v in net.state_dict().items())
    capsys.readouterr()
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(SystemExit):
        main(["export", "--checkpoint", str(ckpt), "--out-dir", str(a_file)])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--out-dir" in err and "is a file" in err
    with pytest.raises(SystemExit):
        main(["export", "--checkpoint", str(tmp_path / "missing.pt"), "--out-dir", str(tmp_path / "x")])
    assert "no checkpoint at" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["dense", "grt"])
def test_shipped_reference_exports(kind, tmp_path):
    from lm.reference import load_reference

    try:
        net = load_reference(kind)
    except FileNotFoundError as e:  # the weights land in lm/reference_models/ separately
        pytest.skip(f"shipped reference {kind!r} not present: {e}")
    d = save_pretrained_dir(net, tmp_path / kind)
    hf = AutoModelForCausalLM.from_pretrained(str(d))
    x = torch.from_numpy(encode("ROMEO:\nBut soft, what light").astype("int64")).unsqueeze(0)
    with torch.no_grad():
        assert torch.equal(hf(input_ids=x).logits, net(x)[0])


# ---- conversions never overwrite, never certify what they did not verify -------------------------------------


def _flip(path, at: float = 0.9) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 1
    path.write_bytes(bytes(data))


def _copy_dir(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def _code(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def _last(capsys) -> str:
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip() and not ln.startswith("--force:")]
    assert lines and "Traceback" not in "\n".join(lines)
    return lines[-1]


def test_export_writes_sha256sums_and_never_overwrites(models, tmp_path, capsys):
    from lm.checkpoint import SUMS_NAME, verify_folder

    _, d = models[("dense", "trained")]
    assert verify_folder(d, ("config.json", "model.safetensors"))
    listed = (d / SUMS_NAME).read_text()
    assert "model.safetensors" in listed and "config.json" in listed
    ckpt = tmp_path / "back.pt"
    assert main(["import", "--model-dir", str(d), "--checkpoint", str(ckpt)]) == 0
    other = _copy_dir(d, tmp_path / "other")
    before = (other / "model.safetensors").read_bytes()
    assert _code(["export", "--checkpoint", str(ckpt), "--out-dir", str(other)]) == 2
    assert "never overwrites" in _last(capsys) and (other / "model.safetensors").read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no half-written export left


def test_import_never_replaces_a_checkpoint_or_a_run(models, tmp_path, capsys):
    from lm.checkpoint import checksum_path

    _, d = models[("dense", "random")]
    run = tmp_path / "run"
    cfg = TrainConfig(max_steps=1, batch_size=2, warmup_steps=1, eval_interval=0, eval_batches=1, log_interval=1,
                      gauge_interval=0, probe_gauges=False, device="cpu", out_dir=str(run))
    train("dense", TINY["dense"](), cfg, progress=False)
    before = (run / "ckpt.pt").read_bytes()
    for target in (run / "ckpt.pt", run / "other.pt", d / "x.pt", d / "model.safetensors"):
        assert _code(["import", "--model-dir", str(d), "--checkpoint", str(target), "--force"]) == 2, target
        _last(capsys)
    assert (run / "ckpt.pt").read_bytes() == before
    mine = tmp_path / "mine.pt"
    assert main(["import", "--model-dir", str(d), "--checkpoint", str(mine)]) == 0
    first = mine.read_bytes()
    assert _code(["import", "--model-dir", str(d), "--checkpoint", str(mine)]) == 2
    assert "--force" in _last(capsys)
    assert main(["import", "--model-dir", str(d), "--checkpoint", str(mine), "--force"]) == 0
    moved = [p for p in tmp_path.iterdir() if p.name.startswith("mine.pt.replaced-") and not p.name.endswith(".sha256")]
    assert len(moved) == 1 and moved[0].read_bytes() == first and checksum_path(moved[0]).exists()


def test_import_verifies_before_it_certifies(models, tmp_path, capsys):
    from lm.checkpoint import SUMS_NAME, checksum_path

    _, d = models[("grt", "random")]
    flipped = _copy_dir(d, tmp_path / "flipped")
    _flip(flipped / "model.safetensors")
    assert _code(["import", "--model-dir", str(flipped), "--checkpoint", str(tmp_path / "a.pt")]) == 1
    assert "does not match SHA256SUMS" in _last(capsys) and not (tmp_path / "a.pt").exists()
    truncated = _copy_dir(d, tmp_path / "truncated")
    (truncated / "model.safetensors").write_bytes((truncated / "model.safetensors").read_bytes()[:4000])
    (truncated / SUMS_NAME).unlink()
    assert _code(["import", "--model-dir", str(truncated), "--checkpoint", str(tmp_path / "b.pt"),
                  "--trust-unverified"]) == 1
    assert "not a loadable save_pretrained folder" in _last(capsys) and not (tmp_path / "b.pt").exists()
    bare = _copy_dir(d, tmp_path / "bare")
    (bare / SUMS_NAME).unlink()
    assert _code(["import", "--model-dir", str(bare), "--checkpoint", str(tmp_path / "c.pt")]) == 1
    assert "--trust-unverified" in _last(capsys)
    assert main(["import", "--model-dir", str(bare), "--checkpoint", str(tmp_path / "c.pt"), "--trust-unverified"]) == 0
    assert not checksum_path(tmp_path / "c.pt").exists()  # unverified in, unverified out
    with pytest.raises(Exception, match="--trust-unverified"):
        load_checkpoint(tmp_path / "c.pt")
    ck = load_checkpoint(tmp_path / "c.pt", trust_unverified=True)
    assert ck["extra"]["source_verified"] is False
    out = tmp_path / "exp"
    assert _code(["export", "--checkpoint", str(tmp_path / "c.pt"), "--out-dir", str(out)]) == 1
    assert main(["export", "--checkpoint", str(tmp_path / "c.pt"), "--out-dir", str(out), "--trust-unverified"]) == 0
    assert not (out / SUMS_NAME).exists()  # an export of unverified weights stays unverified


def _rewrite_sums(folder) -> None:
    """A SHA256SUMS that lists what the folder holds now, the way anyone who can write the folder could."""
    from lm.checkpoint import write_folder_sums

    (folder / "SHA256SUMS").unlink()
    write_folder_sums(folder)


def test_import_refuses_a_file_the_sums_do_not_cover(models, tmp_path, capsys):
    """The loader shim is the code ``trust_remote_code=True`` runs: a line appended to it is refused whether its sum
    is left (a mismatch), taken off the list, or rewritten to match; and a file the sums do not list is refused."""
    from lm.checkpoint import SUMS_NAME
    from lm.hf import SHIM_NAME

    _, d = models[("dense", "random")]
    shim = f"{SHIM_NAME}.py"
    cases = {}
    cases["tampered"] = _copy_dir(d, tmp_path / "tampered")
    cases["off the list"] = _copy_dir(d, tmp_path / "off")
    cases["sums rewritten"] = _copy_dir(d, tmp_path / "rewritten")
    for folder in cases.values():
        with open(folder / shim, "a") as fh:
            fh.write("import os; os.system('echo pwned')\n")
    sums = cases["off the list"] / SUMS_NAME
    sums.write_text("".join(ln + "\n" for ln in sums.read_text().splitlines() if not ln.endswith(shim)))
    _rewrite_sums(cases["sums rewritten"])
    cases["extra file"] = _copy_dir(d, tmp_path / "extra")
    (cases["extra file"] / "helper.py").write_text("print('not exported')\n")
    cases["extra folder"] = _copy_dir(d, tmp_path / "nested")
    (cases["extra folder"] / "sub").mkdir()
    (cases["extra folder"] / "sub" / "x.bin").write_bytes(b"\0")
    words = {"tampered": "does not match SHA256SUMS", "off the list": f"['{shim}'] not listed",
             "sums rewritten": "not the loader shim", "extra file": "['helper.py'] not listed",
             "extra folder": "['sub/x.bin'] not listed"}
    for name, folder in cases.items():
        target = tmp_path / f"{folder.name}.pt"
        assert _code(["import", "--model-dir", str(folder), "--checkpoint", str(target)]) == 1, name
        line = _last(capsys)
        assert words[name] in line and str(folder) in line, (name, line)
        assert not target.exists()
    assert main(["import", "--model-dir", str(d), "--checkpoint", str(tmp_path / "ok.pt")]) == 0  # as exported


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_export_follows_the_umask(models, tmp_path, umask):
    import stat

    net, _ = models[("grt", "random")]
    old = os.umask(umask)
    try:
        out = save_pretrained_dir(net, tmp_path / "exp")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (out, *out.rglob("*"))}
    want = {p.name: (0o777 if p.is_dir() else 0o666) & ~umask for p in (out, *out.rglob("*"))}
    assert modes == want and "model.safetensors" in modes


def test_config_names_newline_as_bos_eos_and_pad_yet_generation_runs_on(models):
    """``config.json`` says what the README says: "\n" is BOS, EOS and pad; generation neither stops at a "\n" nor
    takes a prompt's "\n" for padding (the generation config leaves both unset), like lm.sample."""
    import json

    net, d = models[("grt", "trained")]
    cfg = json.loads((d / "config.json").read_text())
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (NEWLINE_ID,) * 3
    gen = json.loads((d / "generation_config.json").read_text())
    assert gen.get("eos_token_id") is None and gen.get("pad_token_id") is None
    hf = AutoModelForCausalLM.from_pretrained(str(d))
    prompt = _ids("\n\nA\n")
    out = hf.generate(prompt, max_new_tokens=BLOCK, do_sample=False)
    assert out.tolist() == project_generate(net, prompt, BLOCK, temperature=0.0).tolist()
    in_memory = wrap(net)
    assert in_memory.config.eos_token_id == NEWLINE_ID and in_memory.generation_config.eos_token_id is None
    assert in_memory.generate(prompt, max_new_tokens=BLOCK, do_sample=False).tolist() == out.tolist()


def test_help_works_without_transformers(tmp_path):
    import subprocess
    import sys

    code = ("import sys, runpy; sys.modules['transformers'] = None; sys.argv = ['lm.hf'] + sys.argv[1:]; "
            "runpy.run_module('lm.hf', run_name='__main__')")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0 and "export" in p.stdout and "import" in p.stdout, p.stderr
    (tmp_path / "m").mkdir()
    p = subprocess.run([sys.executable, "-c", code, "import", "--model-dir", str(tmp_path / "m"), "--checkpoint",
                        str(tmp_path / "x.pt")], capture_output=True, text=True, env=env, timeout=300)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1 and 'pip install -e ".[hf]"' in lines[0], p.stderr


@pytest.mark.parametrize("kind", ["grt", "dense"])
def test_hf_model_runs_the_projects_own_blocks(kind, monkeypatch):
    """The Hugging Face classes wrap the project's modules: patch the project's block (here its MLP / mixer
    residual branch) and both the plain and the cached Hugging Face forward change with it, to the patched
    project model's logits."""
    seed_everything(0)
    model = TINY[kind]()
    model = GRT(model) if kind == "grt" else DenseTransformer(model)
    hf = wrap(model).eval()
    ids = torch.randint(0, 256, (2, 12))
    if kind == "grt":
        from grt_model.model import GRTBlock

        real = GRTBlock.sublayer
        monkeypatch.setattr(GRTBlock, "sublayer",
                            lambda self, name, x: 3.0 * real(self, name, x) if name == "mixer" else real(self, name, x))
    else:
        from lm.dense import DenseMLP

        real = DenseMLP.forward
        monkeypatch.setattr(DenseMLP, "forward", lambda self, x: 3.0 * real(self, x))
    with torch.no_grad():
        want = model(ids)[0]
        plain = hf(ids).logits
        cached = hf(ids, use_cache=True).logits
    assert torch.equal(plain, want)
    assert_close(cached, want, dtype=torch.float32, size=ids.shape[1] * model.config.d_model)
    monkeypatch.undo()
    with torch.no_grad():
        assert not torch.allclose(hf(ids, use_cache=True).logits, want)  # the patch was what made them equal
