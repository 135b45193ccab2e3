"""The sandbox's contract: model-written code runs under bubblewrap, in a workdir, or not at all.

The attacks of issue 13 (process creation, the parent's /proc, planted secrets, signals,
writes outside, bombs) are in tests/test_sandbox_attacks.py; here is what a caller relies on.
"""

import os
import stat

import pytest

import flowmagic
from flowmagic.engine import sandbox as sandbox_module
from flowmagic.engine.code_blocks import extract_code
from flowmagic.engine.sandbox import TESTS_FAILED, run_code, sandbox_status
from flowmagic.engine.sandbox_launch import NONE_WARNING
from flowmagic.errors import ConfigError, SandboxError

pytestmark = pytest.mark.timeout(60)


def test_bubblewrap_is_available_here():
    # make test installs bubblewrap: the rest of this file must not be skipped on CI
    status = sandbox_status()
    assert status.available, status.reason
    assert status.mode == ("root, as an unused uid" if os.geteuid() == 0 else "user namespace")


def test_code_that_prints():
    result = run_code("print('hello', 6 * 7)")
    assert result.ok and result.returncode == 0 and result.stage is None
    assert result.stdout == "hello 42\n" and result.stderr == ""
    assert result.isolation == "bwrap" and not result.timed_out and 0 < result.duration_s < 10


def test_code_that_raises_reports_its_traceback():
    result = run_code("x = 1\nraise ValueError('bad value')\n")
    assert not result.ok and result.returncode == 1 and result.stage == "code"
    assert "Traceback" in result.stderr and "ValueError: bad value" in result.stderr
    assert "solution.py" in result.stderr and "sandbox_child" not in result.stderr
    assert "ValueError: bad value" in result.error()


def test_endless_loop_is_killed_at_the_timeout():
    result = run_code("while True:\n    pass\n", timeout=1.0)
    assert result.timed_out and not result.ok and result.stage == "timeout"
    assert 0.9 <= result.duration_s < 5
    assert "did not finish" in result.error()


def test_workdir_is_the_cwd_and_what_the_code_wrote_is_listed(tmp_path):
    (tmp_path / "old.txt").write_text("old")
    (tmp_path / "same.txt").write_text("same")
    code = ("import os\nprint(os.getcwd())\nos.makedirs('plots')\n"
            "open('plots/a.png', 'wb').write(b'png')\nopen('old.txt', 'a').write('er')\n"
            "open('results.csv', 'w').write('x\\n1\\n')\n")
    result = run_code(code, workdir=tmp_path)
    assert result.ok, result.stderr
    assert result.stdout.strip() == str(tmp_path) and result.workdir == str(tmp_path)
    assert result.files == ["old.txt", "plots/a.png", "results.csv"]
    assert (tmp_path / "old.txt").read_text() == "older"
    # the files are the user's again, not the sandbox's (as root it ran as another uid)
    owner = os.stat(tmp_path).st_uid
    assert {os.stat(tmp_path / f).st_uid for f in result.files} == {owner}


def test_a_temporary_workdir_is_deleted_after():
    result = run_code("import os\nopen('out.txt', 'w').write('x')\nprint(os.getcwd())\n")
    assert result.ok and result.files == ["out.txt"] and result.workdir is None
    assert not os.path.exists(result.stdout.strip())


def test_inputs_are_readable_and_read_only(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "sales.csv").write_text("month,total\njan,3\n")
    code = (f"print(open({str(data / 'sales.csv')!r}).read().split()[1])\n"
            f"open({str(data / 'sales.csv')!r}, 'a').write('feb,4')\n")
    result = run_code(code, inputs=[data])
    assert result.stdout == "jan,3\n" and not result.ok
    assert "Read-only file system" in result.stderr or "Permission denied" in result.stderr
    assert (data / "sales.csv").read_text() == "month,total\njan,3\n"


def test_nothing_else_of_the_host_is_visible(tmp_path):
    private = tmp_path / "private.txt"
    private.write_text("mine")
    code = ("import os\n"
            f"print(os.path.exists({str(private)!r}), os.listdir(os.path.expanduser('~')),"
            " sorted(p for p in os.listdir('/proc') if p.isdigit()))\n")
    result = run_code(code)
    assert result.ok, result.stderr
    assert result.stdout.startswith("False [] [")
    assert len(eval(result.stdout.split("] ", 1)[1])) <= 3   # bwrap's init, the code, maybe ls


def test_a_missing_input_or_workdir_is_one_line(tmp_path):
    with pytest.raises(SandboxError, match="does not exist"):
        run_code("print(1)", inputs=[tmp_path / "nope.csv"])
    with pytest.raises(SandboxError, match="is not a directory"):
        run_code("print(1)", workdir=tmp_path / "nope")


def test_symlinks_out_of_the_workdir_are_removed(tmp_path):
    code = ("import os\nos.symlink('/etc/passwd', 'passwd')\nos.symlink('/', 'root')\n"
            "os.symlink('data.csv', 'alias.csv')\nopen('data.csv', 'w').write('1')\n")
    result = run_code(code, workdir=tmp_path)
    assert result.ok and sorted(result.removed_links) == ["passwd", "root"]
    assert sorted(os.listdir(tmp_path)) == ["alias.csv", "data.csv"]


def test_no_setuid_file_is_left_behind(tmp_path):
    result = run_code("import os\nopen('tool', 'w').write('x')\nos.chmod('tool', 0o6755)\n",
                      workdir=tmp_path)
    assert result.ok and result.files == ["tool"]
    mode = os.stat(tmp_path / "tool").st_mode
    if os.geteuid() == 0:
        assert not mode & (stat.S_ISUID | stat.S_ISGID)


def test_two_runs_in_one_workdir_at_once(tmp_path):
    import concurrent.futures
    code = "import time\nopen(f'{name}.txt', 'w').write('x')\ntime.sleep(0.5)\nopen('{name}.txt', 'a')\n"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda n: run_code(code.replace("{name}", n), workdir=tmp_path),
                                ["a", "b"]))
    assert all(r.ok for r in results), [r.stderr for r in results]
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "b.txt"]


def test_environment_has_no_api_keys(monkeypatch):
    env_key, configured = "sk-" + "flowmagic-env-secret", "sk-" + "configured-secret-xyz"
    monkeypatch.setenv("FLOWMAGIC_API_KEY", env_key)
    monkeypatch.setenv("OPENAI_API_KEY", env_key)
    flowmagic.configure(base_url="http://127.0.0.1:9/v1", api_key=configured)
    result = run_code("import os\nprint(sorted(os.environ))\nprint(os.environ['HOME'])\n")
    assert result.ok
    assert "API_KEY" not in result.stdout and "secret" not in result.stdout
    names = eval(result.stdout.splitlines()[0])  # our own child's output, a list literal
    assert set(names) <= {"PATH", "PWD", "LANG", "HOME", "TMPDIR", "USER", "LOGNAME", "MPLBACKEND",
                          "MPLCONFIGDIR", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                          "MKL_NUM_THREADS"}


def test_a_key_in_the_output_is_scrubbed():
    key = "sk-" + "configured-secret-xyz123"
    flowmagic.configure(base_url="http://127.0.0.1:9/v1", api_key=key)
    result = run_code(f"print({key[:10]!r} + {key[10:]!r})\nraise ValueError({key!r})")
    assert key not in result.stdout + result.stderr
    assert "[key hidden]" in result.stdout and "[key hidden]" in result.stderr


def test_limits_hold():
    memory = run_code("x = bytearray(400 << 20)\nprint('allocated')\n", memory_mb=128)
    assert not memory.ok and "MemoryError" in memory.stderr
    processes = run_code("import os, time\nfor i in range(50):\n"
                         "    if os.fork() == 0:\n        time.sleep(5)\n        os._exit(0)\n",
                         max_processes=8, timeout=3)
    assert not processes.ok and "Resource temporarily unavailable" in processes.stderr
    big = run_code("open('big', 'wb').write(b'x' * (3 << 20))", file_limit_mb=1)
    assert not big.ok and "File too large" in big.stderr


def test_tests_run_after_the_code_in_its_namespace():
    code = "def add(a, b):\n    return a + b\n"
    good = run_code(code, tests="assert add(1, 2) == 3\ndef test_zero():\n    assert add(0, 0) == 0\n")
    assert good.ok, good.stderr
    bad = run_code(code, tests="def test_ok():\n    assert add(1, 1) == 2\n"
                               "def test_wrong():\n    assert add(2, 2) == 5, 'two and two'\n")
    assert not bad.ok and bad.returncode == TESTS_FAILED and bad.stage == "tests"
    assert "FAILED test_wrong" in bad.stderr and "two and two" in bad.stderr
    assert "test_ok" not in bad.stderr.split("failed:")[-1]


def test_tests_do_not_run_when_the_code_crashes():
    result = run_code("raise KeyError('k')", tests="print('tests ran')")
    assert result.stage == "code" and "tests ran" not in result.stdout


def test_code_that_exits_zero_still_gets_tested():
    result = run_code("import sys\nvalue = 3\nsys.exit(0)\n", tests="assert value == 4")
    assert result.stage == "tests"


def test_output_is_clipped_to_the_budget():
    result = run_code("print('a' * 100000)\nprint('THE END')\n", output_limit=1000)
    assert result.ok and len(result.stdout) < 1200
    assert " cut ...]" in result.stdout and "THE END" in result.stdout


def test_site_packages_only_when_asked():
    code = "import numpy\nprint(numpy.arange(4).sum())\n"
    assert "ModuleNotFoundError" in run_code(code).stderr
    with_site = run_code(code, site_packages=True)
    assert with_site.ok and with_site.stdout.strip() == "6", with_site.stderr


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(SandboxError):
        run_code(b"print(1)")
    with pytest.raises(ConfigError):
        run_code("print(1)", timeout=-1)
    with pytest.raises(ConfigError, match="'bwrap'.*'none'"):
        run_code("print(1)", sandbox="docker")


def test_runs_in_another_process():
    result = run_code("import os\nprint(os.getpid())\n")
    assert int(result.stdout) != os.getpid()


# -- where bubblewrap cannot run ----------------------------------------------------------
def test_without_bubblewrap_code_execution_is_off_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))   # no bwrap on it
    try:
        status = sandbox_status(refresh=True)
        assert not status.available and "\n" not in status.reason
        assert "install it (apt-get install bubblewrap" in status.reason
        assert "sandbox='none'" in status.reason
        marker = tmp_path / "ran"
        with pytest.raises(SandboxError) as refused:
            run_code(f"open({str(marker)!r}, 'w')")
        assert str(refused.value) == status.reason and not marker.exists()
    finally:
        monkeypatch.undo()
        assert sandbox_status(refresh=True).available


def test_sandbox_none_runs_with_a_warning_every_time(capfd, tmp_path):
    for _ in range(2):
        result = run_code("import os\nprint(os.getcwd())", sandbox="none", workdir=tmp_path)
        assert result.ok and result.isolation == "none" and result.stdout.strip() == str(tmp_path)
    assert capfd.readouterr().err.count(NONE_WARNING) == 2


def test_the_contract_is_documented():
    doc = sandbox_module.__doc__
    for word in ("workdir", "inputs", "files", "site_packages", "max_processes",
                 "sandbox_status", "sandbox=\"none\""):
        assert word in doc, word


# -- extract_code --------------------------------------------------------------------

ANSWER = """Here is the function:

```python
def square(x):
    return x * x
```

Run it like this:

```
print(square(3))
```

Some JSON, which is not code to run:

```
{"a": 1}
```

```bash
pip install numpy
```

~~~py
  indented = True
~~~
"""


def test_extract_code_takes_python_fences_and_code_like_plain_fences():
    blocks = extract_code(ANSWER)
    assert blocks == ["def square(x):\n    return x * x\n", "print(square(3))\n", "indented = True\n"]


@pytest.mark.parametrize("text, expected", [
    ("no code at all", []),
    ("```\nhello world\n```", []),
    ("```\n42\n```", []),
    ("```python\nx = 1\n", ["x = 1\n"]),          # a cut-off answer
    ("````python\n```\nnested\n```\n````", ["```\nnested\n```\n"]),
    ("```Python\nprint(1)\n```", ["print(1)\n"]),
    ("```python\n\n```", []),
    (None, []),
])
def test_extract_code_edge_cases(text, expected):
    assert extract_code(text) == expected
