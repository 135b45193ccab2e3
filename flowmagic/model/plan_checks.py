"""Is a plan about its task? Topic and copy checks on plain words, no model.

Small models often answer with the prompt's example instead of a plan for the task
(SmolLM2-135M planned "List five facts about tea" for an analysis of sales.csv). A
subtask is *on topic* when it shares a content word (compared by its first five letters
after a plural "s": "analysis" meets "analyse", "cats" meets "cat's") with the task, or
with a subtask that does (so "Boil the water" next to "Heat water for the tea" counts).
A subtask *copies* an example when it repeats an example's text (or a `<placeholder>`)
and is not on topic. `check_plan` says so in one line, and the planner makes such a
candidate a failed one. Being off topic alone
is only reported (`topic_share`, a warning): "Load the data" is a fine first step for
"Analyse sales.csv" and shares no word with it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

__all__ = ["content_words", "subject_words", "on_topic", "topic_share", "same_task",
           "copied", "check_plan", "data_task", "loads_only", "states_only",
           "computes", "writes", "normalized", "asks_split", "splits_only", "without_split"]

_STOP = set("""a an the and or of to in on for with from by at as is are be it its this that
these those then than into onto each every all any some one two three four five six seven
eight nine ten first next last final step steps task tasks subtask make do does done use
using used get give write short about your you our their them they his her which what when
how who not no yes can will should must may might also more most other such only very""".split())
# A whole requirement in angle brackets ("<what this subtask produces>"); "a < b > c" is not.
_PLACEHOLDER = re.compile(r"^\s*<[A-Za-z][^<>]{0,80}>\W*$")
COPY_RATIO = 0.8      # similarity of a whole subtask to an example
CONTAIN_RATIO = 0.9   # share of an example found verbatim inside a subtask


def _words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z][a-z0-9]+", text.lower()) if len(w) > 2 and w not in _STOP]


def _stem(word: str) -> str:
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]   # "cats" and "cat's" are the cat; "glass" stays
    return word[:5]


def content_words(text: str) -> set[str]:
    """Lowercase words of 3+ letters minus common words, without a plural "s", cut to their
    first five letters."""
    return {_stem(w) for w in _words(text)}


def subject_words(task: str, n: int = 4) -> list[str]:
    """What every step is about: up to `n` content words of the task's first clause, as
    written (lowercase, file names whole), without its leading verb ("How to Relieve
    Urinary Tract Infections in Cats" -> urinary, tract, infections, cats)."""
    clause = re.split(r"[:;,(]| - ", task.lower(), maxsplit=1)[0]
    clause = re.sub(r"^\s*how\s+to\s+", "", clause)
    words = re.findall(r"[a-z][a-z0-9_-]*(?:\.[a-z0-9]+)?", clause)
    if words and words[0] not in _STOP and len(words) > 1:
        words = words[1:]   # the verb: "prepare" says less about the task than "saffron"
    out: list[str] = []
    for w in words:
        if len(w) > 2 and w not in _STOP and w not in out:
            out.append(w)
    return out[:n] or [w for w in _words(task) if not w.isdigit()][:n]


def on_topic(requirements: list[str], task: str) -> list[bool]:
    """Per subtask: shares a content word with the task, or with a subtask that does."""
    task_words = content_words(task)
    words = [content_words(r) for r in requirements]
    direct = [bool(w & task_words) for w in words]
    linked = set().union(*(w for w, d in zip(words, direct) if d)) if any(direct) else set()
    return [d or bool(w & linked) for w, d in zip(words, direct)]


def same_task(a: str, b: str) -> bool:
    """Whether two tasks are about the same thing (half the content words of the shorter
    one shared): the user's own plan for the task is then an example to follow, no copy."""
    wa, wb = content_words(a), content_words(b)
    return bool(wa and wb) and len(wa & wb) >= 0.5 * min(len(wa), len(wb))


def normalized(text: str) -> str:
    """The text's words, lowercase, one space apart (case, spacing and punctuation aside)."""
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def _contains(mine: str, example: str) -> bool:
    """Most of the example's text appears verbatim in `mine` (a copy with words added)."""
    if len(example) < 20:
        return False
    match = difflib.SequenceMatcher(None, mine, example, autojunk=False).find_longest_match()
    return match.size >= CONTAIN_RATIO * len(example)


def copied(requirement: str, task: str, examples: Iterable[str]) -> bool:
    """True when the text is a placeholder, repeats an example text without being about the
    task, or carries most of an example verbatim whose words the task does not have."""
    if _PLACEHOLDER.match(requirement):
        return True
    mine, task_words = normalized(requirement), content_words(task)
    about_task = bool(content_words(requirement) & task_words)
    for example in examples:
        theirs = normalized(example)
        if not theirs:
            continue
        if not about_task and difflib.SequenceMatcher(None, mine, theirs).ratio() >= COPY_RATIO:
            return True
        theirs_words = content_words(example)
        foreign = len(theirs_words - task_words) > len(theirs_words) / 2
        if foreign and _contains(mine, theirs):
            return True
    return False


# a table file, a dataset or a DataFrame ("hash tables" or "data privacy" are no data task)
_DATA_TASK = re.compile(r"\.(?:csv|tsv|xlsx?|parquet|feather)\b|\bcsv\b|\bdata ?frames?\b|"
                        r"\bdatasets?\b", re.IGNORECASE)
_LOADS = re.compile(r"^\W*(?:first,?\s+)?(?:load|read|import|open|ingest|bring)\b", re.IGNORECASE)
# A verb or noun of work beyond loading: a step holding one does more than load.
_WORK = re.compile(
    r"\b(?:describ|summar|count|comput|calculat|plot|chart|graph|draw|fit|train|test|split|clean|"
    r"filter|merge|join|group|mean|median|average|sum\b|total|analy|explor|check|inspect|"
    r"list|report|find|compar|transform|convert|encod|normali|scal|drop|remov|fill|imput|"
    r"visuali|correl|regress|model|predict|estimat|select|sort|rank|aggregat|pivot|"
    r"missing|statistic|distribut|outlier|valid|verif|pars)", re.IGNORECASE)
_DATA_OBJECT = re.compile(r"\.(?:csv|tsv|xlsx?|parquet|json|feather)\b|\bdata|\btable|"
                          r"\bfile|\blibrar|\bpandas\b|\bnumpy\b|\bmatplotlib\b|"
                          r"\bpackages?\b|\bmodules?\b", re.IGNORECASE)


def data_task(task: str) -> bool:
    """Whether a task works on data (a table file, a dataset, a DataFrame)."""
    return _DATA_TASK.search(task or "") is not None


def loads_only(requirement: str) -> bool:
    """Whether a subtask only loads data or imports libraries ("Load penguins.csv into a
    pandas DataFrame"): the session holds the inputs and the usual libraries before any
    subtask runs, so such a step is no subtask."""
    text = requirement or ""
    return (_LOADS.match(text) is not None and _DATA_OBJECT.search(text) is not None
            and _WORK.search(text) is None)


# A train/test split: what a small model adds to a descriptive question (the mtcars
# regression; dabench-dev q272's mean of a ratio became the mean over an 80% "training set").
_SPLIT_WORDS = re.compile(r"\b(?:train(?:ing)?|test(?:ing)?|validation|hold[- ]?out|evaluation)"
                          r"[- ]+(?:and[- ]+(?:a[- ]+)?(?:test(?:ing)?|validation)[- ]+)?"
                          r"(?:sets?|data(?:sets?)?|splits?|subsets?|samples?)\b|"
                          r"\btrain[/ -]test\b|\bcross[- ]validat", re.IGNORECASE)
# what in a task's words could want held-out rows (conservative: any of it keeps the split)
_ASKS_SPLIT = re.compile(r"\btrain|\btest(?:ing)?[- ]+(?:sets?|data|splits?)\b|validat|"
                         r"accuracy|hold[- ]?out|\bsplit", re.IGNORECASE)
_SPLIT_STEP = re.compile(r"^\W*(?:split|divide|partition|separate)\b", re.IGNORECASE)
_ON_SPLIT = re.compile(r",?\s*\b(?:from|on|of|in|using|for|over)\s+(?:the\s+)?(?:training|train|"
                       r"test|testing|validation)\s+(?:sets?|data(?:sets?)?|splits?|subsets?)\b",
                       re.IGNORECASE)


def asks_split(task: str) -> bool:
    """Whether the task's words could want held-out rows (a split, training, a test set,
    validation, accuracy): then a split the plan makes is kept."""
    return _ASKS_SPLIT.search(task or "") is not None


def splits_only(requirement: str) -> bool:
    """Whether a subtask is a train/test split ("Split the data into a training set and a
    validation set"): its first word says so and it names the sets."""
    text = requirement or ""
    return _SPLIT_STEP.match(text) is not None and _SPLIT_WORDS.search(text) is not None


def without_split(requirement: str) -> str:
    """The requirement without "from the training set" and the like (for a task that asks
    for no split, the whole data is meant)."""
    return _ON_SPLIT.sub("", requirement or "")


# A step that only hands on the answer: its first word says so, and it computes nothing.
_STATES = re.compile(r"^\W*(?:finally,?\s+|then,?\s+)?(?:(?:the\s+)?(?:final\s+)?answer|format|"
                     r"output|display|print|present|state|return|give|write|show|report|"
                     r"provide|round|combine|compile)\b", re.IGNORECASE)
# ... about the answer others computed (its form, "the result", "the calculated mean") ...
_REFERS = re.compile(r"@\w+\[|\bformat|\banswers?\b|\bresults?\b|\bcalculated\b|"
                     r"\bcomputed\b|\bfinal\b", re.IGNORECASE)
# ... and it draws nothing and does no work of its own in a second clause.
_WORKS = re.compile(
    r"\b(?:plot|chart|histogram|figure|graph|draw|visuali)|"
    r"\b(?:and|then)\s+(?:also\s+)?(?:calculat|comput|count|fit|train|split|group|filter|"
    r"estimat|predict|evaluat|creat|extract|convert|transform|encod|imput|fill|drop|remov|"
    r"select|aggregat|test|measur|determin|find|identif|detect|clean|normali|scal|analy)",
    re.IGNORECASE)


def states_only(requirement: str) -> bool:
    """Whether a subtask only states, formats or shows a result others computed ("Output the
    mean fares in the format @mean_fare_child[...]", "Display the formatted result"): where
    the task prescribes its answer's form, the closing summary writes it from what the code
    printed, so such a step is a model call that computes nothing."""
    text = requirement or ""
    return (_STATES.match(text) is not None and _REFERS.search(text) is not None
            and _WORKS.search(text) is None)


# A step that writes prose about results (findings, a summary) rather than computing them.
_WRITES = re.compile(r"^\W*(?:finally,?\s+|then,?\s+)?(?:write|draft|summari[sz]e|explain|"
                     r"discuss|interpret|conclude|compose|describe|state|list)\b", re.IGNORECASE)


def writes(requirement: str) -> bool:
    """Whether a subtask writes prose about results ("Write three findings", "Explain what
    the test means") or only states a result others computed."""
    text = requirement or ""
    return _WRITES.match(text) is not None or states_only(text)


def computes(requirement: str) -> bool:
    """Whether a subtask computes something from data (a verb or noun of work: count, fit,
    test, plot, mean ...), rather than loading it, stating a result others computed, or
    writing prose about results ("Write three findings", "Summarise the analysis")."""
    text = requirement or ""
    return _WORK.search(text) is not None and not writes(text) and not loads_only(text)


def topic_share(requirements: list[str], task: str) -> float:
    """The share of subtasks on topic (1.0 when the task has no content word to match)."""
    if not requirements or not content_words(task):
        return 1.0
    flags = on_topic(requirements, task)
    return sum(flags) / len(flags)


def check_plan(requirements: list[str], task: str, examples: Iterable[str] = ()) -> str | None:
    """None unless a subtask copies an example; else one line saying so."""
    examples = list(examples)
    copies = [r for r in requirements if copied(r, task, examples)]
    if copies:
        return (f"{len(copies)} of {len(requirements)} subtasks copy the prompt's example "
                f"instead of planning the task (e.g. {copies[0][:60]!r})")
    return None
