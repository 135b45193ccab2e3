"""dabench-dev: its questions, labels, seeded samples, and the scoring rule of its README.

The data is read in place from ../shared/datasets/dabench-dev (never copied into the
project). Scoring follows the README, as InfiAgent-DABench's own closed-form scorer does it:

- an answer's pairs are the matches of `@name[value]`, the name made of word characters
  (letters, digits, underscore: `@ name[...]` or `@name [...]` is no pair) and the value
  running to the first `]`; when a name appears twice the later value counts;
- a label's sub-questions are its distinct names (a name listed twice counts once, with its
  later value, as the original scorer's dict does);
- a sub-question is right when the answer's value equals the label's as a string, or both
  read as floats within 1e-6 (`float()` allows spaces around a number: `[ 0.21 ]` is 0.21);
  a missing name is wrong, an extra name changes nothing;
- a question is right when all its sub-questions are (accuracy by question, ABQ); the share
  of right sub-questions is reported too.

One difference on purpose: the original scorer leaves a question out when the answer is
empty; here every question asked counts, an empty or failed answer as wrong.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LEVELS", "Question", "locate", "load", "sample", "pairs", "equal", "score", "prompt"]

LEVELS = ("easy", "medium", "hard")
_PAIR = re.compile(r"@(\w+)\[(.*?)\]")
_HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Question:
    id: int
    question: str
    constraints: str
    format: str
    file_name: str
    level: str
    labels: dict          # name -> value (strings, as the labels file has them)
    table: Path           # the CSV, in place


def locate() -> Path:
    """The dabench-dev folder: DABENCH_DIR, else ../shared/datasets/dabench-dev beside the
    repository (CI's layout) or beside the folder of worktrees."""
    given = os.environ.get("DABENCH_DIR")
    candidates = [Path(given)] if given else []
    root = _HERE.parent
    candidates += [root.parent / "shared" / "datasets" / "dabench-dev",
                   root.parent.parent / "shared" / "datasets" / "dabench-dev"]
    for path in candidates:
        if (path / "questions.jsonl").is_file() and (path / "labels.jsonl").is_file():
            return path
    raise SystemExit("dabench-dev was not found (looked in "
                     + ", ".join(map(str, candidates)) + "); set DABENCH_DIR to its folder")


def _jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def load(folder: Path | None = None) -> list[Question]:
    """Every question with its labels, in the file's order."""
    folder = folder or locate()
    labels = {row["id"]: dict((str(n), str(v)) for n, v in row["common_answers"])
              for row in _jsonl(folder / "labels.jsonl")}
    out = []
    for row in _jsonl(folder / "questions.jsonl"):
        out.append(Question(id=int(row["id"]), question=row["question"],
                            constraints=row.get("constraints") or "", format=row["format"],
                            file_name=row["file_name"], level=row["level"],
                            labels=labels[row["id"]], table=folder / "tables" / row["file_name"]))
    return out


def sample(questions: list[Question], per_level: int | None, seed: int) -> list[Question]:
    """`per_level` questions of each level drawn with `seed` (all when None), interleaved
    easy, medium, hard, easy, ... so a run cut short still covers every level. Each level is
    shuffled whole and cut, so a smaller sample of a seed is the start of a larger one."""
    rng = random.Random(seed)
    drawn = {}
    for level in LEVELS:
        qs = [q for q in questions if q.level == level]
        rng.shuffle(qs)
        drawn[level] = qs if per_level is None else qs[:per_level]
    out = []
    for i in range(max(map(len, drawn.values()), default=0)):
        out += [drawn[level][i] for level in LEVELS if i < len(drawn[level])]
    return out


def pairs(answer: str | None) -> dict[str, str]:
    """The `@name[value]` pairs of an answer; a later pair of the same name wins."""
    return dict(_PAIR.findall(answer or ""))


def equal(got: str | None, want: str) -> bool:
    if got is None:
        return False
    if got == want:
        return True
    try:
        return abs(float(got) - float(want)) < 1e-6
    except ValueError:
        return False


def score(answer: str | None, labels: dict) -> dict:
    """{"right": all sub-questions right, "subs": {name: right}, "got": the answer's pairs}."""
    got = pairs(answer)
    subs = {name: equal(got.get(name), want) for name, want in labels.items()}
    return {"right": bool(subs) and all(subs.values()), "subs": subs, "got": got}


def prompt(q: Question) -> str:
    """The benchmark's prompt: the question, its constraints and its format."""
    return (f"{q.question}\n\nConstraints: {q.constraints}\n\n"
            f"Answer format: {q.format}").strip()
