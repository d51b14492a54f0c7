#!/usr/bin/env bash
# comm.mpi_misuse: misuse that used to leave an MPI job hanging for good now ends it, quickly and
# with a message naming the call and the rank (tests/comm/mpi_misuse_worker.cpp):
#   leave-after-error  rank 1 catches an error and leaves main while rank 0 waits in an all_reduce:
#                      rank 1's mpi_environment ends the job (TRIDENT_MPI_EXIT_TIMEOUT=2)
#   mismatch           a barrier against an all_reduce with the argument check off
#                      (TRIDENT_CHECK_COLLECTIVES=0): the watchdog ends it (TRIDENT_MPI_TIMEOUT=3)
#   mismatch-checked   the same with default settings (the check is on): a usage_error on both
#                      ranks, exit 0
#   symmetric-error    both ranks catch the same error and go on: a normal exit, no abort
#   dropped-async      rank 1 drops a failed exchange_async unwaited and leaves while rank 0 waits
#                      in an all_reduce: the dropped error counts at exit, so rank 1 ends the job
#                      naming the call (TRIDENT_MPI_EXIT_TIMEOUT=2)
#   dropped-async-all-finish  the same dropped request, then both ranks meet and return: nobody
#                      hangs, but the error never raised ends the job non-zero, naming the call
#   huge-count         an all_reduce of 8 against 8M elements with default settings: the argument
#                      check turns it into a usage_error on both ranks naming all_reduce and both
#                      counts, before MPI touches a buffer; exit 0, nothing for ASan to report
#   huge-count-unchecked  the same with TRIDENT_CHECK_COLLECTIVES=0: the job ends within the
#                      watchdog's timeout (TRIDENT_MPI_TIMEOUT=3) naming all_reduce; memory may be
#                      corrupted first (Open MPI 4.1 aborts rank 0 in malloc; under ASan, ASan reports the
#                      overflow and ends the job): the documented price of turning the check off
#   throws / stall / killed  rank 1 throws out of main (std::terminate), sleeps for 10 minutes,
#                      or SIGKILLs itself, while rank 0 waits in an all_reduce: the job ends
#                      (mpirun on the abort or the signal; the watchdog, naming the all_reduce,
#                      on the stall, TRIDENT_MPI_TIMEOUT=3), never hangs
#   mpi_misuse.sh MPIEXEC WORKER
set -uo pipefail
mpiexec=$1 worker=$2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Default settings unless a mode says otherwise: whatever the caller's environment holds.
unset TRIDENT_CHECK_COLLECTIVES
failures=0
fail() { echo "FAIL ($mode): $*"; failures=$((failures + 1)); }

run() {  # run MODE [VAR=VALUE...]: sets status, output, seconds
  mode=$1; shift
  local start=$SECONDS
  output=$(env "$@" timeout 120 "$mpiexec" -n 2 --oversubscribe "$worker" "$mode" 2>&1)
  status=$?
  seconds=$((SECONDS - start))
  echo "== $mode: exit $status after ${seconds}s"
  echo "$output" | sed 's/^/   | /' | head -20
}
expect() { grep -qF -- "$1" <<<"$output" || fail "the output does not say: $1"; }

run leave-after-error TRIDENT_MPI_EXIT_TIMEOUT=2
[[ $status -ne 0 && $status -ne 124 ]] || fail "expected the job to be ended (non-zero, not the 120 s timeout), got $status"
((seconds < 60)) || fail "took ${seconds}s"
expect "rank 1 leaves after an error (send)"
expect "ended with MPI_Abort"
grep -qF "the all_reduce returned" <<<"$output" && fail "rank 0's all_reduce returned"

run mismatch TRIDENT_MPI_TIMEOUT=3 TRIDENT_CHECK_COLLECTIVES=0
[[ $status -ne 0 && $status -ne 124 ]] || fail "expected the watchdog to end the job, got $status"
((seconds < 60)) || fail "took ${seconds}s"
expect "(timeout 3000 ms): a peer is not taking part"
grep -qE "waited [0-9]+ ms in (barrier|all_reduce)" <<<"$output" || fail "the message does not name the call"

run mismatch-checked
[[ $status -eq 0 ]] || fail "expected a clean exit, got $status"
[[ $(grep -c "caught: .*ranks disagree on the collective: all_reduce to barrier" <<<"$output") -eq 2 ]] ||
  fail "expected the usage_error naming barrier and all_reduce on both ranks"

run symmetric-error
[[ $status -eq 0 ]] || fail "expected a normal exit, got $status"
[[ $(grep -c "done, x\[0\] = 2" <<<"$output") -eq 2 ]] || fail "expected both ranks to go on"
grep -qF "MPI_Abort" <<<"$output" && fail "the job was aborted"

run dropped-async TRIDENT_MPI_EXIT_TIMEOUT=2 TRIDENT_MPI_TIMEOUT=30
[[ $status -ne 0 && $status -ne 124 ]] || fail "expected the job to be ended (non-zero, not the 120 s timeout), got $status"
((seconds < 20)) || fail "took ${seconds}s"
expect "rank 1 leaves after an error (exchange (send/recv))"
expect "ended with MPI_Abort"
grep -qF "the all_reduce returned" <<<"$output" && fail "rank 0's all_reduce returned"

run dropped-async-all-finish TRIDENT_MPI_EXIT_TIMEOUT=2 TRIDENT_MPI_TIMEOUT=30
[[ $status -ne 0 && $status -ne 124 ]] || fail "expected the job to fail (non-zero, not the 120 s timeout), got $status"
((seconds < 20)) || fail "took ${seconds}s"
[[ $(grep -c "reached the end" <<<"$output") -eq 2 ]] || fail "expected both ranks to reach the end"
expect "rank 1: an asynchronous operation (exchange (send/recv)) failed and its request was destroyed without wait()"

run huge-count TRIDENT_MPI_EXIT_TIMEOUT=2 TRIDENT_MPI_TIMEOUT=3
[[ $status -eq 0 ]] || fail "expected a clean exit, got $status"
((seconds < 30)) || fail "took ${seconds}s"
[[ $(grep -c "check_arguments on" <<<"$output") -eq 2 ]] || fail "expected the check on by default on both ranks"
[[ $(grep -c "caught: .*all_reduce: ranks disagree on the element count: 8 to 8000000" <<<"$output") -eq 2 ]] ||
  fail "expected the usage_error naming all_reduce and both counts on both ranks"
grep -qE "AddressSanitizer|MPI_Abort|waited [0-9]+ ms|mismatched all_reduce returned" <<<"$output" &&
  fail "the mismatch reached MPI (a sanitizer report, an abort or the watchdog)"

run huge-count-unchecked TRIDENT_MPI_EXIT_TIMEOUT=2 TRIDENT_MPI_TIMEOUT=3 TRIDENT_CHECK_COLLECTIVES=0
[[ $status -ne 0 && $status -ne 124 ]] || fail "expected the job to end with an error, got $status"
((seconds < 30)) || fail "took ${seconds}s"
# (A rank the job's end kills may lose its output, so one line will do.)
expect "check_arguments off"
grep -qF "check_arguments on" <<<"$output" && fail "TRIDENT_CHECK_COLLECTIVES=0 left the check on"
# Under AddressSanitizer (scripts/test.sh runs this suite in an ASan build too) the write past
# rank 0's buffer is caught at once and ends the job: that is the corruption itself, reported.
grep -qE "waited [0-9]+ ms in all_reduce|caught: .*all_reduce|leaves after an error \(all_reduce\)|AddressSanitizer: heap-buffer-overflow" <<<"$output" ||
  fail "nothing names the all_reduce (nor did AddressSanitizer report the overflow)"
grep -qF "mismatched all_reduce returned" <<<"$output" && fail "a mismatched all_reduce returned"

for m in throws killed; do
  run $m TRIDENT_MPI_TIMEOUT=30
  [[ $status -ne 0 && $status -ne 124 ]] || fail "expected the job to end with an error, got $status"
  ((seconds < 25)) || fail "took ${seconds}s: it waited for the watchdog (or longer), not for rank 1's end"
  grep -qF "the all_reduce returned" <<<"$output" && fail "rank 0's all_reduce returned"
done
run stall TRIDENT_MPI_TIMEOUT=3
[[ $status -ne 0 && $status -ne 124 ]] || fail "expected the watchdog to end the job, got $status"
((seconds < 60)) || fail "took ${seconds}s"
expect "(timeout 3000 ms): a peer is not taking part"
grep -qE "rank 0 waited [0-9]+ ms in all_reduce" <<<"$output" || fail "the message does not name rank 0's all_reduce"

echo "$failures failure(s)"
exit $((failures != 0))
