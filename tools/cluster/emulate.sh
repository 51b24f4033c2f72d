#!/usr/bin/env bash
# An emulated cluster on one host for honest all-to-all measurements: N network namespaces joined
# by a bridge (in its own namespace), one veth per rank shaped by tbf in both directions, and one
# MPI rank per namespace over OpenMPI's TCP transport. Everything is removed on exit, also when
# interrupted. See tools/cluster/README.md.
set -euo pipefail

readonly prog=${0##*/}

usage() {
  cat << EOF
Usage: $prog --ranks N --rate RATE [options] -- COMMAND [ARGS...]
       $prog --check
       $prog --clean-stale

Runs COMMAND as the N ranks of one mpirun job (MPMD form), rank i inside network namespace i.
Each rank has one link to a shared bridge, shaped by tbf to RATE in each direction; MPI's
traffic goes over TCP through those links only (btl tcp,self: no shared memory). Must run as
root. Example:

  $prog --ranks 2 --rate 10gbit -- build/duet bench all2all --distributed-backend mpi

Options:
  --ranks N          ranks (namespaces), 1..250
  --rate RATE        each link's rate per direction, in tc's units: 10gbit, 800mbit, 1gbps, ...
  --latency TIME     tbf's latency: the longest a packet may wait in a link's queue before it
                     is dropped, i.e. the queue's size (default 5ms). It adds no propagation
                     delay (netem is not available here). Small values (50us) drop packets and
                     TCP then falls well below RATE.
  --burst SIZE       tbf's bucket: bytes that may leave at the host's speed after an idle
                     moment (default: 1ms at RATE, at least 64kb). Smaller buckets fall below
                     RATE on this VM's timers; larger ones let short messages beat RATE.
  --mtu BYTES        the links' MTU (default 1500; 9000 for jumbo frames)
  --cpus-per-rank F  cap each rank's CPU time at F cores (e.g. 0.5), in a cgroup of its own
                     (CFS bandwidth control), so that N ranks on a host with fewer than N cores
                     behave like N hosts of F cores each instead of sharing cores: a rank that
                     waits on its link leaves its share unused, as a separate host's core would
                     stay idle (default: no cap)
  --cpu-period TIME  the cap's period (default 2ms): the rank may run F × TIME in each TIME
  --mpirun-arg ARG   one more argument for mpirun (repeatable), e.g. --mpirun-arg=--tag-output
  --unsupported-status CODE
                     exit with CODE instead of 1 when this host cannot emulate a cluster (not
                     root, ip/tc/mpirun missing, namespaces, veths or tbf refused); for test
                     harnesses, e.g. 77 for CTest's SKIP_RETURN_CODE
  --check            only probe whether this host can emulate a cluster (exit 0 if so)
  --clean-stale      remove what killed (SIGKILL) emulations left behind, then exit
  -h, --help         this text

Exit status: COMMAND's (mpirun's), 2 for a usage error, 1 (or --unsupported-status) when the
cluster cannot be set up, 130/143/129 when interrupted by SIGINT/SIGTERM/SIGHUP.
Names: namespaces dcl<PID>-br and dcl<PID>-r<i>, root-side veth dcl<PID>h, subnet 10.213.K.0/24
with K free on this host, so concurrent emulations never collide.
EOF
}

die_usage() {
  echo "$prog: $*" >&2
  echo "Try '$prog --help'." >&2
  exit 2
}

unsupported_status=1
die_unsupported() {
  echo "$prog: cannot emulate a cluster here: $*" >&2
  exit "$unsupported_status"
}

log() { echo "$prog: $*" >&2; }

# --- arguments ---------------------------------------------------------------------------------

ranks=""
rate=""
latency="5ms"
mtu=1500
burst=""
cpus_per_rank=""
cpu_period="2ms"
mode="run"
mpirun_extra=()
command_args=()

need_value() { [ $# -ge 2 ] || die_usage "$1 needs a value"; }

parse_args() {
  while [ $# -gt 0 ]; do
    case "$1" in
      -h | --help) usage; exit 0 ;;
      --check) mode="check" ;;
      --clean-stale) mode="clean" ;;
      --ranks) need_value "$@"; ranks=$2; shift ;;
      --ranks=*) ranks=${1#*=} ;;
      --rate) need_value "$@"; rate=$2; shift ;;
      --rate=*) rate=${1#*=} ;;
      --latency) need_value "$@"; latency=$2; shift ;;
      --latency=*) latency=${1#*=} ;;
      --burst) need_value "$@"; burst=$2; shift ;;
      --burst=*) burst=${1#*=} ;;
      --mtu) need_value "$@"; mtu=$2; shift ;;
      --mtu=*) mtu=${1#*=} ;;
      --cpus-per-rank) need_value "$@"; cpus_per_rank=$2; shift ;;
      --cpus-per-rank=*) cpus_per_rank=${1#*=} ;;
      --cpu-period) need_value "$@"; cpu_period=$2; shift ;;
      --cpu-period=*) cpu_period=${1#*=} ;;
      --mpirun-arg) need_value "$@"; mpirun_extra+=("$2"); shift ;;
      --mpirun-arg=*) mpirun_extra+=("${1#*=}") ;;
      --unsupported-status) need_value "$@"; unsupported_status=$2; shift ;;
      --unsupported-status=*) unsupported_status=${1#*=} ;;
      --) shift; command_args=("$@"); break ;;
      *) die_usage "unknown argument '$1' (the command goes after --)" ;;
    esac
    shift
  done
  [[ $unsupported_status =~ ^[0-9]{1,3}$ ]] || die_usage "--unsupported-status: '$unsupported_status' is not an exit status"
  [ "$mode" = "run" ] || return 0
  [ -n "$ranks" ] || die_usage "--ranks is required"
  if ! [[ $ranks =~ ^[0-9]+$ ]] || [ "$ranks" -lt 1 ] || [ "$ranks" -gt 250 ]; then
    die_usage "--ranks: '$ranks' is not a number in 1..250"
  fi
  [ -n "$rate" ] || die_usage "--rate is required (e.g. --rate 10gbit)"
  rate_bps=$(rate_to_bits "$rate") || die_usage "--rate: '$rate' is not a rate (e.g. 10gbit, 800mbit, 1gbps)"
  [[ $latency =~ ^[0-9]+(\.[0-9]+)?(s|sec|ms|msec|us|usec)$ ]] ||
    die_usage "--latency: '$latency' is not a time (e.g. 1ms, 50us)"
  if [ -z "$burst" ]; then
    burst="$(awk -v b="$rate_bps" 'BEGIN { x = b / 8 * 1e-3; if (x < 65536) x = 65536; printf "%d", x }')b"
  fi
  [[ ${burst,,} =~ ^[0-9]+[kmg]?(b|bit)?$ ]] || die_usage "--burst: '$burst' is not a size (e.g. 64kb)"
  if ! [[ $mtu =~ ^[0-9]+$ ]] || [ "$mtu" -lt 576 ] || [ "$mtu" -gt 65535 ]; then
    die_usage "--mtu: '$mtu' is not a number in 576..65535"
  fi
  if [ -n "$cpus_per_rank" ]; then
    period_us=$(time_to_us "$cpu_period") || die_usage "--cpu-period: '$cpu_period' is not a time in 1ms..1s (e.g. 10ms)"
    quota_us=$(awk -v f="$cpus_per_rank" -v p="$period_us" 'BEGIN {
      if (f !~ /^[0-9]+(\.[0-9]+)?$/ || f <= 0) exit 1; q = f * p; if (q < 1000) exit 1;
      printf "%.0f", q }') ||
      die_usage "--cpus-per-rank: '$cpus_per_rank' is not a positive number of cores (at least 1 ms per period)"
  fi
  [ ${#command_args[@]} -gt 0 ] || die_usage "no command (give it after --)"
}

# Prints TIME (us, ms or s) in microseconds if it is within 1 ms..1 s.
time_to_us() {
  [[ $1 =~ ^([0-9]+(\.[0-9]+)?)(us|ms|s)$ ]] || return 1
  awk -v n="${BASH_REMATCH[1]}" -v u="${BASH_REMATCH[3]}" 'BEGIN {
    m = 1; if (u == "ms") m = 1e3; else if (u == "s") m = 1e6;
    x = n * m; if (x < 1000 || x > 1e6) exit 1; printf "%.0f", x }'
}

# Prints RATE (tc's units: bit, kbit, mbit, gbit, tbit, bps = bytes/s, kbps, ...) in bit/s.
rate_to_bits() {
  local r=${1,,}
  [[ $r =~ ^([0-9]+(\.[0-9]+)?)([kmgt]?)(bit|bps)$ ]] || return 1
  local num=${BASH_REMATCH[1]} si=${BASH_REMATCH[3]} unit=${BASH_REMATCH[4]}
  awk -v n="$num" -v p="$si" -v u="$unit" 'BEGIN {
    m = 1; if (p == "k") m = 1e3; else if (p == "m") m = 1e6; else if (p == "g") m = 1e9;
    else if (p == "t") m = 1e12;
    if (u == "bps") m *= 8;
    if (n * m < 8) exit 1;
    printf "%.0f", n * m }'
}

# --- host checks -------------------------------------------------------------------------------

ip_bin=""
tc_bin=""
mpirun_bin=""

check_host() {
  [ "$(id -u)" -eq 0 ] || die_unsupported "it needs root (network namespaces, veths and tc)"
  ip_bin=$(command -v ip) || die_unsupported "'ip' not found (install iproute2)"
  tc_bin=$(command -v tc) || die_unsupported "'tc' not found (install iproute2)"
  mpirun_bin=$(command -v mpirun) || die_unsupported "'mpirun' not found (install openmpi-bin)"
  "$mpirun_bin" --version 2>&1 | grep -q "Open MPI" ||
    die_unsupported "'$mpirun_bin' is not OpenMPI's (the MCA settings used here are OpenMPI's)"
}

# The CPU controller's hierarchy for --cpus-per-rank: cgroup v1's cpu controller (quota and
# period files) or cgroup v2's cpu.max. Sets cg_version and cg_root.
cg_version=""
cg_root=""
find_cpu_cgroup() {
  local d
  for d in /sys/fs/cgroup/cpu /sys/fs/cgroup/cpu,cpuacct; do
    if [ -f "$d/cpu.cfs_quota_us" ]; then cg_version=1; cg_root=$d; return 0; fi
  done
  for d in /sys/fs/cgroup /sys/fs/cgroup/unified; do
    if [ -f "$d/cgroup.controllers" ] && grep -qw cpu "$d/cgroup.controllers"; then
      # Children get the cpu controller only if the parent passes it down.
      grep -qw cpu "$d/cgroup.subtree_control" 2> /dev/null ||
        echo +cpu > "$d/cgroup.subtree_control" 2> /dev/null || continue
      cg_version=2; cg_root=$d; return 0
    fi
  done
  die_unsupported "--cpus-per-rank needs the cgroup cpu controller (v1 cpu.cfs_quota_us or v2 cpu.max), found neither writable"
}

# Creates cgroup $1 under cg_root with the rank's CPU cap.
make_cpu_cgroup() {
  local dir="$cg_root/$1"
  mkdir "$dir" 2> /dev/null || [ -d "$dir" ] || die_unsupported "cannot create cgroup $dir"
  created_cg+=("$dir")
  if [ "$cg_version" = 1 ]; then
    must sh -c "echo $period_us > '$dir/cpu.cfs_period_us' && echo $quota_us > '$dir/cpu.cfs_quota_us'"
  else
    must sh -c "echo '$quota_us $period_us' > '$dir/cpu.max'"
  fi
}

# Removes cgroup directory $1 once its processes are gone (a cgroup with tasks cannot go).
remove_cpu_cgroup() {
  local dir=$1 _
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    rmdir "$dir" 2> /dev/null && return 0
    [ -d "$dir" ] || return 0
    sleep 0.2
  done
  log "could not remove cgroup $dir (processes left in it)"
}

# Creates and removes a namespace with a tbf-shaped veth; fails with the reason if refused.
probe_host() {
  local ns="dcl$$-probe" err
  if ! err=$(
    {
      "$ip_bin" netns add "$ns" &&
        "$ip_bin" -n "$ns" link add probe0 type veth peer name probe1 &&
        "$ip_bin" -n "$ns" link set probe0 up &&
        "$tc_bin" -n "$ns" qdisc add dev probe0 root tbf rate 1gbit burst 64kb latency 1ms
    } 2>&1
  ); then
    "$ip_bin" netns delete "$ns" 2> /dev/null || true
    die_unsupported "the probe namespace was refused: ${err:-unknown error}"
  fi
  "$ip_bin" netns delete "$ns"
}

# --- stale emulations --------------------------------------------------------------------------

# Namespaces of emulations whose process is gone (killed with SIGKILL): dcl<PID>-*.
stale_namespaces() {
  local ns pid
  for ns in $("$ip_bin" netns list | awk '{ print $1 }'); do
    [[ $ns =~ ^dcl([0-9]+)- ]] || continue
    pid=${BASH_REMATCH[1]}
    if [ "$pid" = "$$" ] || ! kill -0 "$pid" 2> /dev/null; then echo "$ns"; fi
  done
}

# Stops the processes left in namespace $1, then removes it (with its veths and qdiscs; the
# root-side veth goes with its peer in the bridge namespace).
remove_namespace() {
  local ns=$1 pids
  pids=$("$ip_bin" netns pids "$ns" 2> /dev/null || true)
  if [ -n "$pids" ]; then
    # shellcheck disable=SC2086  # one PID a word
    kill -TERM $pids 2> /dev/null || true
    sleep 0.5
    pids=$("$ip_bin" netns pids "$ns" 2> /dev/null || true)
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -KILL $pids 2> /dev/null || true
  fi
  "$ip_bin" netns delete "$ns" 2> /dev/null || true
}

clean_stale() {
  local ns n=0 dir pid
  for ns in $(stale_namespaces); do
    remove_namespace "$ns"
    log "removed stale namespace $ns"
    n=$((n + 1))
  done
  for dir in /sys/fs/cgroup/cpu/dcl*-r* /sys/fs/cgroup/dcl*-r* /sys/fs/cgroup/unified/dcl*-r*; do
    [ -d "$dir" ] || continue
    [[ ${dir##*/} =~ ^dcl([0-9]+)- ]] || continue
    pid=${BASH_REMATCH[1]}
    if ! kill -0 "$pid" 2> /dev/null; then
      remove_cpu_cgroup "$dir"
      log "removed stale cgroup $dir"
    fi
  done
  log "$n stale namespace(s) removed"
}

# --- the cluster -------------------------------------------------------------------------------

readonly prefix="dcl$$"
readonly br_ns="$prefix-br"
readonly host_if="${prefix}h"
subnet=""           # 10.213.K, chosen under the lock
created_ns=()       # what cleanup removes
created_cg=()       # cgroup directories (--cpus-per-rank), removed after the namespaces
created_host_if=0
mpirun_pid=""
cleaned=0

# Holds an exclusive lock on fd 9 while a subnet is chosen and taken, so that two emulations
# starting together cannot pick the same one.
take_lock() {
  local dir=/run
  [ -w "$dir" ] || dir=${TMPDIR:-/tmp}
  exec 9> "$dir/duet-cluster.lock"
  if command -v flock > /dev/null; then flock 9; fi
}

release_lock() {
  exec 9>&-
}

# A /24 in 10.213.0.0/16 that no address or route of the root namespace touches.
pick_subnet() {
  local used k i
  used=$({ "$ip_bin" -4 -o addr show; "$ip_bin" -4 route show table all; } 2> /dev/null)
  for ((i = 0; i < 256; i++)); do
    k=$((($$ + i) % 256))
    if ! grep -q "10\.213\.$k\.[0-9]" <<< "$used" && ! grep -q "10\.213\.0\.0/16" <<< "$used"; then
      subnet="10.213.$k"
      return 0
    fi
  done
  die_unsupported "no free /24 in 10.213.0.0/16"
}

# Runs "$@" and on failure stops the setup with the command and its message.
must() {
  local err
  if ! err=$("$@" 2>&1); then
    die_unsupported "'$*' failed: ${err:-unknown error}"
  fi
}

shape() {  # shape NS DEV: tbf on DEV's egress inside NS
  must "$tc_bin" -n "$1" qdisc add dev "$2" root tbf rate "$rate" burst "$burst" latency "$latency"
}

setup_cluster() {
  local i ns
  # An earlier emulation with our PID (reused after it was killed) is stale by definition.
  for ns in $("$ip_bin" netns list | awk '{ print $1 }'); do
    if [[ $ns == "$prefix"-* ]]; then remove_namespace "$ns"; fi
  done
  "$ip_bin" link delete "$host_if" 2> /dev/null || true
  local stale
  stale=$(stale_namespaces | wc -l)
  [ "$stale" -eq 0 ] || log "note: $stale namespace(s) of killed emulations remain ($prog --clean-stale removes them)"

  take_lock
  pick_subnet

  created_ns+=("$br_ns")
  must "$ip_bin" netns add "$br_ns"
  must "$ip_bin" -n "$br_ns" link set lo up
  must "$ip_bin" -n "$br_ns" link add br0 type bridge
  must "$ip_bin" -n "$br_ns" link set br0 up

  # The root namespace's port: mpirun (PMIx server) listens there for the ranks.
  created_host_if=1
  must "$ip_bin" link add "$host_if" type veth peer name host netns "$br_ns"
  must "$ip_bin" addr add "$subnet.254/24" dev "$host_if"
  must "$ip_bin" link set "$host_if" mtu "$mtu" up
  must "$ip_bin" -n "$br_ns" link set host master br0
  must "$ip_bin" -n "$br_ns" link set host mtu "$mtu" up
  release_lock

  for ((i = 0; i < ranks; i++)); do
    ns="$prefix-r$i"
    created_ns+=("$ns")
    must "$ip_bin" netns add "$ns"
    must "$ip_bin" -n "$ns" link set lo up
    must "$ip_bin" -n "$ns" link add eth0 type veth peer name "rank$i" netns "$br_ns"
    must "$ip_bin" -n "$ns" addr add "$subnet.$((i + 1))/24" dev eth0
    must "$ip_bin" -n "$ns" link set eth0 mtu "$mtu" up
    must "$ip_bin" -n "$br_ns" link set "rank$i" master br0
    must "$ip_bin" -n "$br_ns" link set "rank$i" mtu "$mtu" up
    shape "$ns" eth0            # what rank i sends
    shape "$br_ns" "rank$i"     # what rank i receives
    [ -z "$cpus_per_rank" ] || make_cpu_cgroup "$ns"
  done
  log "cluster $prefix: $ranks rank(s) on $subnet.0/24, each link tbf rate $rate burst $burst latency $latency mtu $mtu per direction"
  [ -z "$cpus_per_rank" ] ||
    log "each rank capped at $cpus_per_rank CPU ($quota_us us per $period_us us, cgroup v$cg_version)"
}

cleanup() {
  [ "$cleaned" -eq 0 ] || return 0
  cleaned=1
  set +e
  if [ -n "$mpirun_pid" ] && kill -0 "$mpirun_pid" 2> /dev/null; then
    kill -TERM "$mpirun_pid" 2> /dev/null
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      kill -0 "$mpirun_pid" 2> /dev/null || break
      sleep 0.5
    done
    kill -KILL "$mpirun_pid" 2> /dev/null
    wait "$mpirun_pid" 2> /dev/null
  fi
  local ns
  for ns in "${created_ns[@]}"; do remove_namespace "$ns"; done
  local dir
  for dir in "${created_cg[@]}"; do remove_cpu_cgroup "$dir"; done
  [ "$created_host_if" -eq 0 ] || "$ip_bin" link delete "$host_if" 2> /dev/null
  if [ ${#created_ns[@]} -gt 0 ]; then log "cluster $prefix removed"; fi
}

# shellcheck disable=SC2317  # called from the traps
on_signal() {
  local sig=$1 code=$2
  trap - INT TERM HUP
  log "interrupted by SIG$sig, removing cluster $prefix"
  cleanup
  exit "$code"
}

run_ranks() {
  local i argv=()
  argv=("$mpirun_bin" --oversubscribe
        --mca btl "tcp,self"
        --mca btl_tcp_if_include "$subnet.0/24"
        --mca oob_tcp_if_include "$host_if"
        "${mpirun_extra[@]}")
  for ((i = 0; i < ranks; i++)); do
    [ "$i" -eq 0 ] || argv+=(:)
    argv+=(-np 1)
    if [ -n "$cpus_per_rank" ]; then
      # The rank enters its cgroup before it starts (its threads inherit it), and before it enters
      # its namespace: `ip netns exec` mounts a sysfs of its own, without the cgroup hierarchy.
      # shellcheck disable=SC2016  # expanded by that shell
      argv+=(sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg_root/$prefix-r$i")
    fi
    argv+=("$ip_bin" netns exec "$prefix-r$i" "${command_args[@]}")
  done
  # Without the two PMIX_* settings the ranks cannot reach mpirun's PMIx server from their
  # namespaces (it listens on loopback only).
  PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include="$host_if" \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    "${argv[@]}" &
  mpirun_pid=$!
  local status=0
  wait "$mpirun_pid" || status=$?
  mpirun_pid=""
  return "$status"
}

main() {
  parse_args "$@"
  check_host
  [ -z "$cpus_per_rank" ] || [ "$mode" != run ] || find_cpu_cgroup
  case "$mode" in
    check) probe_host; log "this host can emulate a cluster"; exit 0 ;;
    clean) clean_stale; exit 0 ;;
  esac
  trap cleanup EXIT
  trap 'on_signal INT 130' INT
  trap 'on_signal TERM 143' TERM
  trap 'on_signal HUP 129' HUP
  setup_cluster
  local status=0
  run_ranks || status=$?
  log "cluster $prefix: mpirun exited with status $status"
  cleanup
  exit "$status"
}

main "$@"
