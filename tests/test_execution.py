"""A node's answer put to work: named files saved, unnamed Python run in the sandbox with the
workspace as its working directory, figures saved as PNG, tracebacks kept."""

import pandas as pd
import pytest

from flowmagic.errors import ConfigError
from flowmagic.engine.answer_code import execute, report, split_answer
from flowmagic.engine.session import Session
from flowmagic.engine.workspace import Workspace

SALES = "region,units,price\nnorth,3,2.5\nsouth,5,4.0\nnorth,7,1.5\n"


@pytest.fixture
def ws(tmp_path):
    csv = tmp_path / "user" / "sales.csv"
    csv.parent.mkdir()
    csv.write_text(SALES)
    ws = Workspace(tmp_path / "ws", record=tmp_path / "inputs.json")
    ws.add([csv])
    return ws


def test_split_answer_tells_deliverables_from_analysis_code():
    answer = ("Here it is.\n```python\nprint(1)\n```\n"
              "```python gobang.py\nBOARD = 15\n```\n"
              "**index.html**\n```html\n<html></html>\n```\n"
              '```latex title="slides.tex"\n\\documentclass{beamer}\n```\n'
              "```python ../../etc/passwd.py\nx = 1\n```\n")
    code, files = split_answer(answer)
    assert code == ["print(1)\n"]   # a block with a file name is never code, even a bad name
    assert files == {"gobang.py": "BOARD = 15\n", "index.html": "<html></html>\n",
                     "slides.tex": "\\documentclass{beamer}\n", "../../etc/passwd.py": "x = 1\n"}


def test_inputs_are_described_with_schema_and_rows(ws, tmp_path):
    frame = pd.DataFrame({"a": [1, 2], "b": ["x", None]})
    ws.add({"df": frame, "threshold": 0.5})
    text = ws.describe()
    assert "sales.csv (table): 3 rows x 3 columns" in text and "units: int64" in text
    assert "df.csv (table)" in text and "b: " in text and "1 missing" in text
    assert "threshold.json (value)" in text and "0.5" in text
    assert pd.read_csv(ws.root / "df.csv").equals(frame)
    assert Workspace(ws.root, record=ws.record).describe() == text   # a resumed run says the same
    with pytest.raises(ConfigError, match="does not exist"):
        ws.add(["no-such.csv"])


def test_code_runs_on_the_inputs_and_its_figures_are_saved(ws):
    answer = ("```python\nimport pandas as pd\nimport matplotlib.pyplot as plt\n"
              "df = pd.read_csv('sales.csv')\nprint(df['units'].sum(), round(df['price'].mean(), 3))\n"
              "df.groupby('region')['units'].sum().to_csv('by_region.csv')\n"
              "df.plot.bar(x='region', y='units')\nplt.show()\n```")
    ex = execute(ws, "eda", answer)
    assert ex.ok and ex.ran, ex.stderr
    assert ex.stdout.split() == ["15", str(round(pd.read_csv(ws.root / "sales.csv")["price"].mean(), 3))]
    assert ex.files == ["by_region.csv", "eda_figure_1.png"] and ex.figures == ["eda_figure_1.png"]
    assert (ws.root / "eda_figure_1.png").read_bytes()[:4] == b"\x89PNG"
    assert "Figures it drew (PNG files): eda_figure_1.png" in report(ex)
    assert ws.files() == ["by_region.csv", "eda_figure_1.png", "sales.csv"]   # caches hidden


def test_a_traceback_names_the_nodes_own_line(ws):
    ex = execute(ws, "bad", "```python\nx = 1\ny = x / 0\n```")
    assert not ex.ok and ex.error == "ZeroDivisionError: division by zero"
    assert 'File "bad.py", line 2' in ex.stderr and "solution.py" not in ex.stderr


def test_the_code_cannot_write_outside_the_workspace(ws, tmp_path):
    target = tmp_path / "outside.txt"
    ex = execute(ws, "escape", f"```python\nopen({str(target)!r}, 'w').write('x')\n```")
    assert not ex.ok and not target.exists()


def test_execute_off_keeps_text_and_still_saves_files(ws):
    ex = execute(ws, "n", "```python\nprint(1)\n```\n```text notes.txt\nhello\n```", mode="off")
    assert not ex.ran and ex.saved == ["notes.txt"] and (ws.root / "notes.txt").read_text() == "hello\n"


def test_tracebacks_read_the_same_on_every_machine(ws):
    ex = execute(ws, "deep", "```python\nimport pandas as pd\npd.read_csv('missing.csv')\n```")
    assert not ex.ok and "FileNotFoundError" in ex.error
    assert 'File "<python>/site-packages/pandas/' in ex.stderr
    assert str(ws.root) not in report(ex) and "s)." not in report(ex)   # no paths, no timings


@pytest.mark.parametrize("frame", [
    pd.DataFrame({"region": ["north", "south", "north"], "units": [3, 5, 7], "price": [2.5, 4.0, 1.5]}),
    pd.DataFrame({"it's \"odd\"": [1.5, 2.5, 4.0], "flag": [True, False, True]}),   # quotes, one numeric
    pd.DataFrame({"city": ["Oslo", "Rome", "Oslo"]}),                               # nothing numeric
], ids=["numbers-and-groups", "quoted-name", "text-only"])
def test_the_working_start_runs_on_the_real_columns_and_draws_a_figure(tmp_path, frame):
    """What a small model is given to begin from: code that runs as it is, in the sandbox,
    prints pandas' own numbers for the file and draws a figure from its columns."""
    ws = Workspace(tmp_path / "ws")
    ws.add({"df": frame})
    start = ws.example()
    assert start.startswith("print(df.shape)\n")   # the session's prelude read it already
    session = Session(ws)
    ex = execute(ws, "start", f"```python\n{start}```", session=session)
    session.close()
    assert ex.ok and ex.ran, ex.stderr
    assert ex.stdout.startswith(f"{frame.shape}\n")
    assert str(pd.read_csv(ws.root / "df.csv").describe()) in ex.stdout
    assert ex.figures == ["start_figure_1.png"]


def test_the_working_start_prints_the_correlation_per_group(tmp_path):
    """A table with a group column and two numeric ones (make demo's Anscombe quartet): the
    start prints the correlation of the two per group as pandas computes it on the file, so
    the numbers the demo asks for come from code that ran even when the model's code fails."""
    from flowmagic.ops.nbrun import sample_data

    ws = Workspace(tmp_path / "ws")
    ws.add([str(sample_data("anscombe.csv"))])
    session = Session(ws)
    ex = execute(ws, "start", f"```python\n{ws.example()}```", session=session)
    session.close()
    assert ex.ok and ex.ran, ex.stderr
    df = pd.read_csv(sample_data("anscombe.csv"))
    assert str(df.groupby("dataset")[["x", "y"]].corr()) in ex.stdout
    assert "0.816" in ex.stdout   # Anscombe's point: the same correlation in all four


def test_no_table_input_no_working_start(tmp_path):
    ws = Workspace(tmp_path / "ws")
    assert ws.example() == ""
    ws.add({"threshold": 0.5})
    assert ws.example() == ""


@pytest.mark.parametrize("text, expected", [
    ("Plot the sales by month", True), ("Write a PYTHON script", True),
    ("Load the CSV and summarise it", True), ("Build a dataframe", True),
    ("Build a data frame", True), ("Make a Web Page about tea", True),
    ("Compute the mean", True), ("Analyse the results", True), ("Write slides.tex", True),
    ("Write a haiku about autumn", False), ("Do step 3 of the benchmark workflow.", False),
    ("Describe the database schema", False),   # 'data' inside a word is not \bdata\b
    ("", False), ("Ｗrite a poem", False),
    ("ſcript the release", True),   # beyond ASCII the regex's IGNORECASE still decides
])
def test_about_files_or_code_matches_its_word_list(text, expected):
    """The quick check before the regex (plain substrings, for ASCII texts) says exactly
    what the regex says: a prompt explains code and files only when a text asks for them."""
    from flowmagic.engine.answer_code import about_files_or_code
    assert about_files_or_code(text) is expected
    assert about_files_or_code("Write a haiku", text) is expected
