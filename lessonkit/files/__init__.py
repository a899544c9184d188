"""Files: the workbook's own files found, read and written without surprises, below everything else.

  resources     the one resolver of the workbook's files (a wheel's copy or a clone) and the per-user cache
  atomic        crash-safe writes (temporary file, fsync, rename, directory fsync)
  safe_files    regular files only, strict UTF-8 JSON, no symlink out of the workbook's folders, SHA-256
  portable_io   locks, positioned reads and touches on every OS
  handout       `lessonkit lessons DEST`: the notebooks, exercises and docs copied where a student works

Imports: lessonkit.errors only.
"""
