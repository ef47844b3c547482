#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the Slurm tests (tests/slurm/): slurmctld
# and slurmd on localhost, this machine's CPUs, no cgroups, no munge (auth/none), all
# state under one folder.
#
#   scripts/slurm_local.sh start DIR   writes DIR/slurm.conf, starts both daemons and
#                                      waits until the node is idle; prints the
#                                      SLURM_CONF line to export
#   scripts/slurm_local.sh stop DIR    stops them (and every job they ran)
#
# Needs Debian's slurm-wlm (apt-get install slurm-wlm). Run as root or as the user the
# jobs should run as: that user is SlurmUser and SlurmdUser.
set -euo pipefail

command=${1:?usage: slurm_local.sh start|stop DIR}
dir=$(realpath -m "${2:?usage: slurm_local.sh start|stop DIR}")
conf=$dir/slurm.conf

stop() {
    for daemon in slurmd slurmctld; do
        if [[ -f $dir/$daemon.pid ]]; then
            kill "$(cat "$dir/$daemon.pid")" 2>/dev/null || true
        fi
    done
    for daemon in slurmd slurmctld; do
        for _ in $(seq 50); do
            [[ -f $dir/$daemon.pid ]] && kill -0 "$(cat "$dir/$daemon.pid")" 2>/dev/null || break
            sleep 0.1
        done
        rm -f "$dir/$daemon.pid"
    done
}

case $command in
start)
    for tool in slurmctld slurmd sinfo; do
        command -v "$tool" >/dev/null || { echo "error: $tool not found: apt-get install slurm-wlm" >&2; exit 2; }
    done
    mkdir -p "$dir/ctld" "$dir/d" "$dir/log"
    stop
    node=$(hostname -s)
    cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # (nproc reads OMP_NUM_THREADS)
    memory=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512))
    user=$(id -un)
    # a port pair of our own, below the ephemeral range (the tests' launchers take
    # free ports there): another cluster on this machine keeps its 6817/6818
    base=$((7000 + $(cksum <<<"$dir" | cut -d' ' -f1) % 2000 * 2))
    cat > "$conf" <<CONF
ClusterName=dalle-dist-test
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$base
SlurmdPort=$((base + 1))
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/none
CredType=cred/none
# a requeued job waits out its revoked credential before it starts again (120 s by
# default; started sooner, slurmd refuses it: "Job credential revoked")
AuthInfo=cred_expire=10
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobRequeue=1
KillWait=5
InactiveLimit=0
MinJobAge=300
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/d
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
    export SLURM_CONF=$conf
    # (their output goes to their log files: a daemon holding this script's stdout would
    # keep a caller that reads it waiting)
    slurmctld -c -f "$conf" </dev/null >/dev/null 2>&1
    slurmd -f "$conf" </dev/null >/dev/null 2>&1
    deadline=$((SECONDS + 60))
    while ((SECONDS < deadline)); do
        if timeout 5 sinfo -h -o %t 2>/dev/null | grep -qx idle; then
            echo "export SLURM_CONF=$conf"
            exit 0
        fi
        sleep 0.2
    done
    echo "error: the Slurm node did not come up within a minute; see $dir/log" >&2
    stop
    exit 1
    ;;
stop)
    stop
    ;;
*)
    echo "usage: slurm_local.sh start|stop DIR" >&2
    exit 2
    ;;
esac
