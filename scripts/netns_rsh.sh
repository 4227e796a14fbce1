#!/bin/sh
# An rsh/ssh stand-in that "logs in" to a network-namespace host of scripts/netns_hosts.sh.
#
#   netns_rsh.sh [ssh options] HOST [COMMAND...]
#
# Runs COMMAND (its words joined by spaces and given to `sh -c`, as ssh does) inside the
# network namespace HOST, in a fresh UTS namespace whose hostname is HOST, so `hostname`
# and gethostname() tell the hosts apart. HOST is a namespace name (hvdtn1), or one of
# the hosts' addresses / names in that namespace's hosts file. ssh's options are accepted
# and ignored (-x -T -n -q -t ..., and -l/-p/-o/-i/-F/-E with their argument), before or
# after HOST, because Open MPI (`--mca plm_rsh_agent`) and horovodrun pass some of them.
# The environment and the working directory carry over, like a shared home directory on
# a cluster. Without a COMMAND it reports the host's name. Use it as `mpirun --mca plm_rsh_agent
# scripts/netns_rsh.sh`, or name it `ssh` early on PATH for `horovodrun -H`.
#
# HVDT_NETNS_PIN=1 pins what runs on host i to one CPU, the (i-1)-th of those this
# process may use (wrapping around), as if each host had a core of its own.
set -eu

die() { echo "netns_rsh.sh: $*" >&2; exit 255; }  # 255: ssh's own failure status

# ssh's options, before HOST and (as ssh also allows) between HOST and COMMAND.
host=''
while [ $# -gt 0 ]; do
    case $1 in
        --) shift; [ -n "$host" ] || { [ $# -ge 1 ] && host=$1 && shift; }; break ;;
        -[bcDEeFIiJLlmOopQRSWw]) [ $# -ge 2 ] || die "option $1 needs an argument"; shift 2 ;;
        -[bcDEeFIiJLlmOopQRSWw]?*) shift ;;  # -oBatchMode=yes, -p22
        -?*) shift ;;                        # -x -T -n -q -t -4 ... (also grouped: -xT)
        *) [ -z "$host" ] || break; host=$1; shift ;;
    esac
done
[ -n "$host" ] || die "usage: netns_rsh.sh [ssh options] HOST [COMMAND...]"
host=${host#*@}  # user@host: the user is ignored (every host is this machine)

# The namespace: HOST itself, or the namespace whose hosts file maps HOST to its address.
if [ -e "/run/netns/$host" ]; then
    ns=$host
else
    ns=''
    for file in /etc/netns/*/hosts; do
        [ -e "$file" ] || continue
        owner=${file%/hosts}; owner=${owner##*/}
        addr=$(awk -v h="$host" '$2 == h || $1 == h {print $1; exit}' "$file")
        # The entry naming HOST must be the owner's own address.
        if [ -n "$addr" ] && awk -v a="$addr" -v o="$owner" '$1 == a && $2 == o {f=1} END {exit !f}' "$file"; then
            ns=$owner
            break
        fi
    done
    [ -n "$ns" ] || die "no network-namespace host named '$host' (see scripts/netns_hosts.sh status)"
fi

command=${*:-hostname}
pin=''
if [ "${HVDT_NETNS_PIN:-0}" = 1 ]; then
    command -v taskset >/dev/null 2>&1 || die "HVDT_NETNS_PIN=1 needs taskset (util-linux)"
    index=${ns##*[!0-9]}
    [ -n "$index" ] || die "HVDT_NETNS_PIN=1: host '$ns' has no number to pick its CPU by"
    cpus=$(python3 -c 'import os; print(" ".join(map(str, sorted(os.sched_getaffinity(0)))))')
    set -- $cpus
    shift $(( (index - 1) % $# ))
    pin="taskset -c $1"
fi
# unshare --uts: a hostname of our own, set before COMMAND runs; ip netns exec also mounts
# /etc/netns/$ns/hosts on /etc/hosts, so every host resolves the others by name.
exec ip netns exec "$ns" $pin unshare --uts sh -c 'hostname "$1" && cd "$2" 2>/dev/null; exec sh -c "$3"' \
    netns_rsh "$ns" "$PWD" "$command"
