"""python -m gauge census: its flags are checked before any work, in one line each (exit 2): --json is never one of
the command's inputs (the model's own source file included), --set passes keyword arguments to a --model factory
(and refuses what the factory does not take), --seed names its range."""

from __future__ import annotations

import sys
import textwrap

import pytest

from gauge.census import census
from gauge.census.cli import main

FACTORY = textwrap.dedent('''
    from pathlib import Path
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Net(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.fc = nn.Linear(4, width, bias=False)
            self.norm = nn.RMSNorm(width, eps=1e-6)
            self.head = nn.Linear(width, 3)

        def forward(self, x, y):
            return F.cross_entropy(self.head(torch.tanh(self.norm(self.fc(x)))), y)

    def build(width=6):
        Path(__file__).with_name("factory_ran").write_text("ran")
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(1)
        return Net(width), (torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g))

    def needs(width):
        return build(width)
''')


@pytest.fixture
def factory(tmp_path, monkeypatch):
    pkg = tmp_path / "census_user_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("census_user_pkg", "census_user_pkg.models"):  # each test imports its own copy
        monkeypatch.delitem(sys.modules, name, raising=False)
    return pkg


def _status(argv: list[str]) -> int:
    """The exit status of ``main(argv)``: a usage error found before any work exits through argparse."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def _one_line_error(capsys, *fragments: str) -> None:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert all(f in err for f in fragments), err


def test_json_is_never_the_models_source_file(factory, capsys):
    """--json naming the module that defines the model (or its package's __init__) is refused before the factory
    runs, and the file is intact; another path works."""
    src = factory / "models.py"
    before = src.read_text()
    for target in (src, factory / "__init__.py"):
        spec = "census_user_pkg.models:build" if target.name == "models.py" else "census_user_pkg:models"
        assert _status(["--model", spec, "--quiet", "--json", str(target)]) == 2
        _one_line_error(capsys, "--json", "is the input --model")
    assert src.read_text() == before and not (factory / "factory_ran").exists()
    out = factory.parent / "census.json"
    assert main(["--model", "census_user_pkg.models:build", "--quiet", "--json", str(out)]) == 0
    assert out.is_file() and (factory / "factory_ran").exists()


def test_set_passes_keyword_arguments_to_the_factory(factory, capsys):
    """--set width=8 builds Net(8): the table shows fc.weight as 8x4 (6x4 without it)."""
    assert main(["--model", "census_user_pkg.models:build", "--quiet", "--set", "width=8"]) == 0
    assert "8x4" in capsys.readouterr().out
    assert main(["--model", "census_user_pkg.models:needs", "--quiet", "--set", "width=7"]) == 0
    assert "7x4" in capsys.readouterr().out


def test_set_sizes_the_projects_own_factories(capsys):
    """gauge.census.examples:dense_qknorm --set n_layers=1: one block, so only block 0's q_proj/k_proj appear."""
    assert main(["--model", "gauge.census.examples:dense_qknorm", "--quiet", "--no-eps", "--set", "n_layers=1"]) == 0
    out = capsys.readouterr().out
    assert "blocks.0.attn.q_proj.weight" in out and "blocks.1." not in out


@pytest.mark.parametrize(("spec", "sets", "fragments"), [
    ("build", ["bogus"], ("--set must be KEY=VALUE", "'bogus'")),
    ("build", ["=3"], ("--set must be KEY=VALUE",)),
    ("build", ["width=8", "width=9"], ("--set width is given twice",)),
    ("build", ["depth=3"], ("--set depth", "takes no keyword 'depth'", "it takes width")),
    ("needs", [], ("the factory needs width", "--set width=VALUE")),
])
def test_set_refuses_what_the_factory_cannot_take(factory, capsys, spec, sets, fragments):
    argv = ["--model", f"census_user_pkg.models:{spec}", "--quiet"]
    for s in sets:
        argv += ["--set", s]
    assert _status(argv) == 2
    _one_line_error(capsys, *fragments)
    assert not (factory / "factory_ran").exists()


@pytest.mark.parametrize(("seed", "fragments"), [("1e23", ("--seed", "invalid int value", "'1e23'")),
                                                 *((s, ("seed must be an integer in [0, 2**32 - 1]", s))
                                                   for s in (str(10**23), "-1", str(2**32)))])
def test_seed_out_of_range_names_the_flag_and_its_range(capsys, seed, fragments):
    with pytest.raises(SystemExit) as exit_:
        main(["--model", "gauge.census.examples:conv_bn", "--quiet", "--seed", seed])
    assert exit_.value.code == 2
    _one_line_error(capsys, *fragments)


def test_census_seed_out_of_range_is_one_line():
    from gauge.census.examples import conv_bn

    model, batch = conv_bn()
    with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\*\*32 - 1\]"):
        census(model, batch=batch, seed=10**23)
