"""Plan-vs-gold evaluation: the metrics (scoring) and the runner over a gold file (run).

`flowmagic.evaluate.compare`, `evaluate_file`, `load_gold`, ... keep working as when this
was one module.
"""

from .scoring import (METRICS, SHAPES, SIMILARITIES, EmbeddingSimilarity, Scores,
                      TfidfSimilarity, aevaluate_records, compare, evaluate_predictions,
                      evaluate_records, format_table, get_similarity, load_gold,
                      load_predictions, summarize, write_results)
from .run import (EvalRun, aevaluate_file, aresolve_similarity, compare_flow, evaluate_file,
                  format_scores, load_one_gold, prediction_of, resolve_similarity,
                  select_records)

__all__ = ["Scores", "compare", "get_similarity", "TfidfSimilarity", "EmbeddingSimilarity",
           "SIMILARITIES", "SHAPES", "METRICS", "load_gold", "load_predictions",
           "evaluate_records", "aevaluate_records", "evaluate_predictions", "summarize",
           "format_table", "write_results", "evaluate_file", "aevaluate_file",
           "EvalRun", "aresolve_similarity", "resolve_similarity", "select_records",
           "prediction_of", "load_one_gold", "compare_flow", "format_scores"]
