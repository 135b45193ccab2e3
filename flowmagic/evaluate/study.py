"""CARIAD's question, answered with p-values: do plans that score better against the gold
graph give more successful tasks?

`correlation_study(rows, success)` takes the rows `flowmagic eval --out` writes (a .csv or
.json path, or the rows themselves) and each task's success (a column of the rows, or a
file or dict of `id -> success` joined by id) and gives, for every plan metric, Pearson's r
and Spearman's rho with their two-sided p-values, overall and split by the gold plan's
shape (sequential against parallel: every other shape, dag included, counts as parallel),
and an ordinary least-squares regression of success on the metrics together (a linear
probability model when success is 0/1): coefficients, standard errors, t, p and R².

scipy (the `data` extra) is imported here only, when a study runs; without it a study says so in one line.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .._internal.extras import require

__all__ = ["STUDY_METRICS", "Study", "correlation_study", "load_rows"]

STUDY_METRICS = ("node_f1", "edge_f1", "ssi", "label_similarity", "ged",
                 "path_length_similarity", "pred_complexity")
_MIN_ROWS = 3


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return float(value.strip().lower() == "true")
    if value is None or value == "":
        return None
    try:
        got = float(value)
    except (TypeError, ValueError):
        return None
    return got if math.isfinite(got) else None


def load_rows(source: Any) -> list[dict]:
    """Rows from `flowmagic eval --out` (.csv, or .json with "rows"), a .jsonl file, or a list."""
    if isinstance(source, (list, tuple)):
        return [dict(r) for r in source]
    path = Path(source)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file; give the output of flowmagic eval --out")
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".csv":
        return list(csv.DictReader(text.splitlines()))
    if path.suffix.lower() == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    data = json.loads(text)
    rows = data.get("rows") if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise ConfigError(f"{path}: no rows; give the output of flowmagic eval --out")
    return rows


def _successes(rows: list[dict], success: Any, column: str) -> list[float | None]:
    if isinstance(success, str) and not Path(success).is_file():
        return [_number(r.get(success)) for r in rows]
    table = success if isinstance(success, dict) else {
        str(r.get("id")): r.get(column) for r in load_rows(success)}
    return [_number(table.get(str(r.get("id")))) for r in rows]


def _correlate(xs: list[float], ys: list[float]) -> dict:
    stats = require("scipy.stats", "data", "flowmagic study")

    out = {"n": len(xs), "pearson_r": None, "pearson_p": None, "spearman_rho": None,
           "spearman_p": None}
    if len(xs) < _MIN_ROWS or len(set(xs)) < 2 or len(set(ys)) < 2:
        out["note"] = ("fewer than 3 tasks" if len(xs) < _MIN_ROWS else "constant: no correlation")
        return out
    r, p = stats.pearsonr(xs, ys)
    rho, sp = stats.spearmanr(xs, ys)
    out.update(pearson_r=float(r), pearson_p=float(p), spearman_rho=float(rho), spearman_p=float(sp))
    return out


def _regress(columns: dict[str, list[float]], ys: list[float]) -> dict:
    """OLS of ys on the columns with an intercept; constant columns are left out."""
    import numpy as np
    stats = require("scipy.stats", "data", "flowmagic study")

    kept = [m for m, xs in columns.items() if len(set(xs)) > 1]
    n, k = len(ys), len(kept) + 1
    if n <= k:
        return {"n": n, "note": f"{n} tasks for {k} coefficients: too few to regress"}
    X = np.column_stack([np.ones(n)] + [np.asarray(columns[m], float) for m in kept])
    y = np.asarray(ys, float)
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ beta
    dof = n - k
    sigma2 = float(resid @ resid) / dof
    cov = sigma2 * np.linalg.pinv(X.T @ X)
    se = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    total = float(((y - y.mean()) ** 2).sum())
    coefs = []
    for name, b, s in zip(["intercept", *kept], beta, se):
        t = float(b / s) if s > 0 else (math.inf if abs(b) > 1e-12 else 0.0)
        p = float(2 * stats.t.sf(abs(t), dof)) if math.isfinite(t) else 0.0
        coefs.append({"term": name, "coef": float(b), "se": float(s), "t": t, "p": p})
    return {"n": n, "r2": 1 - float(resid @ resid) / total if total > 0 else None,
            "coefficients": coefs, "left_out": [m for m in columns if m not in kept]}


@dataclass
class Study:
    correlations: dict[str, dict[str, dict]]   # group -> metric -> figures
    regression: dict
    dropped: int = 0
    metrics: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        def f(v, d=3):
            return "-" if v is None else f"{v:.{d}f}"
        lines = ["| group | metric | n | pearson r | p | spearman rho | p |", "|" + "---|" * 7]
        for group, by in self.correlations.items():
            for metric, c in by.items():
                lines.append(f"| {group} | {metric} | {c['n']} | {f(c['pearson_r'])} | "
                             f"{f(c['pearson_p'], 4)} | {f(c['spearman_rho'])} | {f(c['spearman_p'], 4)} |")
        reg = self.regression
        parts = ["\n".join(lines)]
        if reg.get("coefficients"):
            rows = ["| term | coef | se | t | p |", "|---|---|---|---|---|"]
            rows += [f"| {c['term']} | {f(c['coef'])} | {f(c['se'])} | {f(c['t'], 2)} | {f(c['p'], 4)} |"
                     for c in reg["coefficients"]]
            parts.append(f"OLS of success on the metrics (n={reg['n']}, R² {f(reg['r2'])}"
                         + (f"; left out as constant: {', '.join(reg['left_out'])}" if reg["left_out"] else "")
                         + ")\n" + "\n".join(rows))
        elif reg.get("note"):
            parts.append(f"no regression: {reg['note']}")
        if self.dropped:
            parts.append(f"{self.dropped} task(s) without a success or a score were left out")
        return "\n\n".join(parts)

    text = markdown

    def __repr__(self) -> str:
        return self.markdown()

    def to_dict(self) -> dict:
        return {"metrics": self.metrics, "correlations": self.correlations,
                "regression": self.regression, "dropped": self.dropped}


def correlation_study(rows: Any, success: Any = "success", *, column: str = "success",
                      metrics: Any = STUDY_METRICS) -> Study:
    """See the module docstring. `success`: a column of the rows, or a file (.csv, .json,
    .jsonl with `id` and `column`) or a dict `id -> success`."""
    rows = load_rows(rows)
    metrics = list(metrics)
    values = _successes(rows, success, column)
    usable = [(r, s) for r, s in zip(rows, values)
              if s is not None and all(_number(r.get(m)) is not None for m in metrics)]
    if not usable:
        raise ConfigError("no task has both a success and every metric; check the success "
                          f"column or file (looked for {success!r})")
    groups = {"all": usable,
              "sequential": [(r, s) for r, s in usable if r.get("shape") == "sequential"],
              "parallel": [(r, s) for r, s in usable if r.get("shape") not in (None, "", "sequential")]}
    correlations = {}
    for group, items in groups.items():
        if not items:
            continue
        ys = [s for _, s in items]
        correlations[group] = {m: _correlate([_number(r[m]) for r, _ in items], ys) for m in metrics}
    columns = {m: [_number(r[m]) for r, _ in usable] for m in metrics}
    regression = _regress(columns, [s for _, s in usable])
    return Study(correlations, regression, len(rows) - len(usable), metrics)
