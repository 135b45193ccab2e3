"""The package as pip gives it to a user: the sdist and wheel a release builds, their files and
metadata, the version from one source, and the README a package page shows."""

import re
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import flowmagic

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(sdist, wheel) built as a release builds them: the sdist first, the wheel from it."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    return next(out.glob("*.tar.gz")), next(out.glob("*.whl"))


@pytest.fixture(scope="module")
def metadata(built):
    with zipfile.ZipFile(built[1]) as whl:
        name = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(whl.read(name).decode())


def test_the_wheel_and_the_sdist_carry_the_apache_licence(built):
    sdist, wheel = built
    with zipfile.ZipFile(wheel) as whl:
        licences = [n for n in whl.namelist() if n.endswith("licenses/LICENSE")]
        assert licences, "no LICENSE in the wheel"
        assert "Apache License" in whl.read(licences[0]).decode()
    with tarfile.open(sdist) as tar:
        assert any(n.endswith("/LICENSE") for n in tar.getnames()), "no LICENSE in the sdist"


def test_the_wheel_says_what_runs_and_where_it_comes_from(metadata):
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["Requires-Python"] == ">=3.11"   # StrEnum, TaskGroup, asyncio.timeout
    classifiers = metadata.get_all("Classifier")
    assert "Framework :: Jupyter" in classifiers
    tested = {c.rsplit(":: ", 1)[1] for c in classifiers
              if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)}
    assert tested == {"3.11", "3.12"}
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL"))
    assert all(u.startswith("https://") for u in urls.values()) and "Homepage" in urls
    assert metadata["Version"] == flowmagic.__version__


def test_scipy_is_no_longer_mandatory_and_all_brings_every_user_extra(metadata):
    requires = metadata.get_all("Requires-Dist")
    mandatory = [r for r in requires if "extra ==" not in r]
    assert not any(r.startswith("scipy") for r in mandatory)
    assert any(r.startswith("tqdm") for r in mandatory)
    extras = set(metadata.get_all("Provides-Extra"))
    assert {"local", "data", "dask", "all"} <= extras
    everything = [r for r in requires if r.endswith('extra == "all"')]
    assert any("local" in r and "data" in r and "dask" in r for r in everything)


def test_the_wheel_holds_the_templates_their_data_and_the_front_end(built):
    with zipfile.ZipFile(built[1]) as whl:
        names = set(whl.namelist())
    for name in ("flowmagic/__main__.py", "flowmagic/templates/csv_eda.ipynb",
                 "flowmagic/templates/plans.json", "flowmagic/templates/data/anscombe.csv",
                 "flowmagic/jupyter/controls.js", "flowmagic/nbval.cfg"):
        assert name in names, name


@pytest.mark.parametrize("command", [["flowmagic"], [sys.executable, "-m", "flowmagic"]])
def test_version_from_the_command_and_from_python_dash_m(command):
    if command == ["flowmagic"]:
        command = [str(Path(sys.executable).with_name("flowmagic"))]
    done = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"flowmagic {flowmagic.__version__}"


def test_the_readme_a_package_ships_links_nowhere_outside_itself():
    """PyPI shows the README alone: a link into the source tree above it leads nowhere."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "../" not in text
    assert 'pip install "flowmagic[local]"' in text


def _other_python() -> str | None:
    """A CPython 3.12 beside the one running the tests: pyenv's, or one on PATH that runs (a
    pyenv shim on PATH refuses to when 3.12 is not the selected version)."""
    import shutil
    candidates = []
    try:
        prefix = subprocess.run(["pyenv", "prefix", "3.12"], capture_output=True, text=True,
                                timeout=30).stdout.strip()
        candidates.append(f"{prefix}/bin/python3.12" if prefix else None)
    except (OSError, subprocess.SubprocessError):
        pass
    candidates.append(shutil.which("python3.12"))
    for python in filter(None, candidates):
        try:
            ok = subprocess.run([python, "-c", "import sys; assert sys.version_info[:2] == (3, 12)"],
                                capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok = False
        if ok:
            return python
    return None


def test_the_wheel_installs_and_runs_a_flow_on_python_3_12(built, tmp_path):
    """The second minor version the classifiers claim: the built wheel in a fresh 3.12 venv
    plans and runs a flow (TaskGroup, StrEnum, the HTTP client) against a loopback model."""
    python = _other_python()
    if python is None:
        pytest.skip("no CPython 3.12 on this machine (PATH or pyenv): 3.12 is not checked here")
    venv = tmp_path / "venv312"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin/pip"), "install", "-q", str(built[1])],
                         capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stderr[-2000:]
    env = {"PATH": "/usr/bin:/bin", "FLOWMAGIC_HOME": str(tmp_path / "home"),
           "FLOWMAGIC_DISCOVER": "0", "FLOWMAGIC_CHECK_MODELS": "0", "HOME": str(tmp_path)}
    version = subprocess.run([str(venv / "bin/flowmagic"), "--version"], capture_output=True,
                             text=True, timeout=60, env=env)
    assert version.stdout.strip() == f"flowmagic {flowmagic.__version__}", version.stderr
    done = subprocess.run([str(venv / "bin/python"), str(ROOT / "tests/data/smoke_flow.py")],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "python 3.12 done ['serve', 'steep']"
