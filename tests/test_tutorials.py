"""The tutorials in notebooks/ under nbval, each in a fresh FLOWMAGIC_HOME with no endpoint.

Their committed outputs were recorded on the embedded model (notebooks/record.py); each
tutorial's first cell loads the answers of that recording into the cache, so the check
replays them: it must make no uncached model call, and every checked output must match.
"""

import os
import subprocess
import sys

import pytest

from conftest import ROOT

TUTORIALS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ENDPOINT_VARS = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "FLOWMAGIC_BASE_URL",
                 "FLOWMAGIC_API_KEY", "FLOWMAGIC_MODEL")


def test_there_are_four_tutorials_with_their_recorded_answers():
    assert [p.stem for p in TUTORIALS] == ["01_quickstart", "02_steering", "03_templates",
                                           "04_validation_and_updates"]
    for path in TUTORIALS:
        assert path.with_suffix(".cache.json").is_file(), path


@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_passes_nbval_without_calling_the_model(path, tmp_path):
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in ENDPOINT_VARS}
    env["FLOWMAGIC_HOME"] = str(home)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval", str(path), "-q", "-p", "no:cacheprovider",
         "--nbval-sanitize-with", str(ROOT / "flowmagic" / "nbval.cfg"),
         "--nbval-cell-timeout", "600", "-o", "addopts=", "-W", "default"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=880)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    from flowmagic.store import Store

    store = Store(home / "flowmagic.db")
    assert store.count_calls(cached=False) == 0, "a tutorial called the model: re-record it"
    assert store.count_calls(cached=True) > 0
    store.close()
