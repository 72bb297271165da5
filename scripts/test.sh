#!/usr/bin/env bash
# The whole test suite, in two phases that keep a 2-core machine's timings honest:
#   1. every test that does not judge a timing, on two pytest-xdist workers: the SLURM tests, which mostly wait for
#      the cluster, on one; every other module on whichever is free (tests/conftest.py, run_group);
#   2. the tests that judge speedups or timings (marked ``timing`` in tests/conftest.py), one after another, with
#      nothing else running.
# Extra arguments go to both pytest runs. Exits non-zero if either phase failed.
set -uo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
rc=0
"$py" -m pytest -q -n 2 --dist loadgroup --no-loadscope-reorder -m "not timing" --durations=40 "$@" || rc=$?
"$py" -m pytest -q -m timing --durations=15 "$@" || { s=$?; ((rc)) || rc=$s; }
exit "$rc"
