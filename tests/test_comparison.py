"""Flow's three tasks by their per-criterion scores, beside one call and a sequential run, on
a loopback model whose scripted files pass some criteria and fail others: the table must
give exactly the numbers those files earn."""

import json
import re
import shutil

import pytest

import flowmagic
from flowmagic import cli
from flowmagic.testing.loopback import LoopbackServer

pytestmark = pytest.mark.timeout(300)

GOBANG = '''
import tkinter as tk
from tkinter import messagebox


def new_board(size):
    return [[0] * size for _ in range(size)]


def place(board, row, col, player):
    board[row][col] = player
    return board


def _five(board, r, c):
    p, n = board[r][c], len(board)
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        if all(0 <= r + i * dr < n and 0 <= c + i * dc < n and board[r + i * dr][c + i * dc] == p
               for i in range(5)):
            return p
    return None


def winner(board):
    for r in range(len(board)):
        for c in range(len(board)):
            if board[r][c] and _five(board, r, c):
                return board[r][c]
    return None


def ai_move(board, player):
    empty = [(r, c) for r in range(len(board)) for c in range(len(board)) if board[r][c] == 0]
    if SMART:
        for who in (player, 3 - player):
            for r, c in empty:
                board[r][c] = who
                won = winner(board) == who
                board[r][c] = 0
                if won:
                    return r, c
    return empty[0]


def main():
    root = tk.Tk()
    if SMART:
        black = messagebox.askyesno("Colour", "Do you play black? (No: white)")
    canvas = tk.Canvas(root, width=600, height=600)
    canvas.pack()
    board = new_board(15)

    def click(event):
        place(board, event.y // 40, event.x // 40, 1)

    canvas.bind("<Button-1>", click)
    root.mainloop()


if __name__ == "__main__":
    main()
'''

FACTS = ("<h1>ICLR 2025</h1><p>April 27 to May 1, 2025, San Francisco, California</p>")
SITE_ONE = (f"<html><body>{FACTS}<p>Organised by the International Association for Learning "
            "Representations</p><h2>Schedule</h2><p>09:00 Opening</p><p>10:30 Keynote</p>"
            "</body></html>")
SITE_FLOW = (f"<html><body><nav><a href='#schedule'>Schedule</a><a href='#venue'>Venue</a></nav>"
             f"{FACTS}<section id='schedule'><p>09:00 Opening</p><p>10:30 Keynote</p></section>"
             "<section id='venue'><h2>Venue</h2><iframe src='https://www.openstreetmap.org/"
             "export/embed.html'></iframe></section></body></html>")


def slides(frames):
    body = "\n".join(f"\\begin{{frame}}{{Q-learning {i}}}$Q(s,a)$\\end{{frame}}" for i in range(frames))
    return f"\\documentclass{{beamer}}\n\\begin{{document}}\n{body}\n\\end{{document}}"


def fence(lang, name, text):
    return f"Here it is.\n\n```{lang} {name}\n{text}\n```\n"


# template -> (the plan's steps, one-call answer, the last step's answer)
SCRIPTS = {
    "gobang": (["rules", "game"], fence("python", "gobang.py", "SMART = False\n" + GOBANG),
               fence("python", "gobang.py", "SMART = True\n" + GOBANG)),
    "website": (["content", "site"], fence("html", "index.html", SITE_ONE),
                fence("html", "index.html", SITE_FLOW)),
    "beamer": (["outline", "slides"], fence("latex", "slides.tex", slides(3)),
               fence("latex", "slides.tex", slides(29))),
}


def responder_for(template):
    steps, one_call, last = SCRIPTS[template]

    def answer(body):
        system = body["messages"][0]["content"]
        user = body["messages"][-1]["content"]
        if system.startswith("You are a strict reviewer"):   # the judge: long decks pass
            frames = user.count("\\begin{frame}")
            return json.dumps({"verdict": "pass" if frames >= 25 else "fail",
                               "reason": f"{frames} frames"})
        if "Results of done subtasks" in user:                 # the updater
            return json.dumps({"rationale": "fine", "action": "no_change"})
        if body.get("response_format"):                        # the planner
            return json.dumps({"subtasks": [
                {"id": steps[0], "requirement": f"Plan the {template} task", "agent": "planner",
                 "depends_on": []},
                {"id": steps[1], "requirement": f"Write the {template} deliverable file",
                 "agent": "developer", "depends_on": [steps[0]]}]})
        if system.startswith("You are an expert. Do the whole task"):
            return one_call
        found = re.search(r"Your subtask \((\w+)\)", user)
        if found and found.group(1) == steps[1]:
            return last
        return "Notes for the next step."
    return answer


EXPECTED = {
    # criterion columns, then success: one call, sequential, flowmagic
    "gobang": ("| checked by | program | program | program | program | mean of the checkable |",
               ["| one call | 1.00 | 1.00 | 0.00 | 0.00 | 0.50 |",
                "| sequential | 1.00 | 1.00 | 1.00 | 1.00 | 1.00 |",
                "| flowmagic | 1.00 | 1.00 | 1.00 | 1.00 | 1.00 |"]),
    "website": ("| checked by | program | program | program | mean of the checkable |",
                ["| one call | 1.00 | 0.00 | 0.00 | 0.33 |",
                 "| sequential | 0.00 | 1.00 | 1.00 | 0.67 |",
                 "| flowmagic | 0.00 | 1.00 | 1.00 | 0.67 |"]),
}
NO_TEX = not any(shutil.which(e) for e in ("latexmk", "pdflatex", "tectonic"))
if NO_TEX:   # "compiles" is not checkable: n/c, and in no mean
    EXPECTED["beamer"] = ("| checked by | not checkable | program | LLM judge | mean of the checkable |",
                          ["| one call | n/c | 0.00 | 0.00 | 0.00 |",
                           "| sequential | n/c | 1.00 | 1.00 | 1.00 |",
                           "| flowmagic | n/c | 1.00 | 1.00 | 1.00 |"])


@pytest.mark.parametrize("template", sorted(EXPECTED))
def test_trials_of_a_flow_task_print_the_criteria_table_with_both_baselines(template, tmp_path, capsys):
    with LoopbackServer(responder=responder_for(template)) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        code = cli.main(["trials", "--template", template, "--set", "consolidate=false",
                         "--out", str(tmp_path / "t.json")])
        out, err = capsys.readouterr()
    assert code == 0, err
    checked, rows = EXPECTED[template]
    table = out.split("\n\n")[1]
    assert checked in table, table
    for row in rows:
        assert row in table, table
    times = out.split("\n\n")[2]
    assert times.startswith("| method | time s | calls | tokens | errors |")
    assert [line.split(" | ")[0] for line in times.splitlines()[2:]] == [
        "| one call", "| sequential", "| flowmagic"]
    saved = json.loads((tmp_path / "t.json").read_text())
    one, seq, flow = saved["rows"]
    assert one["calls"] == 1 and seq["calls"] >= 2 and flow["calls"] >= 2   # two nodes each
    assert all(r["errors"] == 0 and r["time_s"] > 0 for r in saved["rows"])
    # the flowmagic run had the updater after completion, the sequential run none
    assert flow["calls"] > seq["calls"]


def test_trials_with_neither_a_task_nor_a_task_template_or_with_both_is_one_line(capsys):
    assert cli.main(["trials", "--template", "csv_eda"]) == 1
    assert "needs a TASK or PLAN.json" in capsys.readouterr().err
    assert cli.main(["trials", "do it", "--template", "gobang"]) == 1
    assert "give no TASK" in capsys.readouterr().err


def test_the_table_as_a_dataframe_means_over_trials_and_not_checkable_in_no_mean():
    from flowmagic.evaluate.comparison import Arm, Comparison
    from flowmagic.ops.criteria import Score

    def arm(method, trial, compiles, pages, time_s):
        return Arm(method, trial, [Score("compiles", compiles, "not checkable" if compiles is None
                                         else "program"), Score("page count", pages, "program")],
                   time_s=time_s, calls=2, tokens=100)

    comp = Comparison("beamer_slides", "t", ["beamer.compiles", "beamer.page_count"], [
        arm("one call", 0, None, 0.0, 1.0), arm("one call", 1, None, 1.0, 3.0),
        arm("flowmagic", 0, None, 1.0, 5.0), arm("flowmagic", 1, None, 1.0, 7.0)])
    frame = comp.to_frame()
    assert list(frame.index) == ["one call", "flowmagic"]
    assert frame.loc["one call", "page count"] == 0.5 and frame.loc["flowmagic", "success"] == 1.0
    assert frame.loc["one call", "compiles"] is None or frame["compiles"].isna().all()
    assert frame.loc["flowmagic", "time_s"] == 6.0
    assert comp.how() == {"compiles": "not checkable", "page count": "program"}
    assert "| one call | n/c | 0.50 | 0.50 |" in comp.success_table()


def test_a_link_to_a_schedule_is_not_a_schedule(tmp_path):
    import asyncio

    from flowmagic.ops.criteria import score

    (tmp_path / "index.html").write_text(
        "<html><body><nav><a href='#schedule'>Schedule</a> <a href='venue.html'>Venue</a></nav>"
        "<p>Doors 09:00, close 18:00</p></body></html>")
    (got,) = asyncio.run(score(["website.schedule_venue"], tmp_path, {}))
    assert got.value == 0.0 and "missing: schedule, venue" in got.note
    (tmp_path / "venue.html").write_text("<html><body><h1>Venue</h1></body></html>")
    (tmp_path / "index.html").write_text(
        "<html><body><section id='schedule'><p>09:00 Opening</p><p>10:30 Talks</p></section>"
        "</body></html>")
    (got,) = asyncio.run(score(["website.schedule_venue"], tmp_path, {}))
    assert got.value == 1.0, got.note
