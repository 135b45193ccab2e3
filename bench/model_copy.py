"""The embedded server's Q8_0 copy of SmolLM2 against the shipped Q4_1 file, on their own
(issue 31: each saving measured alone): the prompts and answers of a csv_eda run, read from
its store, evaluated in this process by both files with the server's settings (n_ctx 8192,
batches of 128, the server's thread count), one call at a time, the files taking turns.

Per file: prompt tokens a second (each prompt evaluated from an empty context, so every
token counts), milliseconds a token to decode the recorded answer (fed back one token at a
time, as the server decodes), and for the copy the share of the answer's positions where its
most likely next token is the shipped file's (same prompt, same answer so far).

    .venv/bin/python bench/model_copy.py HOME   # HOME: the FLOWMAGIC_HOME of a csv_eda run
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from pathlib import Path

__all__ = ["calls", "measure", "line"]


def calls(home: str | Path) -> list[dict]:
    """The model calls a run's store holds that reached the server: messages and answer."""
    db = sqlite3.connect(Path(home) / "flowmagic.db")
    try:
        rows = db.execute("SELECT messages, response FROM calls WHERE cached = 0 AND error IS "
                          "NULL AND response IS NOT NULL ORDER BY id").fetchall()
    finally:
        db.close()
    return [{"messages": json.loads(m), "answer": json.loads(r).get("text") or ""}
            for m, r in rows]


class _Model:
    def __init__(self, path: str, threads: int):
        import numpy as np
        from llama_cpp import Llama, llama_get_logits
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self.np, self._logits = np, llama_get_logits
        self.llm = Llama(path, n_ctx=8192, n_batch=128, n_ubatch=128, n_threads=threads,
                         n_threads_batch=threads, logits_all=False, verbose=False)
        text = lambda token: self.llm.detokenize([token], special=True).decode(errors="replace")
        self.format = Jinja2ChatFormatter(self.llm.metadata["tokenizer.chat_template"],
                                          eos_token=text(self.llm.token_eos()),
                                          bos_token=text(self.llm.token_bos()))
        self.n_vocab = self.llm.n_vocab()

    def tokens(self, messages: list[dict], answer: str) -> tuple[list[int], list[int]]:
        prompt = self.format(messages=messages).prompt
        return (self.llm.tokenize(prompt.encode(), add_bos=False, special=True),
                self.llm.tokenize(answer.encode(), add_bos=False, special=False))

    def run(self, prompt: list[int], answer: list[int]) -> tuple[float, float, list[int]]:
        """Seconds to evaluate `prompt`, seconds to decode `answer` token by token, and the
        most likely next token at each of its positions."""
        self.llm.reset()
        started = time.perf_counter()
        self.llm.eval(prompt)
        evaluated = time.perf_counter() - started
        best, decoding = [self._best()], 0.0
        for token in answer[:-1]:
            started = time.perf_counter()
            self.llm.eval([token])
            decoding += time.perf_counter() - started
            best.append(self._best())
        return evaluated, decoding, best

    def _best(self) -> int:
        logits = self.np.ctypeslib.as_array(self._logits(self.llm.ctx), shape=(self.n_vocab,))
        return int(logits.argmax())


def _compare(models: dict, work: list, sums: dict, log) -> tuple[int, int]:
    """Both files on each call, taking turns; (positions where they agree, positions)."""
    same = positions = 0
    for i, call in enumerate(work):
        prompt, answer = models["q4_1"].tokens(call["messages"], call["answer"])
        best = {}
        for name in (("q4_1", "q8_0") if i % 2 == 0 else ("q8_0", "q4_1")):
            evaluated, decoded, best[name] = models[name].run(prompt, answer)
            s = sums[name]
            s["prompt_tokens"] += len(prompt)
            s["prompt_s"] += evaluated
            s["answer_tokens"] += max(0, len(answer) - 1)
            s["decode_s"] += decoded
        same += sum(a == b for a, b in zip(best["q4_1"], best["q8_0"]))
        positions += len(best["q4_1"])
        log(f"    call {i + 1}/{len(work)}: {len(prompt)} prompt, {len(answer)} answer tokens")
    return same, positions


def measure(home: str | Path, log=print) -> dict:
    """Both files on the calls of the csv_eda run in `home` (see the module docstring)."""
    work = calls(home)   # first: a run without a store fails before a model loads
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from flowmagic.llm import _server, local

    shipped = str(local.model_path())
    copy = _server.served_copy(shipped, local._copy_path(Path(shipped)))
    if copy == shipped:
        raise RuntimeError("no Q8_0 copy could be made (see the line above)")
    threads = local._threads()[0]
    models = {"q4_1": _Model(shipped, threads), "q8_0": _Model(copy, threads)}
    sums = {k: {"prompt_tokens": 0, "prompt_s": 0.0, "answer_tokens": 0, "decode_s": 0.0}
            for k in models}
    try:
        same, positions = _compare(models, work, sums, log)
    finally:
        for model in models.values():
            model.llm.close()
    out = {"calls": len(work), "threads": threads, "agreement": round(same / positions, 3)
           if positions else None, "positions": positions}
    for name, s in sums.items():
        out[name] = {"prompt_tok_s": round(s["prompt_tokens"] / s["prompt_s"], 1),
                     "decode_ms": round(1000 * s["decode_s"] / max(1, s["answer_tokens"]), 2),
                     **s}
    return out


def line(m: dict) -> str:
    """One line of RESULTS.md."""
    a, b = m["q4_1"], m["q8_0"]
    return (f"The server's Q8_0 copy of SmolLM2 against the shipped Q4_1 file, alone (in "
            f"process, {m['threads']} threads, the {m['calls']} calls of this run's csv_eda "
            f"\"after\", {a['prompt_tokens']:,} prompt tokens each evaluated from an empty "
            f"context, {a['answer_tokens']:,} answer tokens decoded): prompts at "
            f"{b['prompt_tok_s']:g} against {a['prompt_tok_s']:g} tokens/s "
            f"({b['prompt_tok_s'] / a['prompt_tok_s']:.2f}x), decoding at {b['decode_ms']:g} "
            f"against {a['decode_ms']:g} ms/token ({a['decode_ms'] / b['decode_ms']:.2f}x); "
            f"the copy's most likely next token is the shipped file's at "
            f"{100 * m['agreement']:.1f}% of {m['positions']:,} answer positions.")


if __name__ == "__main__":
    print(line(measure(sys.argv[1])))
