#!/usr/bin/env bash
# A rank killed mid-run ends in a restart with the ranks that remain, not a hang (issue 15):
#   1. reference: elastic_tool on 3 MPI ranks, uninterrupted, 24 steps;
#   2. the same on 3 ranks; after a few steps rank 1 is killed with SIGKILL; mpirun must end the
#      job (not hang: 60 s at most);
#   3. restarted on 2 ranks: it resumes from the newest good checkpoint (saved at 3 ranks: the
#      load reshards) and finishes;
#   4. the loss curve continues: every step's loss in the killed-and-restarted log (the last
#      entry of a step logged twice) equals the reference within 1e-5 relative, and the run
#      shows both world sizes.
#   elastic.sh MPIEXEC TOOL
set -uo pipefail
mpiexec=$1 tool=$2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
work=$(mktemp -d "${TMPDIR:-/tmp}/trident_elastic.XXXXXX")
trap 'rm -rf "$work"' EXIT
steps=24
fail() { echo "FAIL: $*"; exit 1; }

timeout 120 "$mpiexec" -n 3 --oversubscribe "$tool" "$work/ref" $steps "$work/ref.log" || fail "the reference run failed"

timeout 120 "$mpiexec" -n 3 --oversubscribe "$tool" "$work/run" $steps "$work/run.log" &
job=$!
for _ in $(seq 600); do
  [[ -f $work/run.log && $(wc -l < "$work/run.log") -ge 6 ]] && break
  sleep 0.05
done
[[ -f $work/run/pid.1 ]] || fail "rank 1 wrote no pid"
sleep 0.$((RANDOM % 10))  # somewhere in a step or a save
kill -9 "$(cat "$work/run/pid.1")"
start=$SECONDS
wait $job
status=$?
echo "== the killed job ended with status $status after $((SECONDS - start)) s"
[[ $status -ne 0 ]] || fail "the job with a killed rank exited 0"
((SECONDS - start < 60)) || fail "the job took $((SECONDS - start)) s to end"
killed_at=$(wc -l < "$work/run.log")

timeout 120 "$mpiexec" -n 2 --oversubscribe "$tool" "$work/run" $steps "$work/run.log" || fail "the restart on 2 ranks failed"
echo "== killed after $killed_at logged steps; restarted on 2 ranks"
python3 - "$work/ref.log" "$work/run.log" $steps <<'PY' || exit 1
import sys
ref = {int(s): float.fromhex(l) for s, l, _ in (line.split() for line in open(sys.argv[1]))}
run, worlds = {}, set()
for s, l, w in (line.split() for line in open(sys.argv[2])):
    run[int(s)] = float.fromhex(l)  # a step logged twice: the restart's entry wins
    worlds.add(int(w))
steps = int(sys.argv[3])
assert sorted(run) == list(range(steps)), f"steps logged: {sorted(run)}"
assert worlds == {2, 3}, f"world sizes seen: {worlds}"
worst = max(abs(run[s] - ref[s]) / max(abs(ref[s]), 1e-30) for s in range(steps))
print(f"loss curve: {steps} steps, largest relative difference from the uninterrupted run {worst:.2e}")
print("  step  reference      killed+restarted")
for s in range(steps):
    print(f"  {s:4d}  {ref[s]: .8f}  {run[s]: .8f}")
assert worst <= 1e-5, "the restarted run does not continue the curve"
PY
echo "elastic restart: ok"
