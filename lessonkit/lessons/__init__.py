"""The lessons: one module per notebook with the figures, panels and headline sentences it calls.

This is the only part of lessonkit that draws (matplotlib) or shows controls (ipywidgets); the
experiments come from lessonkit.measure and the techniques, which return data. Besides the lessons:
`results` (the figures each notebook records), `headline` (a lesson's results as sentences), `panel`
(the frame of every notebook's interactive panel: controls over a function that returns a table),
`figures` (whole-number ticks on counting axes, legends beside the data) and `offline` (the executed
notebooks' pages made to work offline). The main job and its report are lessonkit.report; the handout
(`lessonkit lessons DEST`) is lessonkit.files.handout.

Imports: lessonkit.measure and everything below it; never the report, a benchmark or the CLI.
"""
