"""Human rater study (docs/rater_study.md): export a rating sheet, then correlate human scores with metrics.

``medvqa-rater export RUN_DIR --n 50 --seed 0 --out DIR`` samples N open questions whose
prediction is not an exact match (exact matches are trivially "perfect" for every metric and
would inflate every correlation) from a run's scored table (`scores.parquet`, which holds the
judge's scores when the run used the judge; a `predictions.jsonl` works too) and writes:

* ``DIR/rating_sheet.csv``: ``id, question, ground_truth, prediction, score`` with ``score``
  empty, for raters who prefer a spreadsheet;
* ``DIR/rating_sheet.html``: the same items as one self-contained page (inline CSS and JS, no
  network) with a 1–5 selector per item and a button that downloads the filled sheet as CSV;
* ``DIR/items.jsonl``: one JSON object per item, ``{"id", "split", "question", "answer",
  "prediction", "scores": {metric: value}}``. Raters never see the scores; ``analyze`` reads them.

``medvqa-rater analyze DIR --ratings r1.csv r2.csv ... --out OUT`` validates the filled sheets
(every id known and rated once, scores integers 1–5), then computes Kendall tau-b and Spearman
rho between the mean human score and each metric, between each rater and each metric, and
between each pair of raters (plus the mean over pairs), and writes ``OUT/correlations.csv``,
``OUT/correlations.md``, ``OUT/heatmap.png`` (metric x {tau-b, rho} for the mean human score),
``OUT/heatmap_raters.png`` (rater x metric tau-b) and ``OUT/scatter.png`` (human vs each metric).

Items are presented in a random (seeded) order so that file order, e.g. by question type, does
not bias the raters.

One job per module: `study` (the files of a study, the sheet's layout, `RatingError`, `Study`),
`export` (sampling the items and writing them), `page` (the HTML rating page), `analysis`
(reading ratings back, correlations and agreement), `plots` (its figures). The console script
is `medvqa.cli.rater`. Nothing is re-exported here: import from the module that defines a name.
"""
