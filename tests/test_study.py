"""CARIAD's correlation study from `flowmagic eval` output: p-values, the sequential /
parallel split and a regression, checked against hand computations."""

import csv
import json
import math

import pytest

from flowmagic import cli
from flowmagic.errors import ConfigError
from flowmagic.evaluate.study import correlation_study


def rows(xs, ys, shape="sequential", start=0, **other):
    return [{"id": f"t{start + i}", "shape": shape, "ssi": x, "success": y, **other}
            for i, (x, y) in enumerate(zip(xs, ys))]


def test_pearson_with_its_p_value_by_hand():
    # x = 1..5, y = 2, 4, 5, 4, 5: r = 6 / sqrt(10 * 6) = 0.7746; t = r sqrt(3 / (1 - r^2))
    # = 2.1213 on 3 degrees of freedom: two-sided p = 0.1241.
    study = correlation_study(rows([1, 2, 3, 4, 5], [2, 4, 5, 4, 5]), metrics=["ssi"])
    c = study.correlations["all"]["ssi"]
    assert c["n"] == 5 and c["pearson_r"] == pytest.approx(6 / math.sqrt(60))
    assert c["pearson_p"] == pytest.approx(0.1241, abs=5e-4)
    # Spearman: Pearson of the ranks 1..5 and 1, 2.5, 4.5, 2.5, 4.5 (ties averaged) = 7 / sqrt(90)
    assert c["spearman_rho"] == pytest.approx(7 / math.sqrt(90))


def test_sequential_and_parallel_are_split_and_a_dag_counts_as_parallel():
    data = (rows([0.1, 0.5, 0.9, 0.3], [0, 1, 1, 0])
            + rows([0.2, 0.8, 0.6], [1, 0, 0], shape="parallel", start=10)
            + rows([0.4], [1], shape="dag", start=20))
    study = correlation_study(data, metrics=["ssi"])
    seq, par = study.correlations["sequential"]["ssi"], study.correlations["parallel"]["ssi"]
    assert (seq["n"], par["n"], study.correlations["all"]["ssi"]["n"]) == (4, 4, 8)
    assert seq["pearson_r"] > 0.8 and par["pearson_r"] < -0.8


def test_regression_recovers_a_known_linear_rule_and_drops_constant_metrics():
    ssi = [0.1, 0.4, 0.5, 0.9, 0.3, 0.7]
    f1 = [0.2, 0.2, 0.8, 0.6, 1.0, 0.4]
    data = [{"id": str(i), "shape": "sequential", "ssi": a, "node_f1": b, "ged": 3,
             "success": 0.5 * a + 0.25 * b + 0.1} for i, (a, b) in enumerate(zip(ssi, f1))]
    reg = correlation_study(data, metrics=["ssi", "node_f1", "ged"]).regression
    coef = {c["term"]: c["coef"] for c in reg["coefficients"]}
    assert coef == pytest.approx({"intercept": 0.1, "ssi": 0.5, "node_f1": 0.25}, abs=1e-9)
    assert reg["r2"] == pytest.approx(1.0) and reg["left_out"] == ["ged"]
    assert correlation_study(data, metrics=["ged"]).correlations["all"]["ged"]["note"] == \
        "constant: no correlation"


def test_success_from_a_file_joined_by_id_and_the_command_line(tmp_path, capsys):
    scores = tmp_path / "scores.csv"
    data = rows([0.1, 0.5, 0.9, 0.3, 0.7], [None] * 5)
    with scores.open("w", newline="") as fh:
        w = csv.DictWriter(fh, ["id", "shape", "ssi", "node_f1"])
        w.writeheader()
        w.writerows({"id": r["id"], "shape": r["shape"], "ssi": r["ssi"], "node_f1": r["ssi"] / 2}
                    for r in data)
    success = tmp_path / "success.jsonl"
    success.write_text("".join(json.dumps({"id": f"t{i}", "success": s}) + "\n"
                               for i, s in enumerate([0, 1, 1, 0])))   # t4 has none
    study = correlation_study(scores, str(success), metrics=["ssi", "node_f1"])
    assert study.dropped == 1 and study.correlations["all"]["ssi"]["n"] == 4
    assert cli.main(["study", str(scores), "--success", str(success), "--metric", "ssi"]) == 0
    out = capsys.readouterr().out
    assert "| all | ssi | 4 |" in out and "OLS of success" in out
    assert cli.main(["study", str(scores)]) == 1
    assert "no task has both a success and every metric" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="no such file"):
        correlation_study(tmp_path / "missing.csv")
