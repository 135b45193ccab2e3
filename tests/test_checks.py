"""The deliverable checks of the paper's tasks: HTML parses, gobang's logic passes tests in the
sandbox with its GUI import stubbed, slides compile or say in one line why not."""

import os
import shutil

import pytest

from flowmagic.ops.checks import check_gobang, check_html, check_latex

GOOD_GOBANG = '''
import pygame   # not installed here: the check stands a stub in for it

def new_board(size=15):
    return [[0] * size for _ in range(size)]

def place(board, r, c, player):
    board[r][c] = player
    return board

def winner(board):
    n = len(board)
    for r in range(n):
        for c in range(n):
            p = board[r][c]
            if not p:
                continue
            for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
                if all(0 <= r + k * dr < n and 0 <= c + k * dc < n
                       and board[r + k * dr][c + k * dc] == p for k in range(5)):
                    return p
    return None

def ai_move(board, player):
    n = len(board)
    empty = [(r, c) for r in range(n) for c in range(n) if not board[r][c]]
    for r, c in empty:
        board[r][c] = player
        won = winner(board) == player
        board[r][c] = 0
        if won:
            return r, c
    return empty[len(empty) // 2]

if __name__ == "__main__":
    pygame.init()
'''


def test_a_good_gobang_passes_headless_and_a_wrong_one_fails(tmp_path):
    (tmp_path / "gobang.py").write_text(GOOD_GOBANG)
    good = check_gobang(tmp_path / "gobang.py")
    assert good.ok, good.line
    assert good.line == "gobang.py: its game logic passed 3 tests in the sandbox"
    (tmp_path / "gobang.py").write_text(GOOD_GOBANG.replace("range(5)", "range(4)"))
    bad = check_gobang(tmp_path / "gobang.py")
    assert bad.ok is False and "AssertionError" in bad.line and "\n" not in bad.line


def test_html_must_parse_and_mention_what_was_asked(tmp_path):
    page = tmp_path / "index.html"
    page.write_text("<html><body><h1>ICLR 2025</h1><h2>Schedule</h2><iframe src='map'></iframe>"
                    "<p>Venue</p></body></html>")
    assert check_html(page, ("ICLR 2025", "schedule", "venue", "iframe")).ok
    missing = check_html(page, ("registration",))
    assert missing.ok is False and "never mentions registration" in missing.line
    page.write_text("just words")
    assert check_html(page).ok is False


@pytest.mark.skipif(any(shutil.which(e) for e in ("latexmk", "pdflatex", "tectonic")),
                    reason="a LaTeX engine is installed: the compile itself is checked")
def test_slides_without_a_latex_engine_say_the_compile_was_skipped(tmp_path):
    tex = tmp_path / "slides.tex"
    tex.write_text("\\documentclass{beamer}\\begin{document}"
                   + "\\begin{frame}x\\end{frame}" * 3 + "\\end{document}")
    check = check_latex(tex, expect_frames=30)
    assert check.ok is None
    assert check.line == ("slides.tex: 3 frames of the 30 asked for; compile skipped: no LaTeX "
                          "engine (latexmk, pdflatex, tectonic) is installed")


def test_the_latex_engine_runs_inside_the_sandbox_with_shell_escape_off(tmp_path, monkeypatch):
    """A stand-in engine (a shell script named pdflatex, first on PATH) reports what it can do
    where check_latex runs it: it must be asked for -no-shell-escape, see none of the host's
    files beside the slides, write nothing outside their folder, and have no network."""
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's file")
    outside = tmp_path / "written-outside.txt"
    bin_dir = tmp_path / "texbin"
    bin_dir.mkdir()
    engine = bin_dir / "pdflatex"
    engine.write_text(
        "#!/bin/sh\n"
        'case " $* " in *" -no-shell-escape "*) ;; *) echo "! shell escape was not off"; exit 1;; esac\n'
        f'if [ -e "{secret}" ]; then echo "! the engine sees the host file"; exit 1; fi\n'
        f'if touch "{outside}" 2>/dev/null; then echo "! the engine wrote outside"; exit 1; fi\n'
        'if [ "$shell_escape" != "f" ]; then echo "! shell_escape is not f"; exit 1; fi\n'
        'for a in "$@"; do last="$a"; done\n'
        'printf "%%PDF-1.4 stand-in\\n" > "${last%.tex}.pdf"\n')
    engine.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    slides = tmp_path / "ws" / "slides.tex"
    slides.parent.mkdir()
    slides.write_text("\\documentclass{beamer}\\begin{document}"
                      + "\\begin{frame}x\\end{frame}" * 2 + "\\end{document}")
    check = check_latex(slides, expect_frames=2)
    assert check.ok, check.line
    assert check.line == "slides.tex: compiled with pdflatex in the sandbox (2 frames of the 2 asked for)"
    assert (slides.parent / "slides.pdf").read_bytes().startswith(b"%PDF")
    assert not outside.exists()
    engine.write_text("#!/bin/sh\necho '! Undefined control sequence.'\nexit 1\n")
    failed = check_latex(slides)
    assert failed.ok is False and failed.line == "slides.tex: pdflatex failed: ! Undefined control sequence."
