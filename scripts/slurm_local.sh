#!/usr/bin/env bash
# Throwaway one-node Slurm cluster on this machine (munge + slurmctld + slurmd), to try srun launches.
#   scripts/slurm_local.sh [start]  install if missing, configure, start, wait until the node is idle;
#                                   prints the srun prefix on stdout (progress goes to stderr), e.g.
#                                   $(scripts/slurm_local.sh) -n 4 ./prog   runs `srun --mpi=pmix -n 4 ./prog`
#   scripts/slurm_local.sh stop     stop the three daemons
# Root only; needs no systemd and no cgroups (proctrack/linuxproc, task/none). State lives in $SLURM_LOCAL_DIR.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SLURM_LOCAL_DIR=${SLURM_LOCAL_DIR:-/tmp/slurm-local}
# Slurm's clients read this path by default, so srun/sinfo work without SLURM_CONF.
conf=/etc/slurm/slurm.conf
marker="# written by trident scripts/slurm_local.sh"
node=$(hostname -s)
# More CPUs than the machine has (slurmd accepts it with config_overrides), so e.g. srun -n 4 fits on 2 cores.
cpus=${SLURM_LOCAL_CPUS:-$(($(nproc) > 8 ? $(nproc) : 8))}
munge_pid=/run/munge/munged.pid

running() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop() {
  local f pid pids=()
  # Signal all three first, then wait: each takes about 2 s to exit.
  for f in "$SLURM_LOCAL_DIR/slurmd.pid" "$SLURM_LOCAL_DIR/slurmctld.pid" "$munge_pid"; do
    running "$f" || continue
    pid=$(cat "$f")
    echo "== stopping $(ps -o comm= -p "$pid") ($pid)" >&2
    kill "$pid" && pids+=("$pid")
  done
  for pid in "${pids[@]}"; do
    for _ in {1..50}; do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  done
}

start() {
  [[ $(id -u) -eq 0 ]] || { echo "slurm_local.sh starts daemons as root; run it as root" >&2; exit 1; }
  # libpmix2 is dlopen'ed by Slurm's mpi/pmix plugin, which is how Debian's OpenMPI wires up under srun.
  # shellcheck disable=SC2034  # read by trident_install_packages (common.sh)
  trident_packages=(slurmctld slurmd slurm-client munge libpmix2)
  trident_install_packages >&2

  # Never overwrite a real cluster's configuration.
  if [[ -e $conf ]] && ! grep -qF "$marker" "$conf"; then
    echo "$conf exists and was not written by this script; not touching it" >&2
    exit 1
  fi
  mkdir -p "$SLURM_LOCAL_DIR"/{ctld,spool}
  cat >"$conf" <<EOF
$marker
ClusterName=local
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$SLURM_LOCAL_DIR/ctld
SlurmdSpoolDir=$SLURM_LOCAL_DIR/spool
SlurmctldPidFile=$SLURM_LOCAL_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_LOCAL_DIR/slurmd.pid
SlurmctldLogFile=$SLURM_LOCAL_DIR/slurmctld.log
SlurmdLogFile=$SLURM_LOCAL_DIR/slurmd.log
MailProg=/bin/true
# No cgroups, no systemd: track processes through /proc, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=pmix
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF

  if ! running "$munge_pid"; then
    echo "== starting munged" >&2
    [[ -s /etc/munge/munge.key ]] || mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key && chmod 600 /etc/munge/munge.key
    mkdir -p /run/munge /var/lib/munge /var/log/munge && chown munge:munge /run/munge /var/lib/munge /var/log/munge
    su -s /bin/sh munge -c /usr/sbin/munged
  fi
  if ! running "$SLURM_LOCAL_DIR/slurmctld.pid"; then
    echo "== starting slurmctld (log: $SLURM_LOCAL_DIR/slurmctld.log)" >&2
    (cd "$SLURM_LOCAL_DIR" && slurmctld -c)   # -c: a throwaway cluster forgets old jobs
  fi
  if ! running "$SLURM_LOCAL_DIR/slurmd.pid"; then
    echo "== starting slurmd (log: $SLURM_LOCAL_DIR/slurmd.log)" >&2
    (cd "$SLURM_LOCAL_DIR" && slurmd)
  fi

  # sinfo retries for ~9 s when no controller answers, so each look is capped at 2 s.
  local state='' deadline=$((SECONDS + 30))
  while ((SECONDS < deadline)); do
    state=$(timeout 2 sinfo -h -n "$node" -o %T 2>/dev/null || true)
    [[ $state == idle* || $state == mixed* || $state == alloc* ]] && break
    sleep 0.5
  done
  if [[ $state != idle* && $state != mixed* && $state != alloc* ]]; then
    echo "node $node did not become idle within 30 s (state: '${state:-no answer}'); last log lines:" >&2
    tail -n 5 "$SLURM_LOCAL_DIR"/slurmctld.log "$SLURM_LOCAL_DIR"/slurmd.log >&2 || true
    exit 1
  fi
  echo "== node $node is $state with $cpus CPUs; run e.g.: srun --mpi=pmix -n 4 ./prog" >&2
  echo "srun --mpi=pmix"
}

case ${1:-start} in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 [start|stop]" >&2; exit 2 ;;
esac
