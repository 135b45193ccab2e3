"""Reading and writing notebooks does not pay for jsonschema's IRI grammars.

nbformat's validator imports jsonschema, which imports rfc3987-syntax when installed, and
that builds ~38 parsers at import (1.4 s of every `flowmagic run` and of the first export in
a kernel). Each case runs in a fresh interpreter, as a CLI run or a kernel starts.
"""

import json
import subprocess
import sys

import pytest

from conftest import ROOT

pytest.importorskip("rfc3987_syntax", reason="only where jsonschema's format-nongpl extra is installed")


def _fresh(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


READ = """
import json, sys
from flowmagic.ops import nbrun
nb = nbrun._read(nbrun.TEMPLATES / "csv_eda.ipynb")
built = "rfc3987_syntax" in sys.modules
import nbformat
nbformat.validate(nb)
import rfc3987_syntax   # the user's own code still can
import jsonschema
print(json.dumps({"built": built, "valid": True,
                  "iri": "iri" in jsonschema.FormatChecker.checkers}))
"""


def test_reading_a_notebook_does_not_build_the_iri_grammars_and_leaves_the_module_importable():
    seen = _fresh(READ)
    assert seen["built"] is False
    assert seen["valid"] is True
    assert seen["iri"] is False   # as jsonschema without its format-nongpl extra


def test_a_process_that_imported_jsonschema_first_keeps_its_iri_checks():
    seen = _fresh("import jsonschema\n" + READ)
    assert seen["built"] is True   # it was built by the user's own import, before ours
    assert seen["iri"] is True
