"""Workloads: the streams of requests and texts the lessons serve, and nothing that trains or measures.

  corpus        the workbook's text corpus (prose, code, records) and its tokenizer
  monitoring    the monitoring-alert stream (semantic cache, stack)
  triage        triage requests built on that stream (the capstone's workload)
  reviews       review texts
  grounded      grounded prompts (answers copied from their context)

Imports: lessonkit.engine and lessonkit.models.
"""
