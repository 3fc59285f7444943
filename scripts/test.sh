#!/usr/bin/env bash
# The suite as CI runs it (README: "Run the tests"), in one process (WORKERS=N: on N pytest-xdist workers):
#   1. lint and the unit tier, stopping at the first failure (a few minutes at most, before anything long starts);
#   2. the integration and browser tiers, the longest work first, tests that share a set-up on one worker and the
#      tests that start vLLM servers or a Ray cluster one at a time on one worker (tests/conftest.py: "scheduling"),
#      the 25 slowest tests listed at the end.
# Tier 1 (the default, every change): all but the tests marked `full`, except those marked `spine`: lint, unit, the
# integration tests with stand-ins and the fake Hub, and one real end-to-end scenario per seam. Measured on the quiet
# 2-core machine, one worker, a fresh clone: 929 s (lint and unit 206 s; 361 integration and browser tests 710 s;
# docs/measurements.md, "Test tiers"). Under 20 minutes is the rule: a new slow real-part test is marked `full`.
# Tier 2 (`--full`): every test, as before the tiers (about 60 minutes on one worker); a closing note for work that
# touches a seam carries its result.
# Other arguments go to both pytest runs (e.g. -k, --timeout). A stage that selects no test (exit status 5) is no
# failure; both selecting none is. One worker is the default: the suite is CPU-bound on the 2-core machine (README).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WORKERS=${WORKERS:-1}
tier1=" and (not full or spine)"
args=()
for arg in "$@"; do
  if [[ "$arg" == --full ]]; then tier1=""; else args+=("$arg"); fi
done
parallel=()
if [[ "$WORKERS" != 1 ]]; then
  parallel=(-n "$WORKERS" --dist loadgroup --no-loadscope-reorder)
fi
ran=0
stage() {   # pytest "$@"; 0 when it ran tests and they passed, or selected none (5)
  local status=0
  "$PY" -m pytest "$@" || status=$?
  if [[ $status == 5 ]]; then
    echo "(no test selected in this stage)"
    return 0
  fi
  ran=$((ran + 1))
  return "$status"
}
stage -q -x --timeout 900 "${parallel[@]}" -m "unit$tier1" "${args[@]}" tests
stage -v --timeout 900 --durations 25 "${parallel[@]}" -m "not unit$tier1" "${args[@]}" tests
if [[ $ran == 0 ]]; then
  echo "no test selected at all: check the arguments (${args[*]})" >&2
  exit 5
fi
