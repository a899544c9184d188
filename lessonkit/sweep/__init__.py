"""Sweeps: one lesson, bench or measured cell run over a grid of parameters, each point one task on Dask
workers (a LocalCluster by default, an existing scheduler, or Slurm through dask-jobqueue).

  grid      the grid (command line or a YAML/JSON file), checked against the point's parameters before
            anything runs, and expanded into points with stable ids
  points    POINT_KINDS: what a point can be (lesson, bench, break-even, noop) and how one runs
  store     the results folder: sweep.json, one atomically written row per point, the table (CSV)
  cluster   the Dask client: LocalCluster, --scheduler ADDRESS or --slurm
  run       run_sweep: submit the points that are not complete, show progress, write the table
  report    `lessonkit sweep report` (an HTML page) and the comparison of two sweeps

Imports: the report's runner (papermill), the benches' names, measure/ and everything below them; the
pictures come from lessons/sweep_plots (only lessons/ draws).
"""
