"""What a run shows: the per-run view over its bucket and jobs (`runview`; what it reads, `bucket_reader` and
`run_history`), bounded series, x axes, one summary per run, the bottleneck verdict, alerts, and several runs
compared."""
