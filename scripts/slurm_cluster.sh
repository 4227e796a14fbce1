#!/bin/sh
# A small Slurm cluster on this machine: slurmctld here, one slurmd per compute node.
#
#   scripts/slurm_cluster.sh start     install (if missing), configure and start (idempotent)
#   scripts/slurm_cluster.sh stop      stop every daemon and remove the nodes (idempotent)
#   scripts/slurm_cluster.sh status    sinfo of the running cluster
#
# Installs Debian's slurm-wlm (22.05) and munge with apt-get when they are missing, makes
# a munge key if there is none and starts munged. The compute nodes are the network
# namespaces of scripts/netns_hosts.sh (hvdtn1, hvdtn2 on 10.213.7.0/24): each runs
# `slurmd -N hvdtnI` inside its namespace and a UTS namespace of its own, so jobs there
# see the node's host name and address. slurmctld runs in the root namespace and listens
# on the bridge address 10.213.7.1 (host name hvdtn0 in the nodes' /etc/hosts), which every
# namespace reaches. Each node has CPUs=1: a job of 2 tasks gets both nodes.
# If the kernel refuses network namespaces, ONE node (this machine, both cores) is made
# instead, and the script says so.
#
# The configuration is $HVDT_SLURM_DIR/slurm.conf (default /var/tmp/hvdt-slurm): Slurm's
# commands need `export SLURM_CONF=$HVDT_SLURM_DIR/slurm.conf` (printed by start).
# PMI: Debian's Slurm offers pmix (pmix_v4), pmi2 and none (`srun --mpi=list`); Debian's
# Open MPI 4.1 starts its ranks with `srun --mpi=pmix` (both use Debian's libpmix2).
# Needs root.
set -eu

DIR=${HVDT_SLURM_DIR:-/var/tmp/hvdt-slurm}
HERE=$(cd "$(dirname "$0")" && pwd)
HOSTS="$HERE/netns_hosts.sh"
SUBNET=10.213.7   # netns_hosts.sh's default subnet and namespace names
PREFIX=hvdtn
NODES="${PREFIX}1 ${PREFIX}2"
export SLURM_CONF="$DIR/slurm.conf"

die() { echo "slurm_cluster.sh: $*" >&2; exit 2; }

install_packages() {
    missing=''
    command -v slurmctld >/dev/null 2>&1 || missing="$missing slurmctld"
    command -v slurmd >/dev/null 2>&1 || missing="$missing slurmd"
    command -v sbatch >/dev/null 2>&1 || missing="$missing slurm-client"
    command -v munged >/dev/null 2>&1 || missing="$missing munge"
    [ -z "$missing" ] && return 0
    command -v apt-get >/dev/null 2>&1 || die "Slurm is not installed and apt-get is not available"
    echo "installing slurm-wlm and munge with apt-get (missing:$missing)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null 2>&1 || {
        apt-get update -qq >/dev/null 2>&1 || die "apt-get update failed"
        apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null ||
            die "apt-get install slurm-wlm munge failed"
    }
}

start_munge() {
    if [ ! -s /etc/munge/munge.key ]; then
        mkdir -p /etc/munge
        if command -v mungekey >/dev/null 2>&1; then
            mungekey --create --keyfile /etc/munge/munge.key --force
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
        fi
    fi
    owner=root
    id munge >/dev/null 2>&1 && owner=munge
    chown "$owner:$owner" /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown "$owner:$owner" /run/munge /var/log/munge /var/lib/munge
    if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        if [ "$owner" = munge ]; then
            su -s /bin/sh munge -c munged 2>/dev/null || munged --force
        else
            munged --force
        fi
        i=0
        until munge -n 2>/dev/null | unmunge >/dev/null 2>&1; do
            i=$((i + 1)); [ $i -le 50 ] || die "munged did not start"
            sleep 0.1
        done
    fi
}

namespaces_allowed() {
    name="${PREFIX}probe$$"
    ip netns add "$name" 2>/dev/null || return 1
    ip netns delete "$name" 2>/dev/null || true
}

write_conf() {  # $1: controller address, then "name address cpus" lines on stdin
    ctld_addr=$1
    cat > "$SLURM_CONF" <<EOF
# Written by scripts/slurm_cluster.sh: a controller here and the nodes below.
ClusterName=hvdt
SlurmctldHost=$(hostname -s)($ctld_addr)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
# A requeued job waits cred_expire seconds before it starts again (default 120).
AuthInfo=cred_expire=5
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool/%n
# Per node: the nodes share this machine's /tmp, and mpi/pmix keeps its files in TmpFS.
TmpFS=$DIR/tmp/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobRequeue=1
# scancel --signal and --signal=SIG@TIME reach the job's steps; a preempted job is requeued.
PreemptType=preempt/none
PreemptMode=OFF
KillWait=30
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=600
InactiveLimit=0
SlurmdTimeout=60
SlurmctldTimeout=60
MessageTimeout=20
EOF
    while read -r name addr cpus; do
        echo "NodeName=$name NodeAddr=$addr CPUs=$cpus State=UNKNOWN" >> "$SLURM_CONF"
    done
    echo "PartitionName=hvdt Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >> "$SLURM_CONF"
}

pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop() {
    for pidfile in "$DIR"/slurmd-*.pid "$DIR"/slurmctld.pid; do
        [ -e "$pidfile" ] || continue
        pid=$(cat "$pidfile" 2>/dev/null || true)
        [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
    done
    # Give them a moment, then make sure (only the daemons we started: their pid files).
    i=0
    while [ $i -lt 50 ]; do
        alive=0
        for pidfile in "$DIR"/slurmd-*.pid "$DIR"/slurmctld.pid; do
            pid_alive "$pidfile" && alive=1
        done
        [ $alive -eq 0 ] && break
        sleep 0.1; i=$((i + 1))
    done
    for pidfile in "$DIR"/slurmd-*.pid "$DIR"/slurmctld.pid; do
        pid_alive "$pidfile" && kill -9 "$(cat "$pidfile")" 2>/dev/null || true
        rm -f "$pidfile"
    done
    if [ -e "$DIR/netns" ]; then
        sh "$HOSTS" down >/dev/null  # also ends what still runs in the namespaces (job steps)
        rm -f "$DIR/netns"
    fi
    if [ -e "$DIR/munged.ours" ] && [ -s /run/munge/munged.pid ]; then
        kill "$(cat /run/munge/munged.pid)" 2>/dev/null || true
        rm -f "$DIR/munged.ours"
    fi
    echo "stop: slurmctld and slurmd stopped"
}

start() {
    install_packages
    stop >/dev/null
    mkdir -p "$DIR/ctld" "$DIR/spool"
    # munged: a running one is used (and left running by stop); one we start, stop stops.
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 || touch "$DIR/munged.ours"
    start_munge
    rm -rf "$DIR/ctld"/* "$DIR"/spool/* "$DIR"/tmp/*
    if namespaces_allowed; then
        sh "$HOSTS" up 2 >/dev/null
        touch "$DIR/netns"
        printf '%s\n' "${PREFIX}1 $SUBNET.11 1" "${PREFIX}2 $SUBNET.12 1" | write_conf "$SUBNET.1"
        nodes=$NODES
    else
        echo "slurm_cluster.sh: the kernel refused network namespaces (ip netns add):" \
             "ONE node '${PREFIX}1' on this machine with both cores instead" >&2
        echo "${PREFIX}1 127.0.0.1 2" | write_conf 127.0.0.1
        nodes=${PREFIX}1
    fi
    slurmctld -i
    for node in $nodes; do
        mkdir -p "$DIR/spool/$node" "$DIR/tmp/$node"
        if [ -e "$DIR/netns" ]; then
            # its own network and host name: the namespace's address, hostname hvdtnI
            # Not `ip netns exec`: it mounts a fresh /sys, without the machine's cgroup
            # mounts, and slurmd 22.05 refuses to start without them. The same effect
            # otherwise: the namespace's network, its hosts file, a host name of its own.
            nsenter --net="/run/netns/$node" unshare --mount --uts sh -c \
                'mount --bind "/etc/netns/$1/hosts" /etc/hosts && hostname "$1" &&
                 exec slurmd -N "$1"' slurmd_in_netns "$node"
        else
            slurmd -N "$node"
        fi
    done
    # Up when every node is idle.
    i=0
    while :; do
        states=$(sinfo -h -N -o '%N %t' 2>/dev/null || true)
        busy=$(echo "$states" | awk '$2 != "idle" {n++} END {print n + 0}')
        [ -n "$states" ] && [ "$busy" -eq 0 ] && break
        i=$((i + 1))
        [ $i -le 300 ] || { echo "$states" >&2; tail -20 "$DIR"/slurm*.log >&2; die "nodes not idle after 30 s"; }
        sleep 0.1
    done
    echo "start: nodes $(echo $nodes) idle; export SLURM_CONF=$SLURM_CONF"
}

[ "$(id -u)" -eq 0 ] || die "must run as root (slurmd, ip netns)"
case ${1:-start} in
    start) start ;;
    stop) stop ;;
    status) sinfo -N ;;
    *) die "usage: slurm_cluster.sh start | stop | status" ;;
esac
