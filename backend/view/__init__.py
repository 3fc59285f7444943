"""What a run shows: the per-run view over its bucket and jobs (`runview`), bounded series, x axes, one summary per
run, the bottleneck verdict, alerts, and several runs compared."""
