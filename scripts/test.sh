#!/usr/bin/env bash
# The whole suite as CI runs it (README: "Run the tests"), in one process (WORKERS=N: on N pytest-xdist workers):
#   1. lint and the unit tier, stopping at the first failure (a few minutes at most, before anything long starts);
#   2. the integration and browser tiers, the longest work first, tests that share a set-up on one worker and the
#      tests that start vLLM servers or a Ray cluster one at a time on one worker (tests/conftest.py: "scheduling"),
#      the 25 slowest tests listed at the end.
# Extra arguments go to both pytest runs (e.g. -k, --timeout). One worker is the default: the suite is CPU-bound on
# the 2-core machine (2 workers kept both cores 88% busy and took 35 to 43 min, against 44 to 60 min on one, but tests
# beside the vLLM group slowed down several-fold and races showed; README: "Run the tests").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WORKERS=${WORKERS:-1}
parallel=()
if [[ "$WORKERS" != 1 ]]; then
  parallel=(-n "$WORKERS" --dist loadgroup --no-loadscope-reorder)
fi
"$PY" -m pytest -q -x --timeout 900 "${parallel[@]}" -m unit "$@" tests
"$PY" -m pytest -v --timeout 900 --durations 25 "${parallel[@]}" -m "not unit" "$@" tests
