"""Entry point of the embedded model server process (see local.py).

It runs llama-cpp-python's OpenAI-compatible server in this process, and exits as soon
as the process that started it is gone (a killed kernel, a crashed script), so no
orphaned server is left holding a port and a core.

That server sends no usage in a stream, and never says how much of a prompt it reused
(its KV cache's prefix, or a state from its prompt cache). Here a streamed chat completion
ends with a usage chunk as OpenAI's does (`choices: []`), its prompt tokens split into those
the model evaluated and those it reused (`prompt_tokens_details.cached_tokens`), counted
from the tokens the model was asked to evaluate (`Llama.eval`) before its first sampled
token: measured, not inferred from the cache's logic. If llama-cpp-python changes so
that this cannot be hooked, the server runs without it (and calls are counted by size).
"""

import os
import runpy
import sys
import threading
import time


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _report_usage() -> None:
    """Patch llama_cpp.Llama so a chat completion reports its usage with the reused prefix
    (see the module docstring). The server serves one request at a time (its lock), so the
    counts of the last generation are that request's."""
    try:
        from llama_cpp import Llama
        eval_, generate, chat = Llama.eval, Llama.generate, Llama.create_chat_completion
    except (ImportError, AttributeError):
        return
    last: dict = {}

    def counting_eval(self, tokens):
        last["evaluated"] = last.get("evaluated", 0) + len(tokens)
        return eval_(self, tokens)

    def counting_generate(self, tokens, *args, **kwargs):
        prompt = len(tokens)
        last.update(prompt=prompt, evaluated=0, completion=0, cached=None)
        for token in generate(self, tokens, *args, **kwargs):
            if last["cached"] is None:   # the prompt is in: what was not evaluated was reused
                last["cached"] = max(0, prompt - last["evaluated"])
            last["completion"] += 1
            yield token

    def usage() -> dict:
        prompt, completion = last.get("prompt", 0), last.get("completion", 0)
        cached = last.get("cached") or 0
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}

    def streamed(chunks):
        head = None
        for chunk in chunks:
            head = head or chunk
            yield chunk
        if head is not None:
            yield {"id": head.get("id"), "object": "chat.completion.chunk",
                   "created": head.get("created"), "model": head.get("model"),
                   "choices": [], "usage": usage()}

    def reporting_chat(self, *args, **kwargs):
        last.clear()
        result = chat(self, *args, **kwargs)
        # a whole answer keeps its usage (the server's response model would drop a detail)
        return result if isinstance(result, dict) else streamed(result)

    Llama.eval, Llama.generate = counting_eval, counting_generate
    Llama.create_chat_completion = reporting_chat


def main() -> None:
    parent = int(os.environ.get("FLOWMAGIC_PARENT_PID", os.getppid()))
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    _report_usage()
    sys.argv = ["llama_cpp.server", *sys.argv[1:]]
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
