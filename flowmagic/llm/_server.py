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

The shipped SmolLM2 is Q4_1, a layout llama.cpp's CPU code has no fast matrix kernel for;
the server loads a Q8_0 copy of the same weights instead, made once (see `served_copy`).
"""

import ctypes
import hashlib
import os
import runpy
import sys
import threading
import time


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def threads_for(others: float, cap: int) -> int:
    """Threads for llama.cpp when the rest of the machine keeps `others` cores busy: the
    cores left (a core busy half the time or more counts as taken), at least 1, at most
    `cap`."""
    return max(1, min(cap, cap - int(others + 0.5)))


class Cores:
    """How many threads llama.cpp may use now, from what the rest of the machine keeps busy.

    On 2 idle cores csv_eda's calls took 77 s on two threads and 133 s on one; with one other
    busy process, two threads made it 306 s and unfinished (ggml's threads wait for each other
    at every operation, and one of them keeps losing its core) while one thread took 163 s.
    So every decode takes the cores the last second left idle: /proc/stat's busy time of all
    cores less this process's own (/proc/self/stat), sampled every 0.25 s. Where there is no
    /proc it stays at one thread (local.py adapts only where it can read the usable cores)."""

    PERIOD = 0.25
    WINDOW = 4   # samples: the last second

    def __init__(self, cap: int):
        self.cap = max(1, cap)
        self.threads = 1
        self._tick = os.sysconf("SC_CLK_TCK")
        self._window: list[float] = []
        try:
            self._last = self._read()
        except (OSError, ValueError, IndexError):
            self._last = None

    @staticmethod
    def _read() -> tuple[float, int, int]:
        with open("/proc/stat") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
        busy = sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)   # less idle, iowait
        with open("/proc/self/stat") as fh:
            own = fh.read().rsplit(")", 1)[1].split()
        return time.monotonic(), busy, int(own[11]) + int(own[12])   # utime, stime

    def sample(self) -> None:
        if self._last is None:
            return
        now = self._read()
        wall, busy, own = (a - b for a, b in zip(now, self._last))
        self._last = now
        if wall <= 0:
            return
        others = max(0.0, (busy - own) / self._tick / wall)   # cores the rest kept busy
        self._window = [*self._window[-(self.WINDOW - 1):], others]
        self.threads = threads_for(sum(self._window) / len(self._window), self.cap)

    def watch(self) -> None:
        while True:
            time.sleep(self.PERIOD)
            try:
                self.sample()
            except (OSError, ValueError, IndexError):
                return


def _adapt_threads(cap: int) -> None:
    """Each decode (a batch of a prompt, a token) runs on `Cores.threads` threads: llama.cpp
    reads its thread count at every decode, and the embedded server evaluates a prompt in
    batches of 128 tokens (local.py), so a long prompt follows the machine as it goes (on
    csv_eda the first node's 834 tokens, decided at once while the sandbox started, ran on
    one thread for 10.7 s)."""
    try:
        from llama_cpp._internals import LlamaContext
        decode_ = LlamaContext.decode
    except (ImportError, AttributeError):
        return
    cores = Cores(cap)
    threading.Thread(target=cores.watch, daemon=True).start()

    def adapted_decode(self, batch):
        threads = cores.threads
        if getattr(self, "_flowmagic_threads", None) != threads:
            self.set_n_threads(threads, threads)
            self._flowmagic_threads = threads
        return decode_(self, batch)

    LlamaContext.decode = adapted_decode


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


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a file, read a MB at a time (local.py checks model files with it too)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def served_copy(model: str, copy: str) -> str:
    """The file to load for `model` (checked by local.py): `copy`, a Q8_0 re-encoding of its
    weights, made here once and checked against the sha256 written beside it when it was
    made (`copy`.sha256); made again when that check fails. Q8_0 holds each Q4_1 weight to
    within 1/254 of its block's largest, and llama.cpp multiplies it with tinyBLAS, where
    Q4_1 takes the generic path: on 2 cores (AVX-512) the copy evaluated a 1,300-token
    prompt at 219-247 tokens/s against 119-166, and decoded at 21-24 ms/token against
    18-26; its most likely next token was Q4_1's at 96.5% of the positions of csv_eda's 9
    answers (an F16 copy, Q4_1 decoded exactly, 97.5%; a Q4_0 one, faster still, 77%).
    Anything that stops the copy (a folder it cannot write, a llama-cpp-python without
    the quantize call) leaves `model` served as it is, said in the log."""
    sidecar = copy + ".sha256"
    try:
        with open(sidecar) as fh:
            if fh.read().strip() == file_sha256(copy):
                print(f"flowmagic: serving {copy}, the Q8_0 copy of {model}", flush=True)
                return copy
    except OSError:
        pass
    part = f"{copy}.{os.getpid()}.part"
    try:
        import llama_cpp
        os.makedirs(os.path.dirname(copy), exist_ok=True)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
        params.allow_requantize = True
        started = time.monotonic()
        failed = llama_cpp.llama_model_quantize(model.encode(), part.encode(),
                                                ctypes.byref(params))
        if failed:
            raise RuntimeError(f"llama_model_quantize returned {failed}")
        with open(part + ".sha256", "w") as fh:
            fh.write(file_sha256(part) + "\n")
        os.replace(part, copy)   # the file first: a digest never names a file not yet there
        os.replace(part + ".sha256", sidecar)
    except Exception as exc:   # noqa: BLE001 - any failure: serve the shipped file
        for leftover in (part, part + ".sha256"):
            try:
                os.unlink(leftover)
            except OSError:
                pass
        print(f"flowmagic: serving {model} as shipped (no Q8_0 copy in {copy}: "
              f"{type(exc).__name__}: {exc})", flush=True)
        return model
    print(f"flowmagic: made {copy}, the Q8_0 copy of {model}, in "
          f"{time.monotonic() - started:.1f} s; serving it", flush=True)
    return copy


def main() -> None:
    parent = int(os.environ.get("FLOWMAGIC_PARENT_PID", os.getppid()))
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    cap = os.environ.get("FLOWMAGIC_LOCAL_ADAPT_THREADS", "")
    if cap.isdigit():
        _adapt_threads(int(cap))
    _report_usage()
    args = sys.argv[1:]
    copy = os.environ.get("FLOWMAGIC_LOCAL_COPY")
    if copy is not None and "--model" in args:
        at = args.index("--model") + 1
        if copy:
            args[at] = served_copy(args[at], copy)
        elif not os.environ.get("FLOWMAGIC_LOCAL_GGUF"):
            print(f"flowmagic: serving {args[at]} as shipped (no folder of the user's own to "
                  "keep its Q8_0 copy in)", flush=True)
    sys.argv = ["llama_cpp.server", *args]
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
