"""lm-evaluation-harness on project models (lm/evaluate.py): the harness's numbers equal the direct computation.

Offline: a multiple-choice task and a perplexity task are written here as local JSONL + task YAML
(``dataset_path: json`` with local ``data_files``), run through the harness's ``hf`` model type, and
compared with the same quantities computed from the project module itself (log-likelihood of each
choice -> acc / acc_norm; rolling log-likelihood -> bits per byte, byte and word perplexity).
"""

from __future__ import annotations

import json
import math
import os
import re

import numpy as np
import pytest
import torch

pytest.importorskip("lm_eval", reason="the eval extra is not installed (pip install -e '.[eval]')")
pytest.importorskip("transformers", reason="the hf extra is not installed (pip install -e '.[hf]')")
pytest.importorskip("accelerate", reason="lm-eval's hf model needs accelerate (pip install -e '.[eval]')")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network: data comes from local JSONL files only
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from grt_model import GRT, GRTConfig
from lm.dense import DenseConfig, DenseTransformer
from lm.evaluate import evaluate, main
from lm.hf import save_pretrained_dir
from lm.hf_classes import NEWLINE_ID
from rmsgauge import assert_close, seed_everything
from rmsgauge.corpus import encode

BLOCK = 32
TINY = {
    "dense": lambda: DenseTransformer(DenseConfig(d_model=32, n_heads=2, n_layers=2, d_ff=64, block_size=BLOCK)),
    "grt": lambda: GRT(GRTConfig.small(d_model=32, n_heads=2, n_blocks=2, d_ff=64, block_size=BLOCK, qkvo_stages=3,
                                       ffn_stages=3)),
}
MC_DOCS = [
    {"question": "The sky is", "choices": ["blue", "green", "made of cheese"], "answer": 0},
    {"question": "Two plus two is", "choices": ["four", "five"], "answer": 0},
    {"question": "Wherefore art thou", "choices": ["Romeo?", "a", "Juliet, of all people on earth?"], "answer": 0},
    {"question": "", "choices": ["x", "yy"], "answer": 1},  # empty context: conditioned on the prefix "\n"
    {"question": "A long context that is longer than the model's whole window of bytes, so the harness "
                 "truncates it from the left:", "choices": ["yes", "no"], "answer": 1},
]
PPL_DOCS = [
    {"text": "To be, or not to be."},
    {"text": "All the world's a stage,\nAnd all the men and women merely players;\nThey have their exits."},
    {"text": "Ünïcödé bytes — count 🙂 as four."},
]


def _write_tasks(root) -> None:
    (root / "mc.jsonl").write_text("".join(json.dumps(d) + "\n" for d in MC_DOCS))
    (root / "ppl.jsonl").write_text("".join(json.dumps(d) + "\n" for d in PPL_DOCS))
    data = "dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {f}\n  cache_dir: {c}\ntest_split: test\n"
    (root / "mc.yaml").write_text(
        "task: rmsgauge_local_mc\n" + data.format(f=root / "mc.jsonl", c=root / "cache") +
        "output_type: multiple_choice\ndoc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: answer\nmetric_list:\n"
        "  - {metric: acc, aggregation: mean, higher_is_better: true}\n"
        "  - {metric: acc_norm, aggregation: mean, higher_is_better: true}\n")
    (root / "ppl.yaml").write_text(
        "task: rmsgauge_local_ppl\n" + data.format(f=root / "ppl.jsonl", c=root / "cache") +
        "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\nmetric_list:\n"
        "  - {metric: word_perplexity, aggregation: weighted_perplexity, higher_is_better: false}\n"
        "  - {metric: byte_perplexity, aggregation: weighted_perplexity, higher_is_better: false}\n"
        "  - {metric: bits_per_byte, aggregation: bits_per_byte, higher_is_better: false}\n")


# ---- the direct computation, from the project module and the byte encoding alone ----


@torch.no_grad()
def _logprobs(model, inp: list[int]) -> torch.Tensor:
    """``[len(inp), V]`` float64 log-probabilities of the byte after each input position."""
    logits, _ = model(torch.tensor([inp]))
    return torch.log_softmax(logits[0].double(), dim=-1)


def _loglik(model, context: str, continuation: str) -> float:
    """log p(continuation | context), the context left-truncated to fit one window; empty context -> "\\n"."""
    ctx = encode(context).tolist() or [NEWLINE_ID]
    cont = encode(continuation).tolist()
    seq = (ctx + cont)[-(BLOCK + 1):]
    lp = _logprobs(model, seq[:-1])[-len(cont):]
    return float(lp[torch.arange(len(cont)), torch.tensor(cont)].sum())


def _rolling_loglik(model, text: str) -> float:
    """Sum of log p(byte) over the text in disjoint windows of BLOCK predictions, each window reading the
    BLOCK tokens before its last prediction (the first window starts from the prefix "\\n")."""
    toks = encode(text).tolist()
    seq = [NEWLINE_ID, *toks]  # seq[i] is the input that predicts toks[i]
    total = 0.0
    for a in range(0, len(toks), BLOCK):
        b = min(a + BLOCK, len(toks))
        lo = max(0, b - BLOCK)
        lp = _logprobs(model, seq[lo:b])[a - lo:]
        total += float(lp[torch.arange(b - a), torch.tensor(toks[a:b])].sum())
    return total


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm_eval")
    _write_tasks(root)
    out = {}
    for kind in ("dense", "grt"):
        seed_everything(2)
        net = TINY[kind]().eval()
        d = save_pretrained_dir(net, root / kind)
        res = evaluate(d, ["rmsgauge_local_mc", "rmsgauge_local_ppl"], include_path=root, include_defaults=False,
                       log_samples=True)
        out[kind] = (net, d, res, root)
    return out


@pytest.mark.parametrize("kind", ["dense", "grt"])
def test_multiple_choice_equals_direct_loglik(runs, kind):
    net, _, res, _ = runs[kind]
    samples = sorted(res["samples"]["rmsgauge_local_mc"], key=lambda s: s["doc_id"])
    acc, acc_norm = [], []
    for doc, s in zip(MC_DOCS, samples):
        direct = np.array([_loglik(net, doc["question"], " " + c) for c in doc["choices"]])
        harness = np.array([r[0] for r in s["filtered_resps"]])
        assert_close(harness, direct, dtype=torch.float32, size=BLOCK * net.config.d_model, what=doc["question"])
        acc.append(float(np.argmax(direct) == doc["answer"]))
        lens = np.array([len(c) for c in doc["choices"]], dtype=float)  # acc_norm: per character of the choice
        acc_norm.append(float(np.argmax(direct / lens) == doc["answer"]))
    r = res["results"]["rmsgauge_local_mc"]
    assert r["acc,none"] == np.mean(acc) and r["acc_norm,none"] == np.mean(acc_norm)


@pytest.mark.parametrize("kind", ["dense", "grt"])
def test_perplexity_equals_direct_bits_per_byte(runs, kind):
    net, _, res, _ = runs[kind]
    assert max(len(encode(d["text"])) for d in PPL_DOCS) > 2 * BLOCK  # the rolling windows are exercised
    ll = sum(_rolling_loglik(net, d["text"]) for d in PPL_DOCS)
    n_bytes = sum(len(encode(d["text"])) for d in PPL_DOCS)
    n_words = sum(len(re.split(r"\s+", d["text"])) for d in PPL_DOCS)  # the harness's word count
    r = res["results"]["rmsgauge_local_ppl"]
    direct = {"bits_per_byte,none": -ll / n_bytes / math.log(2), "byte_perplexity,none": math.exp(-ll / n_bytes),
              "word_perplexity,none": math.exp(-ll / n_words)}
    for key, want in direct.items():
        assert_close(r[key], want, dtype=torch.float32, size=n_bytes * net.config.d_model, what=key)


def test_cli_json_and_errors(runs, tmp_path, capsys):
    _, d, res, root = runs["dense"]
    out = tmp_path / "res.json"
    assert main(["--model-dir", str(d), "--tasks", "rmsgauge_local_mc", "--include-path", str(root),
                 "--only-include-path", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["results"]["rmsgauge_local_mc"]["acc,none"] == res["results"]["rmsgauge_local_mc"]["acc,none"]
    assert "rmsgauge_local_mc" in capsys.readouterr().out  # the harness's table
    with pytest.raises(SystemExit):
        main(["--model-dir", str(d), "--tasks", "rmsgauge_local_mc", "--batch-size", "0"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--batch-size" in err
    with pytest.raises(SystemExit):
        main(["--model-dir", str(tmp_path / "nope"), "--tasks", "rmsgauge_local_mc", "--include-path", str(root),
              "--only-include-path"])
    assert "--model-dir" in capsys.readouterr().err


# ---- tasks validated before work, outputs against inputs, the claim and its planted bug --------------------


def _bad_tasks(root) -> dict[str, str]:
    """Task name -> the words its one-line refusal must hold."""
    good = json.dumps({"question": "q", "choices": ["a", "b"], "answer": 0})
    (root / "bad.jsonl").write_text(good + "\n{not json\n")
    (root / "range.jsonl").write_text(json.dumps({"question": "q", "choices": ["a", "b"], "answer": 7}) + "\n")
    (root / "empty.jsonl").write_text("")
    (root / "good.jsonl").write_text(good + "\n")

    def yaml(name: str, data: str, target: str | None = "answer", text: str = "{{question}}") -> None:
        (root / f"{name}.yaml").write_text(
            f"task: i19_{name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root / data}\n"
            f"test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{text}'\ndoc_to_choice: '{{{{choices}}}}'\n"
            + (f"doc_to_target: {target}\n" if target else "")
            + "metric_list:\n  - {metric: acc, aggregation: mean, higher_is_better: true}\n")

    yaml("notarget", "good.jsonl", target=None)
    yaml("badline", "bad.jsonl")
    yaml("range", "range.jsonl")
    yaml("empty", "empty.jsonl")
    yaml("undef", "good.jsonl", text="{{nosuch_field}}")
    yaml("good", "good.jsonl")
    return {"i19_notarget": "doc_to_target", "i19_badline": "does not parse", "i19_range": "not an index",
            "i19_empty": "no documents", "i19_undef": "nosuch_field", "i19_nosuch": "i19_nosuch"}


def _err_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.strip() and ln.startswith("python -m lm.evaluate")]


def test_bad_tasks_are_one_line_before_the_model(runs, tmp_path, capsys, monkeypatch):
    """The six reported tracebacks (no doc_to_target, a bad JSONL line, an answer index out of range, empty data,
    an undefined template field, --device cuda without CUDA) are one line each, exit 2, before the model loads."""
    import lm.evaluate as ev

    _, d, _, _ = runs["dense"]
    root = tmp_path / "tasks"
    root.mkdir()
    bad = _bad_tasks(root)
    monkeypatch.setattr(ev, "evaluate", lambda *a, **k: pytest.fail("the model was loaded"))
    base = ["--model-dir", str(d), "--include-path", str(root), "--only-include-path"]
    cases = [([*base, "--tasks", name], words) for name, words in bad.items()]
    if not torch.cuda.is_available():
        cases.append(([*base, "--tasks", "i19_good", "--device", "cuda"], "CUDA is not available"))
    for argv, words in cases:
        with pytest.raises(SystemExit) as e:
            main(argv)
        lines = _err_lines(capsys.readouterr().err)
        assert e.value.code == 2 and len(lines) == 1 and words in lines[0], (argv, lines)


def test_json_never_replaces_an_input(runs, tmp_path, capsys):
    _, d, _, root = runs["dense"]
    from lm.checkpoint import SUMS_NAME

    before = {p: p.read_bytes() for p in (root / "mc.jsonl", d / "config.json", d / SUMS_NAME)}
    base = ["--model-dir", str(d), "--tasks", "rmsgauge_local_mc", "--include-path", str(root), "--only-include-path"]
    for target in (root / "mc.jsonl", d / "config.json", d / "results.json", root / "mc.yaml"):
        with pytest.raises(SystemExit) as e:
            main([*base, "--json", str(target)])
        assert e.value.code == 2 and len(_err_lines(capsys.readouterr().err)) == 1
    assert all(p.read_bytes() == b for p, b in before.items()) and not (d / "results.json").exists()
    bare = tmp_path / "bare"
    import shutil

    shutil.copytree(d, bare)
    (bare / SUMS_NAME).unlink()
    assert main([*base[:0], "--model-dir", str(bare), *base[2:]]) == 1  # no SHA256SUMS: refused
    assert "--trust-unverified" in _err_lines(capsys.readouterr().err)[0]


def test_claim_holds_and_a_planted_bug_flips_it(runs, tmp_path, capsys, monkeypatch):
    """lm.evaluate states 'evaluation equals direct log-likelihood' as a claim: it holds, and a one-line bug in the
    HF wrapper (logits shifted by 0.01 on one byte) makes the command exit 1 with the claim failed."""
    import lm.hf_classes as hf

    _, d, _, root = runs["grt"]
    argv = ["--model-dir", str(d), "--tasks", "rmsgauge_local_mc,rmsgauge_local_ppl", "--include-path", str(root),
            "--only-include-path", "--limit", "3"]
    out = tmp_path / "ok.json"
    assert main([*argv, "--json", str(out)]) == 0
    claim = json.loads(out.read_text())["claims"][0]
    assert claim["id"] == "lm.harness_equals_direct_loglik" and claim["holds"] and claim["measured"]["requests"] >= 6
    assert "[HOLDS] lm.harness_equals_direct_loglik" in capsys.readouterr().out
    real = hf._ProjectForCausalLM.forward

    def planted(self, *a, **k):
        res = real(self, *a, **k)
        res.logits[..., 101] += 0.01  # byte 'e' a little more likely: every score moves
        return res

    monkeypatch.setattr(hf._ProjectForCausalLM, "forward", planted)
    bad = tmp_path / "bad.json"
    assert main([*argv, "--json", str(bad)]) == 1
    assert not json.loads(bad.read_text())["claims"][0]["holds"]
    assert "[FAILS] lm.harness_equals_direct_loglik" in capsys.readouterr().out


def test_a_shipped_model_evaluates_by_name(runs, tmp_path, capsys):
    """``--reference NAME``: the shipped model verified against its card and wrapped in memory scores exactly as its
    export does, and the claim holds; an export holding a file its SHA256SUMS does not list is refused."""
    from lm.reference import load_reference, reference_dir

    if not (reference_dir() / "grt.json").exists():
        pytest.skip("lm/reference_models/grt.json is not shipped yet")
    _, d, _, root = runs["dense"]
    task = ["--tasks", "rmsgauge_local_mc", "--include-path", str(root), "--only-include-path", "--limit", "3"]
    out = tmp_path / "ref.json"
    assert main(["--reference", "grt", *task, "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["reference"] == "grt" and saved["claims"][0]["holds"]
    exported = save_pretrained_dir(load_reference("grt"), tmp_path / "grt")
    res = evaluate(exported, ["rmsgauge_local_mc"], include_path=root, include_defaults=False, limit=3)
    assert res["results"]["rmsgauge_local_mc"] == saved["results"]["rmsgauge_local_mc"]
    import shutil

    extra = shutil.copytree(d, tmp_path / "extra")
    (extra / "helper.py").write_text("print('not exported')\n")
    capsys.readouterr()
    assert main(["--model-dir", str(extra), *task]) == 1
    assert "['helper.py'] not listed" in _err_lines(capsys.readouterr().err)[0]
