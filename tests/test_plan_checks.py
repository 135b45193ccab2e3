"""Topic and copy checks on plain words (plan_checks), table-driven."""

import pytest

from flowmagic.model.plan_checks import check_plan, copied, on_topic, subject_words, topic_share

SALES = "Analyse sales.csv and write three findings"
TEA_EXAMPLE = ["List five facts about tea.", "Describe a photo of a teacup."]


@pytest.mark.parametrize("requirement, task, examples, expected", [
    ("List five facts about tea.", SALES, TEA_EXAMPLE, True),        # the example, off topic
    ("List five facts about tea.", "Five facts about tea", TEA_EXAMPLE, False),  # the task's own
    ("<what this subtask produces for the task>", SALES, [], True),   # a placeholder as is
    ("<role>.", SALES, [], True),
    ("Keep the rows where a < 5 and b > 3", SALES, [], False),        # comparisons are not
    ("Load sales.csv with pandas", SALES, TEA_EXAMPLE, False),
    ("Plot the data", SALES, TEA_EXAMPLE, False),                      # off topic but no copy
    # SmolLM2 on the Beamer tutorial: a shown example's step, with task words added.
    ("Write the window that draws the board and takes clicks, and define every symbol",
     "Write Beamer slides; define every symbol before using it",
     ["Write the window that draws the board and takes clicks"], True),
    # An example adapted to the task is no copy.
    ("Load listings.csv with pandas and check the column types", "Analyse listings.csv",
     ["Load shop.csv with pandas and check the column types"], False),
])
def test_copied(requirement, task, examples, expected):
    assert copied(requirement, task, examples) is expected


def test_on_topic_follows_one_link_and_analysis_meets_analyse():
    reqs = ["Load sales.csv", "Run an analysis of the columns", "Plot the columns",
            "Paint the fence"]
    assert on_topic(reqs, SALES) == [True, True, True, False]
    assert topic_share(reqs, SALES) == 0.75
    assert topic_share([], SALES) == 1.0 and topic_share(reqs, "the and of") == 1.0


def test_check_plan_is_one_line_naming_a_copy():
    line = check_plan(TEA_EXAMPLE + ["Load sales.csv"], SALES, TEA_EXAMPLE)
    assert line.startswith("2 of 3 subtasks copy the prompt's example") and "\n" not in line
    assert check_plan(["Load sales.csv", "Plot it"], SALES, TEA_EXAMPLE) is None


def test_a_plural_is_the_same_word_and_the_subject_is_the_tasks_own_words():
    task = "How to Relieve Urinary Tract Infections in Cats"
    assert on_topic(["Lick the cat's nose", "Give the cat fresh water"], task) == [True, True]
    assert subject_words(task) == ["urinary", "tract", "infections", "cats"]
    assert subject_words("How to Prepare Saffron") == ["saffron"]
    assert subject_words("Do an EDA of listings.csv: load it, plot price") == ["eda", "listings.csv"]
