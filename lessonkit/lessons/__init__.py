"""The lessons: one module per notebook with the experiments and figures it calls.

This is the only part of lessonkit that draws (matplotlib) or shows controls (ipywidgets); the
techniques below it return data. Besides the lessons: `results` (the figures each notebook records),
`runner` (the main job: every notebook executed into build/), `panel` (the frame of every notebook's
interactive panel: controls over a function that returns a table) and `figures` (whole-number ticks
on counting axes, legends beside the data).
"""
