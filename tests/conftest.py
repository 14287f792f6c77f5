"""Hypothesis profiles and shared fixtures.

Profile chosen by ``RMSGAUGE_HYPOTHESIS`` (default ``ci``):
- ``ci``: derandomized, no example database, modest example counts -- reproducible CI.
- ``dev``: random, with a database and more examples -- for hunting counterexamples.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    max_examples=25,
    deadline=None,  # timing varies on 2 shared cores; speed lives in the benchmark script
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile(
    "dev",
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile(os.environ.get("RMSGAUGE_HYPOTHESIS", "ci"))


@pytest.fixture(autouse=True)
def _torch_state():
    """Each test starts from float32 default dtype, one thread, and a fixed seed."""
    from rmsgauge import seed_everything

    torch.set_default_dtype(torch.float32)
    prev = torch.get_num_threads()
    torch.set_num_threads(1)  # xdist already uses both cores; avoid oversubscription
    seed_everything(0)
    yield
    torch.set_num_threads(prev)


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """40 KB of the bundled corpus, as bytes: a 10% validation split of 16-byte windows, fast to load."""
    from rmsgauge.corpus import bundled_corpus_files

    path = tmp_path_factory.mktemp("corpus") / "small.txt"
    path.write_bytes(bundled_corpus_files()[0].read_bytes()[:40_000])
    return path
