#!/bin/sh
# Pretend hosts on one machine: N Linux network namespaces joined by veth to a bridge.
#
#   scripts/netns_hosts.sh up N [--hostfile FILE] [--slots K] [--link RATE [SHAPE]]
#                                       create hosts 1..N (with every link shaped to RATE)
#   scripts/netns_hosts.sh link RATE|none [SHAPE]
#                                       shape (or unshape) every running host's link
#   scripts/netns_hosts.sh down         remove everything (idempotent)
#   scripts/netns_hosts.sh status       list hosts, byte counters and link rates
#
# Emulated links: RATE is tc's rate, a number and a unit (kbit, mbit or gbit; 1gbit =
# 10^9 bit/s), e.g. 500mbit, 2gbit, 5gbit. Each host's link is a token bucket
# (`tc qdisc replace dev IF root tbf rate RATE burst BURST latency LATENCY`) on both ends
# of its veth pair: inside the host (what it sends) and on the root end (what it
# receives), so each direction runs at RATE. SHAPE is `--burst BURST` (default 512kb,
# tc's size: kb = 1024 bytes) and `--latency LATENCY` (default 100ms: how long a packet
# may wait in the bucket's queue, i.e. the queue's depth). `link none` removes the
# shaping. netem (added delay) is not used: its qdisc is missing in some kernels.
#
# Host i is the namespace "${HVDT_NETNS_PREFIX}i" (default hvdtn1, hvdtn2, ...) with
# address SUBNET.(10+i)/24 on its interface "hvdt0". In the root namespace the bridge is
# also named "hvdt0" (address SUBNET.1, where mpirun / horovodrun listen) and host i's
# end of the veth pair is "hvdtv<i>", whose /sys/class/net/hvdtv<i>/statistics/*_bytes
# count every byte host i sends and receives. Because the interface has the same name
# everywhere, `btl_tcp_if_include hvdt0` and `--network-interface hvdt0` hold on every
# host. Each host gets /etc/netns/<name>/hosts (which `ip netns exec` mounts on
# /etc/hosts) naming every host, and the hostfile lists "<name> slots=K" per host for
# `mpirun --hostfile`. Run scripts/netns_rsh.sh as the rsh agent to start commands there.
#
# Environment: HVDT_SUBNET (three octets, default 10.213.7; must be private) and
# HVDT_NETNS_PREFIX (default hvdtn). Needs root (ip netns add).
set -eu

PREFIX=${HVDT_NETNS_PREFIX:-hvdtn}
SUBNET=${HVDT_SUBNET:-10.213.7}
IFACE=hvdt0
VETH=hvdtv
MAX_HOSTS=200

die() { echo "netns_hosts.sh: $*" >&2; exit 2; }

DEFAULT_BURST=512kb
DEFAULT_LATENCY=100ms

check_rate() {  # $1: RATE; 'none' allowed
    echo "$1" | grep -Eq '^(none|[0-9]+(\.[0-9]+)?(kbit|mbit|gbit))$' ||
        die "link: RATE must be a number followed by kbit, mbit or gbit (e.g. 500mbit, 2gbit, 5gbit), or none; got '$1'"
    case $1 in none) ;; *)
        echo "$1" | grep -Eq '^0*(\.0*)?[a-z]+$' && die "link: RATE must be above zero, got '$1'" ;;
    esac
    return 0
}

check_burst() {
    echo "$1" | grep -Eq '^[0-9]+(kb|mb|b)$' ||
        die "link: --burst must be a size such as 512kb, 4mb or 65536b, got '$1'"
}

check_latency() {
    echo "$1" | grep -Eq '^[0-9]+(\.[0-9]+)?(us|ms|s)$' ||
        die "link: --latency must be a time such as 100ms, 5ms or 500us, got '$1'"
}

# Shapes (or, with RATE none, unshapes) both ends of every host's veth: $1 RATE,
# $2 BURST, $3 LATENCY.
shape() {
    command -v tc >/dev/null 2>&1 || die "link: the tc command (iproute2) is not installed"
    [ -n "$(our_namespaces)" ] || die "link: no ${PREFIX}N hosts are up (run: netns_hosts.sh up N)"
    for ns in $(our_namespaces); do
        i=${ns#"$PREFIX"}
        if [ "$1" = none ]; then
            tc qdisc del dev "$VETH$i" root 2>/dev/null || true
            ip netns exec "$ns" tc qdisc del dev "$IFACE" root 2>/dev/null || true
        else
            tc qdisc replace dev "$VETH$i" root tbf rate "$1" burst "$2" latency "$3" ||
                die "link: tc refused rate $1 burst $2 latency $3 on $VETH$i"
            ip netns exec "$ns" tc qdisc replace dev "$IFACE" root tbf rate "$1" burst "$2" \
                latency "$3" || die "link: tc refused rate $1 burst $2 latency $3 in $ns"
        fi
    done
}

# Parses `RATE [--burst B] [--latency L]` and shapes every host.
link() {
    rate=${1:-}
    [ -n "$rate" ] || die "link: usage: netns_hosts.sh link RATE|none [--burst B] [--latency L]"
    shift
    burst=$DEFAULT_BURST latency=$DEFAULT_LATENCY
    while [ $# -gt 0 ]; do
        case $1 in
            --burst) [ $# -ge 2 ] || die "link: --burst needs a size"; burst=$2; shift 2 ;;
            --latency) [ $# -ge 2 ] || die "link: --latency needs a time"; latency=$2; shift 2 ;;
            *) die "link: unknown argument '$1' (expected --burst SIZE or --latency TIME)" ;;
        esac
    done
    check_rate "$rate"; check_burst "$burst"; check_latency "$latency"
    need_root
    shape "$rate" "$burst" "$latency"
    if [ "$rate" = none ]; then
        echo "link: every host's link unshaped"
    else
        echo "link: every host's link shaped to $rate each way (tbf burst $burst latency $latency)"
    fi
}

check_config() {
    case $PREFIX in
        ''|*[!a-z0-9]*) die "HVDT_NETNS_PREFIX must be lowercase letters and digits, got '$PREFIX'" ;;
    esac
    [ ${#PREFIX} -le 10 ] || die "HVDT_NETNS_PREFIX must be at most 10 characters, got '$PREFIX'"
    echo "$SUBNET" | grep -Eq '^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$' ||
        die "HVDT_SUBNET must be three octets such as 10.213.7, got '$SUBNET'"
    a=${SUBNET%%.*}; rest=${SUBNET#*.}; b=${rest%%.*}; c=${SUBNET##*.}
    for octet in "$a" "$b" "$c"; do
        [ "$octet" -le 255 ] || die "HVDT_SUBNET octets must be 0-255, got '$SUBNET'"
    done
    # Only a private range: the namespaces' addresses are the only targets allowed.
    if ! { [ "$a" -eq 10 ] || { [ "$a" -eq 192 ] && [ "$b" -eq 168 ]; } ||
           { [ "$a" -eq 172 ] && [ "$b" -ge 16 ] && [ "$b" -le 31 ]; }; }; then
        die "HVDT_SUBNET must be a private range (10.x.y, 172.16-31.y, 192.168.y), got '$SUBNET'"
    fi
}

# The names of our namespaces that exist now, one per line.
our_namespaces() {
    ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}[0-9]+\$" || true
}

down() {
    for ns in $(our_namespaces); do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns delete "$ns" 2>/dev/null || true
        rm -rf "/etc/netns/$ns"
    done
    # Deleting a namespace deletes its veth end, and with it the root end; sweep leftovers.
    for path in /sys/class/net/${VETH}[0-9]*; do
        [ -e "$path" ] && ip link delete "${path##*/}" 2>/dev/null || true
    done
    ip link delete "$IFACE" 2>/dev/null || true
    rmdir /etc/netns 2>/dev/null || true
}

# Whether namespace $1 reaches address $2: a TCP connect to port 9 (discard) that is
# answered, accepted or refused, within 5 s (no ping here; a refusal proves the route).
reachable() {
    out=$(ip netns exec "$1" timeout 5 bash -c "exec 3<>/dev/tcp/$2/9" 2>&1) && return 0
    case $out in *refused*) return 0 ;; *) return 1 ;; esac
}

up() {
    n=${1:-}
    shift || true
    case $n in ''|*[!0-9]*) die "up: N must be a positive integer (number of hosts), got '$n'" ;; esac
    [ "$n" -ge 1 ] && [ "$n" -le $MAX_HOSTS ] || die "up: N must be in 1..$MAX_HOSTS, got $n"
    hostfile='' slots=1 rate='' burst=$DEFAULT_BURST latency=$DEFAULT_LATENCY
    while [ $# -gt 0 ]; do
        case $1 in
            --hostfile) [ $# -ge 2 ] || die "up: --hostfile needs a file name"; hostfile=$2; shift 2 ;;
            --slots) [ $# -ge 2 ] || die "up: --slots needs a number"; slots=$2; shift 2 ;;
            --link) [ $# -ge 2 ] || die "up: --link needs a RATE (e.g. 2gbit)"; rate=$2; shift 2 ;;
            --burst) [ $# -ge 2 ] || die "up: --burst needs a size"; burst=$2; shift 2 ;;
            --latency) [ $# -ge 2 ] || die "up: --latency needs a time"; latency=$2; shift 2 ;;
            *) die "up: unknown argument '$1' (expected --hostfile FILE, --slots K, --link RATE, --burst SIZE or --latency TIME)" ;;
        esac
    done
    case $slots in ''|*[!0-9]*|0) die "up: --slots must be a positive integer, got '$slots'" ;; esac
    if [ -n "$rate" ]; then
        check_rate "$rate"; check_burst "$burst"; check_latency "$latency"
        command -v tc >/dev/null 2>&1 || die "up: the tc command (iproute2) is not installed"
    fi

    need_root
    down  # a clean slate: leftovers of an interrupted run must not linger
    trap 'down' EXIT  # a failure half way removes what was made
    ip link add "$IFACE" type bridge
    ip addr add "$SUBNET.1/24" dev "$IFACE"
    ip link set "$IFACE" up

    hosts="127.0.0.1 localhost
$SUBNET.1 ${PREFIX}0"
    i=1
    while [ "$i" -le "$n" ]; do
        hosts="$hosts
$SUBNET.$((10 + i)) $PREFIX$i"
        i=$((i + 1))
    done

    i=1
    while [ "$i" -le "$n" ]; do
        ns=$PREFIX$i
        ip netns add "$ns"
        ip link add "$VETH$i" type veth peer name "$IFACE" netns "$ns"
        ip link set "$VETH$i" master "$IFACE" up
        ip -n "$ns" addr add "$SUBNET.$((10 + i))/24" dev "$IFACE"
        ip -n "$ns" link set "$IFACE" up
        ip -n "$ns" link set lo up
        mkdir -p "/etc/netns/$ns"
        printf '%s\n' "$hosts" > "/etc/netns/$ns/hosts"
        echo "$ns" > "/etc/netns/$ns/hostname"
        i=$((i + 1))
    done
    if [ -n "$hostfile" ]; then
        : > "$hostfile"
        i=1
        while [ "$i" -le "$n" ]; do
            echo "$PREFIX$i slots=$slots" >> "$hostfile"
            i=$((i + 1))
        done
    fi
    # Every host must reach the bridge (where the launcher listens) before we say "up".
    i=1
    while [ "$i" -le "$n" ]; do
        reachable "$PREFIX$i" "$SUBNET.1" ||
            die "up: host $PREFIX$i cannot reach $SUBNET.1 over $IFACE"
        i=$((i + 1))
    done
    if [ -n "$rate" ]; then
        shape "$rate" "$burst" "$latency"
    fi
    trap - EXIT
    shaped=''
    [ -n "$rate" ] && [ "$rate" != none ] && shaped=", links shaped to $rate each way"
    echo "up: $n host(s) ${PREFIX}1..$PREFIX$n on $SUBNET.0/24 (launcher at $SUBNET.1 on $IFACE)$shaped"
}

status() {
    for ns in $(our_namespaces); do
        i=${ns#"$PREFIX"}
        addr=$(ip -n "$ns" -4 -o addr show dev "$IFACE" 2>/dev/null | awk '{print $4}')
        rx=$(cat "/sys/class/net/$VETH$i/statistics/rx_bytes" 2>/dev/null || echo '?')
        tx=$(cat "/sys/class/net/$VETH$i/statistics/tx_bytes" 2>/dev/null || echo '?')
        rate=$(tc qdisc show dev "$VETH$i" 2>/dev/null | awk '$2 == "tbf" {for (k = 1; k < NF; k++) if ($k == "rate") print $(k + 1)}')
        echo "$ns $addr $VETH$i sent_by_host=$rx received_by_host=$tx link=${rate:-unshaped}"
    done
}

need_root() {
    [ "$(id -u)" -eq 0 ] || die "must run as root (ip netns add and tc need CAP_SYS_ADMIN)"
}

check_config
case ${1:-} in
    up) shift; up "$@" ;;
    link) shift; link "$@" ;;
    down) need_root; down; echo "down: no ${PREFIX}N namespaces, no $IFACE bridge" ;;
    status) need_root; status ;;
    *) die "usage: netns_hosts.sh up N [--hostfile FILE] [--slots K] [--link RATE] | link RATE|none | down | status" ;;
esac
