"""How far open-weight models lag the closed frontier, measured on Epoch AI's data (lesson 7, the coda).

Data: data/epoch/ (Epoch AI, CC BY 4.0; see its README). Three tables are built from it:
ECI scores, MMLU (5-shot, externally reported) and GPQA Diamond (Epoch's runs), each one row
per model with columns model, date, value, access (Epoch's accessibility or a hand label),
organization; and a training-compute table in the same shape (value = FLOP).

Method, in the field's words:
- open = any "Open weights (...)" accessibility; closed = API access, hosted access, unreleased.
  Other groupings (GROUPINGS) are the sensitivity checks.
- frontier: the running maximum of a score over release dates, per group. Its records are the
  models that set a new best.
- horizontal lag at date t: how many months before t the closed frontier first reached the
  score the open frontier has at t. Default method "linear" draws each frontier as straight
  lines between its records (a step frontier adds the time since the last open record to every
  date, so it measures release cadence as much as the gap); method "step" is the literal one.
- vertical gap at t: closed running max minus open running max, in score points.
- summary: mean lag over a window of monthly dates; 90% CI by a seeded bootstrap that
  resamples models within each group.
- compute growth: log-linear OLS of log10(FLOP) on years over each group's compute frontier
  (models in the top k of their group at release); growth = 10**slope per year; 90% CI by a
  seeded pairs bootstrap.

Simplified relative to Epoch: one export (data vintage below), three benchmarks rather than
Epoch's set, and Epoch's exact windows and estimators are not published in the data README.

Modules: `data` (loading, cleaning, grouping, dates), `lag` (frontiers and the lag between them),
`growth` (compute growth of each group's frontier), `summary` (the headline figures, the sensitivity
table, the comparison with Epoch's published numbers).

Imports: lessonkit.engine only (the file resolver, LessonkitError); the lesson's figures are lessonkit.lessons.
"""
