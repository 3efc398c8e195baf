#!/usr/bin/env bash
# Counts the tests that skipped in a test run's output (a file, or standard
# input) and prints the count by reason:
#
#   3 tests skipped (cargo test counts them as passed):
#     2 tests skipped: no GPU
#     1 test skipped: needs 2 GPUs, found 0
#
# A skipping test writes one line `test NAME skipped: REASON` to stderr
# (crates/tensorcomm/tests/skip/mod.rs and test_skipped in
# crates/tensorcomm/src/lib.rs). The line may follow other text on its line
# (a child process's unfinished output). A test is known by its name and
# the test binary cargo said it was running (its `Running ...` line, on
# the same stream), so a test that says it skipped twice counts once, and
# two tests of one name in two files count twice. Colour codes are
# ignored. Prints nothing when no test binary ran. Always exits 0.
set -uo pipefail
input="${1:--}"
awk '
  { gsub(/\033\[[0-9;]*m/, "") }
  /^ *Running / { binary = $0; ran++ }
  match($0, /test [^ ]+ skipped: /) {
    line = substr($0, RSTART)
    split(line, word, " ")
    if (seen[binary, word[2]]++) next
    reason = substr(line, index(line, " skipped: ") + 10)
    if (!(reason in count)) order[++reasons] = reason
    count[reason]++
    total++
  }
  END {
    # No test binary ran (cargo failed to build them): nothing to say.
    if (ran == 0) exit
    if (total == 0) { print "no test skipped"; exit }
    printf "%d test%s skipped (cargo test counts %s as passed):\n", total, (total == 1 ? "" : "s"), (total == 1 ? "it" : "them")
    for (i = 1; i <= reasons; i++) {
      n = count[order[i]]
      printf "  %d test%s skipped: %s\n", n, (n == 1 ? "" : "s"), order[i]
    }
  }
' "$input" || true
