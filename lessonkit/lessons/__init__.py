"""The lessons: one module per notebook with the experiments and figures it calls.

This is the only part of lessonkit that draws (matplotlib) or shows controls (ipywidgets); the
techniques below it return data. Besides the lessons: `results` (the figures each notebook records)
and `runner` (the main job: every notebook executed into build/).
"""
