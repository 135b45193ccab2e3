"""The prompt cutters: one helper (_internal/text.cut), the same text each style always gave."""

import pytest

from flowmagic._internal.text import cut
from flowmagic.engine import repairs, updater
from flowmagic.engine.node_runner import cut as runner_cut

TEXT = "abcdefghijklmnopqrstuvwxyz0123456789"   # 36 characters

CASES = [   # (style, limit, expected): these texts are in prompts, so in cache keys
    (runner_cut, 40, TEXT),
    (runner_cut, 10, "abcdefghij\n[cut here: 26 more characters not shown]"),
    (runner_cut, 0, "\n[cut here: 36 more characters not shown]"),
    (repairs._cut, 36, TEXT),
    (repairs._cut, 16, "abcdefghij [cut]"),
    (updater._cut, 30, "abcdefghijklmnopqrst [cut] 789"),
    (updater._cut, 25, "abcdefghijklmnop [cut] 89"),
    (updater._cut, 19, "[cut]"),
    (lambda text, limit: cut(text, limit, " [cut]"), 5, "abcde [cut]"),
]


@pytest.mark.parametrize("style, limit, expected", CASES)
def test_each_style_cuts_as_it_always_did(style, limit, expected):
    assert style(TEXT, limit) == expected
    assert style(None if style is not updater._cut else "", limit) == ""


@pytest.mark.parametrize("limit", [20, 21])
def test_the_updater_cut_stays_within_its_limit(limit):
    # its tail was text[-0:] at these limits: the whole text again after the head
    got = updater._cut(TEXT, limit)
    assert len(got) <= limit and got.startswith("abcdefghijklm") and got.endswith("[cut] ")
