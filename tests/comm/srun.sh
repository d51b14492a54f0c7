#!/usr/bin/env bash
# comm.srun: processes started by Slurm's srun instead of mpirun, on a throwaway one-node Slurm
# (scripts/slurm_local.sh: munge, slurmctld, slurmd on this machine, root only).
#   1. the MPI communicator's whole test suite under `srun -n 4`; the tasks must form one world
#      of 4 (OpenMPI wires up through PMIx, and no OMPI_COMM_WORLD_* variable is set);
#   2. with NCCL: 3 tasks of nccl_bootstrap_worker, which read their rank from Slurm's variables
#      (launch_env) and share one NCCL unique id through a file (with a GPU: also communicate).
# Exits 77 (skipped) where a throwaway Slurm cannot or must not be started: not root, Slurm's
# packages missing (scripts/test.sh installs them as root), or a real Slurm around. Daemons this
# test started are stopped again.
#   srun.sh SLURM_LOCAL_SH TEST_COMM_MPI [NCCL_BOOTSTRAP_WORKER]
set -euo pipefail
slurm_local=$1 test_mpi=$2 worker=${3:-}
skip() { echo "comm.srun skipped: $*"; exit 77; }

[[ $(id -u) -eq 0 ]] || skip "starting a throwaway Slurm needs root"
for tool in srun sinfo slurmctld slurmd munged; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (as root: bash scripts/slurm_local.sh installs Slurm)"
done
[[ -z ${SLURM_JOB_ID:-} && -z ${SLURM_CONF:-} ]] || skip "running inside a Slurm job or with SLURM_CONF set: a real Slurm is around"
conf=/etc/slurm/slurm.conf
if [[ -e $conf ]] && ! grep -qF "written by trident scripts/slurm_local.sh" "$conf"; then
  skip "a real Slurm is configured here ($conf); not starting a throwaway one beside it"
fi
# Nothing of Slurm's from outside may reach srun (it would attach to that job).
while IFS= read -r name; do unset "$name"; done < <(compgen -e | grep '^SLURM_' || true)

started=0
if ! timeout 3 sinfo -h >/dev/null 2>&1; then started=1; fi
dir=$(mktemp -d)
cleanup() {
  rm -rf "$dir"
  if [[ $started == 1 ]]; then bash "$slurm_local" stop || true; fi
}
trap cleanup EXIT
prefix=$(bash "$slurm_local" start)  # "srun --mpi=pmix"
read -r -a srun <<<"$prefix"

echo "== ${srun[*]} -n 4 $(basename "$test_mpi")"
# The node claims more CPUs than there are cores, so OpenMPI does not know it is oversubscribed
# (mpirun --oversubscribe tells it) and its ranks busy-poll: 10 s instead of 2 s on 2 cores.
OMPI_MCA_mpi_yield_when_idle=1 TRIDENT_TEST_MPI_SIZE=4 timeout 180 "${srun[@]}" -n 4 "$test_mpi"

if [[ -n $worker ]]; then
  echo "== ${srun[*]} -n 3 $(basename "$worker") (file bootstrap, ranks from Slurm's variables)"
  timeout 120 "${srun[@]}" -n 3 "$worker" "$dir"
  if [[ -n $(nvidia-smi -L 2>/dev/null || true) ]]; then want="all_reduce 6 6"; else want="all_reduce none (no CUDA device)"; fi
  for r in 0 1 2; do
    for line in "source Slurm" "rank $r size 3 local_rank $r local_size 3" "$want"; do
      grep -qxF "$line" "$dir/rank$r.txt" || { echo "rank $r lacks the line '$line':"; cat "$dir/rank$r.txt"; exit 1; }
    done
  done
  ids=$(grep -h '^id ' "$dir"/rank{0,1,2}.txt | sort -u | wc -l)
  [[ $ids == 1 ]] || { echo "the 3 tasks hold $ids different NCCL ids"; grep -h '^id ' "$dir"/rank*.txt; exit 1; }
  echo "3 tasks read Slurm's variables, share one NCCL id, and report '$want'"
fi
