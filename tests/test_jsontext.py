"""The reused JSON encoder writes what `json.dumps` writes, byte for byte: cache keys and
stored rows made before it must still match (see test_llm's stored-key test)."""

import json
import math

import pytest

from flowmagic._internal.jsontext import encoder
from flowmagic.model.status import Status

VALUES = [
    {"b": 1, "a": [1.5, -0.0, 1e300, 2**70, None, True, False], "c": {"z": "", "y": "x"}},
    [{"role": "user", "content": 'R\u00e9sum\u00e9 \u6570\u636e \u2014 "q"\n\t\\ \x00 \ud83d\ude00'}],
    {"status": Status.DONE, "nan": math.nan, "inf": [math.inf, -math.inf]},
    "a bare string \u00e9", 3, 2.5, None, [], {}, [[[[{"deep": [1, [2, [3]]]}]]]],
    {1: "int key", 2.5: "float key", None: "none key", True: "bool key"},
]


OPTIONS = [dict(sort_keys=True, ensure_ascii=False), dict(ensure_ascii=False, default=str),
           dict(ensure_ascii=True, default=str), {}]
# json cannot sort the keys of a dict whose keys are of mixed types either
CASES = [(v, o) for v in VALUES for o in OPTIONS if not (o.get("sort_keys") and isinstance(v, dict) and None in v)]


@pytest.mark.parametrize("value, options", CASES)
def test_the_text_is_json_dumps_byte_for_byte(value, options):
    assert encoder(**options)(value) == json.dumps(value, **options)


def test_a_value_inside_itself_and_an_unknown_type_fail_as_json_fails():
    loop: list = [1]
    loop.append({"again": loop})
    with pytest.raises(ValueError, match="Circular reference"):
        encoder()(loop)
    encode = encoder()
    with pytest.raises(TypeError, match="not JSON serializable"):
        encode({"x": object()})
    assert encode({"after": "the errors"}) == '{"after": "the errors"}'   # still usable
    assert encoder(default=str)({"p": object}) == json.dumps({"p": object}, default=str)
