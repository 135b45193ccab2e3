"""JSON as models really write it: repaired, or a one-line error; cut-offs never completed."""

import json

import pytest

from flowmagic.errors import ModelOutputError, TruncatedError
from flowmagic.json_extract import extract_json

from conftest import DATA

CASES = [json.loads(line) for line in (DATA / "malformed_json.jsonl").read_text().splitlines()
         if line.strip()]


def test_corpus_is_large_and_has_captured_answers():
    assert len(CASES) >= 30
    assert any(case["source"] == "smollm2-135m" for case in CASES)


@pytest.mark.parametrize("case", CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_corpus(case):
    expect = case["expect"]
    if expect == "truncated":
        with pytest.raises(TruncatedError):
            extract_json(case["text"])
    elif expect == "error":
        with pytest.raises(ModelOutputError) as info:
            extract_json(case["text"])
        assert not isinstance(info.value, TruncatedError)
        assert "\n" not in str(info.value)
    else:
        assert extract_json(case["text"]) == expect


def test_length_finish_reason_is_truncation_not_a_guess():
    with pytest.raises(TruncatedError, match="cut off"):
        extract_json('{"plan": "', finish_reason="length")


def test_a_raw_newline_inside_a_string_is_read():
    # SmolLM2 under the embedded server's grammar wrote a line break inside a string value
    assert extract_json('{ "colour" : ");\n{" ,"count":1 }') == {"colour": ");\n{", "count": 1}
    assert extract_json('Here: {"a": "tab\there"}') == {"a": "tab\there"}
