"""`%%flow?`, `%%flow --help` and `%flow SUBCOMMAND --help` describe every flag; tab
completion offers the subcommands, a flow's name where one goes and a %%flow line's options;
all in a real InteractiveShell."""

import contextlib
import io

from IPython.core.completer import provisionalcompleter

import flowmagic
from flowmagic.magic_grammar import SUBCOMMANDS, flow_option_strings

from conftest import ipython_shell


def printed(ip, source):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = ip.run_cell(source)
    assert result.success, result.error_in_exec
    return out.getvalue()


def completions(ip, text):
    with provisionalcompleter():
        return {c.text for c in ip.Completer.completions(text, len(text))}


def test_flow_question_mark_and_help_describe_every_option():
    with ipython_shell() as ip:
        for source in ("%%flow?", "%%flow --help\nany task"):
            text = printed(ip, source)
            for options in flow_option_strings():
                line = next((l for l in text.splitlines() if l.strip().startswith(options[0])), "")
                assert line and len(line.split()) > 1, (source, options)
            assert "candidate plans" in text and "%flow SUBCOMMAND --help" in text
            assert all(f"%flow {name}" in text for name in SUBCOMMANDS)


def test_subcommand_help_reads_help_as_help_not_as_a_flow_name():
    with ipython_shell() as ip:
        run = printed(ip, "%flow run --help")
        assert run.startswith("usage: %flow run NAME") and "a flow of this notebook" in run
        mapped = printed(ip, "%flow map -h")
        for flag in ("--engine", "--workers", "--concurrency", "--budget-usd", "--rpm", "--at-once"):
            assert any(l.strip().startswith(flag) and len(l.split()) > 2 for l in mapped.splitlines()), flag
        slim = printed(ip, "%flow help slim")
        assert "--tau T" in slim and "--cheaper" in slim


def test_tab_completes_subcommands_flow_names_and_options():
    with ipython_shell() as ip:
        ip.user_ns["report"] = flowmagic.Flow.from_dict(
            {"nodes": [{"id": "a", "requirement": "Write it."}], "edges": []})
        ip.user_ns["other"] = 3   # not a flow: never offered
        assert {"run", "rerun"} <= completions(ip, "%flow r") and "show" not in completions(ip, "%flow r")
        names = completions(ip, "%flow show ")
        assert "report" in names and "other" not in names
        assert completions(ip, "%flow prune rep") == {"report"}
        assert {"--model", "--mode"} <= completions(ip, "%%flow x --mo")
