"""The answer's form: what a task says its answer must look like, and whether a text has it.

Tasks often prescribe the form of their answer ("Answer format: @mean_fare[value]", "report
the mean as ...", "answer in the format ...", a JSON shape), and a closing summary written
"briefly" drops it even when the code printed the right value. This module finds the task's
own words about the form (quoted verbatim to whoever writes the answer) and, for the forms it
can recognise, checks that a text holds them.

The rule (README "The answer in the task's form"; tests/test_summary.py is its table):

- The *words* are the task's paragraphs that open with "Answer format:" (also "Output",
  "Response", "Result", "Return" and "form"/"shape"), whole, and the task's other sentences
  that hold a cue: an `@name[...]` pair, "in the (following) format/form/shape/template",
  "format as/like/:", "formatted as", a verb of answering followed by "as ..." ("report the
  mean as a percentage"; not "as well", "such as"), or JSON as a form ("as JSON", "a JSON
  object"; not a file name like results.json).
- Recognised, and checked: `@name[...]` pairs (the text must hold `@name[value]` for every
  name the words write, with a value that is not empty and not the words' own placeholder),
  and a JSON object the words show with quoted keys (the text must hold a JSON object with
  every one of its top-level keys). Any other form is quoted to the writer, never checked.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

__all__ = ["Form", "prescribed", "without_pairs", "missing", "missing_mark", "in_form",
           "form_feedback", "FORM_MISSING", "decimals", "rounded", "values_schema",
           "values_request", "from_values", "unfilled", "slot_decimals", "with_places"]

_WORDS_CHARS = 1500   # the quoted words are a few sentences; a task pasting a whole spec is cut

_HEAD = re.compile(r"^\s*(?:answer|output|response|result|return)\s+(?:format|form|shape)\s*:",
                   re.IGNORECASE)
_CUE = re.compile(
    r"@\w+\[|"
    r"\b(?:in|into|using|with|follow(?:ing|s)?)\s+(?:the\s+|this\s+|that\s+|a\s+)?"
    r"(?:following\s+)?(?:format|form|shape|template)\b|"
    r"\bformat(?:ted)?\s*(?:as\b|like\b|:)|"
    r"\b(?:report|give|return|answer|state|present|express|output|provide)\b[^.\n]{0,80}?"
    r"(?<!such)\s+as\s+(?!well\b|soon\b|follows\b|much\b|many\b)|"
    r"(?:\bas\s+(?:a\s+|an\s+)?|\ba\s+|\bin\s+)json\b(?!\s*file)|"
    r"(?<![.\w])json\s+(?:object|shape|format|dict|dictionary)\b",
    re.IGNORECASE)
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=\S)")
_PAIR = re.compile(r"@(\w+)\[([^\]\n]*)\]")
_WORDS_PAIR = re.compile(r"@(\w+)\[([^\]\n]*)(?:\]|$)", re.MULTILINE)   # a task's may be cut open
_KEY = re.compile(r"\"([^\"\n]{1,80})\"\s*:")
_DECIMALS = re.compile(r"\b(\d+|one|two|three|four|five|six)[ -]+decimal(?:s|\s+places?|\s+points?|"
                       r"\s+digits?)?\b", re.IGNORECASE)
_WORD_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
_PLAIN_DECIMAL = re.compile(r"^\s*-?\d+\.(\d+)\s*$")


@dataclass(frozen=True)
class Form:
    """What the task says of its answer's form: its own words, and what of it is checked."""
    words: str
    pairs: tuple[tuple[str, str], ...] = ()   # (name, the placeholder the words write)
    keys: tuple[str, ...] = ()                # a JSON object's top-level keys

    @property
    def checked(self) -> bool:
        return bool(self.pairs or self.keys)


def _partition(para: str) -> tuple[list[str], list[str]]:
    """(the paragraph's words about the form, its other lines without them): the one rule
    for both what is quoted to the summary and what a subtask is not shown."""
    if _HEAD.match(para):
        return [para.strip()], []
    form, rest = [], []
    for line in para.splitlines():
        sentences = [s.strip() for s in _SENTENCE.split(line)]
        form += [s for s in sentences if _CUE.search(s)]
        rest.append(" ".join(s for s in sentences if not _CUE.search(s)))
    return form, rest


def _words(task: str) -> str:
    kept = [k for para in re.split(r"\n\s*\n", task or "") for k in _partition(para)[0]]
    text = "\n".join(dict.fromkeys(k for k in kept if k))
    return text if len(text) <= _WORDS_CHARS else text[:_WORDS_CHARS] + " [...]"


def _json_keys(words: str) -> tuple[str, ...]:
    """The top-level keys of the first JSON object the words show (parsed when it parses,
    else read from its quoted keys)."""
    start = words.find("{")
    while start != -1:
        try:
            shown, _ = json.JSONDecoder().raw_decode(words[start:])
        except ValueError:
            shown = None
        if isinstance(shown, dict) and shown:
            return tuple(str(k) for k in shown)
        end = words.find("}", start)
        keys = _KEY.findall(words[start:end]) if end != -1 else []
        if keys:
            return tuple(dict.fromkeys(keys))
        start = words.find("{", start + 1)
    return ()


def prescribed(task: str) -> Form | None:
    """The form the task prescribes for its answer, or None when its words say nothing of one."""
    words = _words(task)
    if not words:
        return None
    pairs = tuple(dict((name, value.strip()) for name, value in _WORDS_PAIR.findall(words)).items())
    return Form(words, pairs, () if pairs else _json_keys(words))


def without_pairs(task: str) -> str:
    """The task as a subtask's agent sees it: without its words about an `@name[...]` form
    (the closing summary writes that form from what the code printed). Shown the form, the
    bench model answered a code subtask with the form and invented values, no code: on the
    stored first calls of three dabench-dev flows, 2 of 2 such answers became code once the
    words were left out, and the 2 that were code stayed code. Paragraphs without a cue are
    kept byte for byte; a task whose form has no pairs is returned as it is."""
    form = prescribed(task)
    if form is None or not form.pairs:
        return task
    kept = []
    for para in re.split(r"(\n\s*\n)", task):   # (the separators are kept as parts)
        form, rest = _partition(para)
        kept.append("\n".join(x for x in rest if x) if form else para)
    text = re.sub(r"\n\s*\n(\s*\n)+", "\n\n", "".join(kept)).strip()
    return text or task


def _filled(value: str, placeholder: str) -> bool:
    value = value.strip().strip("'\"`")
    return bool(value) and value.lower() not in (placeholder.lower(), "...", "value", "x")


def _objects(text: str) -> list[tuple[dict, str]]:
    """Every JSON object written in the text, with its text."""
    out, decoder, i = [], json.JSONDecoder(), text.find("{")
    while i != -1:
        try:
            obj, end = decoder.raw_decode(text, i)
        except ValueError:
            i = text.find("{", i + 1)
            continue
        if isinstance(obj, dict):
            out.append((obj, text[i:end]))
        i = text.find("{", end)
    return out


def in_form(form: Form, text: str) -> list[tuple[str, str]]:
    """The parts of `text` that give the answer in the form, as (name, value) in the form's
    order: for pairs the text's last filled `@name[value]` of each name (a later pair wins,
    as a reader of the form takes it), for JSON ("{}", the object's text). Empty when any
    part is missing."""
    if form.pairs:
        found: dict[str, str] = {}
        placeholders = dict(form.pairs)
        for name, value in _PAIR.findall(text or ""):
            if name in placeholders and _filled(value, placeholders[name]):
                found[name] = value.strip()
        if all(name in found for name, _ in form.pairs):
            return [(name, found[name]) for name, _ in form.pairs]
        return []
    if form.keys:
        for obj, written in reversed(_objects(text or "")):
            if all(k in obj for k in form.keys):
                return [("{}", written)]
    return []


def missing(form: Form | None, text: str) -> list[str]:
    """What of a checked form the text lacks, as the form writes it ([] when nothing is
    missing or the form is not one this module checks)."""
    if form is None or not form.checked or in_form(form, text):
        return []
    if form.pairs:
        placeholders = dict(form.pairs)
        have = {name for name, value in _PAIR.findall(text or "")
                if name in placeholders and _filled(value, placeholders[name])}
        return [f"@{name}[{ph}]" for name, ph in form.pairs if name not in have]
    return ["a JSON object with the keys " + ", ".join(json.dumps(k) for k in form.keys)]


FORM_MISSING = "the answer form the task prescribes is missing"


def missing_mark(lacking: list[str]) -> str:
    """The result's mark for what `missing` found: values named, never written as
    @name[placeholder], which a reader or a scorer looking for the pairs would take for the
    answer."""
    named = [re.sub(r"^@(\w+)\[.*\]$", r"a value for \1", x, flags=re.S) for x in lacking]
    return f"[{FORM_MISSING}: {', '.join(named)}]"


def form_feedback(form: Form, lacking: list[str], only: bool = False) -> str:
    """Why a text goes back for its form, and what to write instead (`only`: the answer in
    the form alone, to be added to the text)."""
    head = (f"Your answer does not give the answer in the form the task prescribes: it lacks "
            f"{', '.join(lacking)}. The task says:\n{form.words}\n")
    if only:
        return head + ("Reply with only the answer in exactly that form, each value copied "
                       "from a printed output above.")
    return head + ("End your answer with the answer in exactly that form, each value copied "
                   "from a printed output above.")


def values_schema(form: Form) -> dict:
    """The JSON schema of the form's values: one string for each name of its pairs, every
    one required and no other (an endpoint that constrains its output to the schema cannot
    answer with other names)."""
    names = [name for name, _ in form.pairs]
    return {"type": "object", "properties": {name: {"type": "string"} for name in names},
            "required": names, "additionalProperties": False}


def values_request(form: Form, lacking: list[str]) -> str:
    """Asking for the form's values as JSON, when an answer twice missed the form's names."""
    keys = ", ".join(json.dumps(name) for name, _ in form.pairs)
    return (f"Your answer does not give the answer in the form the task prescribes: it lacks "
            f"{', '.join(lacking)}. The task says:\n{form.words}\nGive the values as one JSON "
            f"object with exactly these keys: {keys}. Copy each value from a printed output "
            "above (rounding is fine); write a word as the task writes it.")


def from_values(form: Form, data) -> str:
    """The answer in the form written from the values a JSON answer gave (`values_schema`):
    "@name[value]" for each name with a filled value, in the form's order ("" for none)."""
    if not isinstance(data, dict):
        return ""
    out = []
    for name, placeholder in form.pairs:
        value = data.get(name)
        value = "" if value is None or isinstance(value, (dict, list)) else str(value)
        value = " ".join(value.replace("[", "(").replace("]", ")").split())
        if _filled(value, placeholder):
            out.append(f"@{name}[{value}]")
    return ", ".join(out)


def unfilled(form: Form, text: str) -> list[str]:
    """The names of the form's pairs the text gives no value for (missing, a placeholder, or
    a value withheld as "?")."""
    placeholders, found = dict(form.pairs), {}
    for name, value in _PAIR.findall(text or ""):
        if name in placeholders:
            found[name] = value.strip()
    return [name for name, ph in form.pairs
            if not _filled(found.get(name, ""), ph) or found[name] == "?"]


def decimals(form: Form | None) -> int | None:
    """The decimal places the form's words ask its values to be rounded to ("rounded to two
    decimal places"), or None when they name none or more than one (which value gets which
    is not read here)."""
    return None if form is None or not form.pairs else _places(form.words)


def _places(text: str) -> int | None:
    """The one number of decimal places the text names, or None (none, or several)."""
    said = {_WORD_NUMBERS.get(n.lower()) or int(n) for n in _DECIMALS.findall(text)
            if n.lower() in _WORD_NUMBERS or n.isdigit()}
    return said.pop() if len(said) == 1 and 0 <= min(said) <= 15 else None


def slot_decimals(form: Form | None) -> dict[str, int]:
    """The decimal places each `@name[...]` value is to be rounded to: the one number the
    form's words give in all (`decimals`), else, per value, the one its placeholder itself
    says (q269: `@r[the coefficient, rounded to two decimal places]`), or a clause naming its
    placeholder (dabench-dev q668: "r_value" ... two decimal places; "p_value" ... four), or,
    in one sentence for all, the part that opens with its quoted placeholder (q685). A name
    nothing gives places to is left out."""
    if form is None or not form.pairs:
        return {}
    every = decimals(form)
    if every is not None:
        return {name: every for name, _ in form.pairs}
    rest = _WORDS_PAIR.sub(" ", form.words)
    clauses = re.split(r";|(?<=[.!?])\s+|\n", rest)
    quoted = _quoted_segments(rest, [p.strip() for _, p in form.pairs])
    out = {}
    for name, placeholder in form.pairs:
        own = _places(placeholder)   # "@r[the coefficient, rounded to two decimal places]"
        if own is not None:
            out[name] = own
            continue
        words = {w for w in (placeholder.strip(), name) if w and re.fullmatch(r"\w+", w)}
        said = {_places(c) for c in clauses
                if any(re.search(rf"(?<!\w){re.escape(w)}(?!\w)", c) for w in words)
                and _DECIMALS.search(c)} - {None}
        if len(said) != 1:   # one sentence for all: the part from its quoted placeholder on
            said = {_places(quoted.get(placeholder.strip(), ""))} - {None}
        if len(said) == 1:
            out[name] = said.pop()
    return out


def _quoted_segments(text: str, placeholders: list[str]) -> dict[str, str]:
    """{placeholder: the text from where it is written in quotes to where the next quoted
    placeholder is}: dabench-dev q685 gives each value's places in one sentence, '"r_value" is
    ..., rounded to two decimal places, "value" is ..., rounded to four decimal places'."""
    marks = sorted((m.start(), p) for p in set(placeholders) if re.fullmatch(r"\w+", p)
                   for m in re.finditer(rf'"{re.escape(p)}"', text))
    ends = [start for start, _ in marks[1:]] + [len(text)]
    out: dict[str, str] = {}
    for (start, p), end in zip(marks, ends):
        out[p] = out.get(p, "") + " " + text[start:end]
    return out


def rounded(form: Form | None, text: str) -> str:
    """`text` with each `@name[value]` of the form whose value is a plain decimal number with
    more places than the form's words ask for it (`slot_decimals`) rounded to them. The
    subtasks' code is not shown the form, so it prints what it computed, unrounded
    (dabench-dev q210: the result stated @mean_neg[0.0687] where the task asked for two
    places); a rounded value still traces to the printed one (engine/numbers: rounding to the
    places written)."""
    def fix(value: str, places: int) -> str | None:
        plain = _PLAIN_DECIMAL.match(value)
        if plain is None or len(plain.group(1)) <= places:
            return None
        return f"{float(value):.{places}f}"

    return with_places(form, text, fix)


def with_places(form: Form | None, text: str, fix) -> str:
    """`text` with each `@name[value]` whose name the form gives places to (`slot_decimals`)
    written `@name[fix(value, places)]`, or left as it is where `fix` gives None."""
    places = slot_decimals(form)
    if not places:
        return text

    def one(match: re.Match) -> str:
        name, value = match.group(1), match.group(2)
        new = fix(value, places[name]) if name in places else None
        return f"@{name}[{new}]" if new is not None else match.group(0)

    return _PAIR.sub(one, text)
