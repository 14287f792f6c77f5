"""A few planted bugs (``tools/mutate.py``), each in a temporary copy of the repository, must flip a check.

The full set (``python -m tools.mutate``) takes minutes; these three cover the three kinds of catcher: a
GRT claim (the written-out butterfly wiring), a GRT claim on values (the embedding's rebuilt pairs), and a
test pinning what a gauge check measures (the tensor's name read off the model).
"""

from __future__ import annotations

import dataclasses

import pytest

from tools.mutate import MUTATIONS, Mutation, run_one, score

BY_NAME = {m.name: m for m in MUTATIONS}


@pytest.mark.parametrize("name", ["stride_off_by_one", "embedding_cos_sin_swapped", "euler_measures_k_proj"])
def test_planted_bug_is_caught(name):
    r = run_one(BY_NAME[name])
    assert r.applied, r.note
    assert r.caught_by == [label for label, _ in BY_NAME[name].checks], r


def test_every_mutation_names_a_line_of_the_working_tree():
    # a mutation whose line moved would silently stop testing anything: each must match exactly once
    from tools.mutate import ROOT

    for m in MUTATIONS:
        assert (ROOT / m.path).read_text(encoding="utf-8").count(m.old) == 1, (m.name, m.path)
    assert len({m.name for m in MUTATIONS}) == len(MUTATIONS) >= 16


def test_a_mutation_that_does_not_apply_is_not_counted():
    ghost = dataclasses.replace(BY_NAME["stride_off_by_one"], name="ghost", old="this line is not in the file")
    r = run_one(Mutation(**{**dataclasses.asdict(ghost), "checks": ghost.checks}))
    assert not r.applied and not r.caught_by
    assert score([r]) == (0, 0)


def test_each_mutant_gets_a_fresh_kernel_cache(tmp_path):
    # nothing of numba's cache is copied, and the checks compile into an empty folder of the mutant's own
    from tools.mutate import IGNORE, mutant_env

    names = ["entry.rot_cascade_fwd-96.py311.nbi", "entry.rot_cascade_fwd-96.py311.1.nbc",
             "cascade.cpython-311.pyc"]
    assert set(IGNORE(str(tmp_path / "grt_model" / "kernels" / "__pycache__"), names)) == set(names)
    assert "__pycache__" in IGNORE(str(tmp_path / "grt_model"), ["__pycache__", "fused.py"])
    root = tmp_path / "repo"
    env = mutant_env(root)
    cache = env["NUMBA_CACHE_DIR"]
    assert cache.startswith(str(tmp_path)) and not (tmp_path / "numba-cache").exists()
    assert env["PYTHONPATH"] == str(root)


def test_a_kernel_mutation_is_caught_from_a_callee_file():
    # a callee kernel file edited: only a fresh (or correctly keyed) cache runs the mutant
    m = BY_NAME["kernel_angle_grad_factor"]
    assert m.path == "grt_model/kernels/coupled.py"
    r = run_one(m)
    assert r.applied, r.note
    assert r.caught_by == [label for label, _ in m.checks], r


def test_the_command_line_lists_and_refuses_before_copying(tmp_path, capsys, monkeypatch):
    import tools.mutate as mutate

    copied = []
    monkeypatch.setattr(mutate, "run_one", lambda m: copied.append(m.name))  # nothing may be copied or run
    assert mutate.main(["--list"]) == 0
    assert [ln.split()[0] for ln in capsys.readouterr().out.splitlines()] == list(BY_NAME)
    for argv, needle in ((["--only", "nosuch"], "--only must name mutations among"),
                         (["--json", str(tmp_path)], "is a directory")):
        with pytest.raises(SystemExit) as ex:
            mutate.main(argv)
        assert ex.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("python -m tools.mutate: error:") and needle in err[0]
    assert copied == []
