"""The main job and its report: every lesson's notebook executed headlessly into build/ (runner) and the
one HTML page that shows each lesson's headline, figures and the machine they ran on (html, templates/).

Imports: the lessons (their headlines) and everything below them.
"""
