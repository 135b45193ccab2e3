"""The sandbox runs model-written code in a fenced child process, never in ours."""

import os
import socket

import pytest

from flowmagic.errors import ConfigError, SandboxError
from flowmagic.engine.sandbox import TESTS_FAILED, extract_code, run_code

pytestmark = pytest.mark.timeout(60)


def test_code_that_prints():
    result = run_code("print('hello', 6 * 7)")
    assert result.ok and result.returncode == 0 and result.stage is None
    assert result.stdout == "hello 42\n" and result.stderr == ""
    assert not result.timed_out and 0 < result.duration_s < 10


def test_code_that_raises_reports_its_traceback():
    result = run_code("x = 1\nraise ValueError('bad value')\n")
    assert not result.ok and result.returncode == 1 and result.stage == "code"
    assert "Traceback" in result.stderr and "ValueError: bad value" in result.stderr
    assert "solution.py" in result.stderr and "<string>" not in result.stderr
    assert "ValueError: bad value" in result.error()


def test_endless_loop_is_killed_at_the_timeout():
    result = run_code("while True:\n    pass\n", timeout=1.0)
    assert result.timed_out and not result.ok and result.stage == "timeout"
    assert 0.9 <= result.duration_s < 5
    assert "did not finish" in result.error()


def test_timeout_kills_the_whole_process_group():
    # The child sleeps; even a grandchild it could not start would be in its group.
    result = run_code("import time\ntime.sleep(30)\n", timeout=0.5)
    assert result.timed_out and result.duration_s < 5


def test_connection_to_a_loopback_listener_never_arrives():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.3)
        port = listener.getsockname()[1]
        code = ("import socket\n"
                f"socket.create_connection(('127.0.0.1', {port}), timeout=2)\n")
        raw = ("import socket\n"
               f"s = socket.socket(); s.settimeout(2); s.connect(('127.0.0.1', {port}))\n")
        first, second = run_code(code), run_code(raw)
        with pytest.raises(socket.timeout):
            listener.accept()
    for result in (first, second):
        assert not result.ok and result.stage == "code"
        assert "network access is not allowed" in result.stderr


def test_network_namespace_has_no_interfaces_but_loopback():
    result = run_code("import socket\nprint([n for _, n in socket.if_nameindex()])\n")
    if result.network != "namespace":
        pytest.skip("this machine does not let the sandbox create a network namespace")
    assert result.ok and result.stdout.strip() == "['lo']"


@pytest.mark.parametrize("how", [
    "open({path!r}, 'w').write('x')",
    "import pathlib; pathlib.Path({path!r}).write_text('x')",
    "import os; os.close(os.open({path!r}, os.O_CREAT | os.O_WRONLY))",
    "import os; open('inside.txt', 'w').write('x'); os.rename('inside.txt', {path!r})",
    "import os; os.symlink({path!r}, 'link'); open('link', 'w').write('x')",
    "import shutil; open('a', 'w').write('x'); shutil.copy('a', {path!r})",
    "import sqlite3; sqlite3.connect({path!r}).execute('create table t (x)')",
])
def test_writes_outside_the_work_dir_fail(tmp_path, how):
    target = tmp_path / "outside.txt"
    result = run_code(how.format(path=str(target)))
    assert not result.ok and "PermissionError" in result.stderr
    assert not target.exists()


def test_writes_inside_the_work_dir_work_and_are_deleted_after():
    result = run_code("import os, tempfile\n"
                      "open('out.txt', 'w').write('x')\n"
                      "tempfile.NamedTemporaryFile(delete=False).write(b'y')\n"
                      "print(os.getcwd())\n")
    assert result.ok, result.stderr
    work = result.stdout.strip()
    assert "flowmagic-sandbox-" in work
    assert not os.path.exists(work)


def test_environment_has_no_api_keys(monkeypatch):
    monkeypatch.setenv("FLOWMAGIC_API_KEY", "sk-flowmagic-secret")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-secret")
    result = run_code("import os\nprint(sorted(os.environ))\nprint(os.environ['HOME'])\n")
    assert result.ok
    assert "API_KEY" not in result.stdout and "secret" not in result.stdout
    names = eval(result.stdout.splitlines()[0])  # our own child's output, a list literal
    assert set(names) <= {"PATH", "LANG", "HOME", "TMPDIR", "OPENBLAS_NUM_THREADS",
                          "OMP_NUM_THREADS", "MKL_NUM_THREADS"}


def test_processes_and_limit_changes_are_refused():
    for code in ("import subprocess; subprocess.run(['true'])", "import os; os.system('true')",
                 "import resource; resource.setrlimit(resource.RLIMIT_CPU, (999, 999))",
                 "import ctypes; ctypes.CDLL(None).getpid()"):
        result = run_code(code)
        assert not result.ok and "not allowed" in result.stderr, code


def test_memory_limit():
    result = run_code("x = bytearray(400 << 20)\nprint('allocated')\n", memory_mb=128)
    assert not result.ok and "MemoryError" in result.stderr


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


def test_runs_in_another_process():
    result = run_code("import os\nprint(os.getpid())\n")
    assert int(result.stdout) != os.getpid()


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
