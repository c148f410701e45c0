#!/usr/bin/env bash
# compare.sh measures the sidecar proxy against memcached itself and against
# twemproxy (nutcracker), all on loopback, under four loads, and a fifth on
# request:
#
#   1  single-key gets, 1 KiB values, 90 % gets (10 % sets), 32 connections,
#      one memcached server
#   2  10-key gets, otherwise as 1
#   3  100-key gets of 3 KiB values, 8 connections, four memcached servers
#      (twemproxy and the proxy each in front of all four)
#   4  50 % sets, otherwise as 1
#   5  single-key gets of 700 KB values, 95 % gets, 4 connections, one
#      server, 500 keys (they fit memcached's 512 MB); not in the default
#      LOADS: the four above are the comparison's yardstick
#
# and three shaped like a Mimir store-gateway's own cache traffic
# (loadgen --shape; 100-key gets, 90 % gets, 8 connections, one server,
# 10000 keys), also on request:
#
#   6  postings keys of 224 bytes (150-byte tenant), Mimir "dm" postings
#      values of about 3 KB, compressed already: the proxy stores them as
#      they are
#   7  the same keys, raw postings lists of 10 to 50,000 references
#      (about 23 KB on average): the proxy compresses them
#   8  series keys (S:, at most 192 bytes), values of a few hundred bytes
#
# and two that measure isolation in time, on request: how much the
# latency of light requests suffers from heavy ones of other clients.
#
#   9  single-key gets of 1 KiB values, 16 connections, one server
#  10  load 9 while 4 more connections of another loadgen read 100-key
#      batches of raw postings lists (as in load 7) all along: compare its
#      get p99 with load 9's. The CPU figures include the heavy reads.
#
# The same loadgen load runs against each target in turn, round by round,
# with the order rotated every round so that no target always goes first.
# For twemproxy and the proxy it also reads the server's CPU time
# (/proc/PID/stat, utime+stime) and its read and write system calls
# (/proc/PID/io, syscr and syscw) just before and just after the timed part
# of each run (loadgen --wait-start pauses between its pre-population and
# the clock, so that the pre-population is not counted) and divides them by
# the requests loadgen completed. At the end it prints one table of the
# medians over the rounds: throughput, CPU microseconds per request and
# reads + writes per request, and context switches per request, with the
# ratios proxy/twemproxy. A second table gives, for all three targets,
# items (values read or written) per second, CPU microseconds per request
# of the server loadgen talks to (for twemproxy and the proxy, plus that
# of the memcached servers behind them) and the latency of the gets, the
# batches, p50 and p99. A third gives, for each load, the ratios
# proxy/twemproxy of throughput, CPU per request and batch p99 round by
# round: their median, lowest and highest. Any wrong value or protocol
# error seen by loadgen fails the script.
#
# Load 3 has no direct memcached figure ("n/a"): loadgen talks to one
# address, so it cannot split a get over four servers as a client of them
# would, and one server answering all 100 keys would be another load.
#
# Usage: cmd/loadgen/compare.sh [ROUNDS]
# Environment (defaults in brackets):
#   ROUNDS [3]  DURATION [5s]: per run  KEYS [10000; 500 for load 5]  SEED [1]
#   MEMCACHED_THREADS [2]: -t of each memcached
#   LOADS [1 2 3 4]: the loads to measure, e.g. LOADS="1 3",
#     LOADS="6 7 8" or LOADS="9 10"
#   CONNS, VALUE_SIZE, GET_RATIO, MULTIGET [per load]: when set, override
#     that setting in every load (VALUE_SIZE in loads 1-5 only: the
#     Mimir-shaped loads size their own values)
#   RATE []: run every load in an open loop at this many requests per
#     second over all connections (loadgen --rate): each request is sent
#     when due, whether or not earlier replies have come, and timed from
#     then; the second table then counts requests sent over 1 ms late
#   LOADGEN_ARGS []: more loadgen flags, passed as they are; e.g.
#     --event-loops 0 runs loadgen's timed phase on a goroutine per
#     connection, as before it had event loops (it costs loadgen about
#     half as much CPU again, which the servers then lack)
#   PROXY_ARGS []: more proxy flags, e.g. --upstream-timeout 1s
#   PROXY_BIN []: measure this proxy binary (an older build, say) instead
#     of building ./cmd/proxy; it must take --listen, --upstream,
#     --metrics-listen and --log-level and answer /readyz
#   QUIET_WAIT [5]: longest wait, in seconds, before each run for the
#     machine to fall quiet (other work would skew the numbers)
set -euo pipefail

ROUNDS=${1:-${ROUNDS:-3}}
DURATION=${DURATION:-5s}
LOADS=${LOADS:-1 2 3 4}
KEYS=${KEYS:-}
SEED=${SEED:-1}
MEMCACHED_THREADS=${MEMCACHED_THREADS:-2}
LOADGEN_ARGS=${LOADGEN_ARGS:-}
PROXY_ARGS=${PROXY_ARGS:-}
PROXY_BIN=${PROXY_BIN:-}

RATE=${RATE:-}

# The loads: connections, value size, get ratio, keys per get, servers,
# keys, and loadgen's shape of keys and values (a value size only for
# plain ones).
declare -A l_conns=([1]=32 [2]=32 [3]=8 [4]=32 [5]=4 [6]=8 [7]=8 [8]=8 [9]=16 [10]=16)
declare -A l_size=([1]=1024 [2]=1024 [3]=3072 [4]=1024 [5]=700000 [6]= [7]= [8]= [9]=1024 [10]=1024)
declare -A l_ratio=([1]=0.9 [2]=0.9 [3]=0.9 [4]=0.5 [5]=0.95 [6]=0.9 [7]=0.9 [8]=0.9 [9]=1 [10]=1)
declare -A l_multiget=([1]=1 [2]=10 [3]=100 [4]=1 [5]=1 [6]=100 [7]=100 [8]=100 [9]=1 [10]=1)
declare -A l_servers=([1]=1 [2]=1 [3]=4 [4]=1 [5]=1 [6]=1 [7]=1 [8]=1 [9]=1 [10]=1)
declare -A l_keys=([1]=10000 [2]=10000 [3]=10000 [4]=10000 [5]=500 [6]=10000 [7]=10000 [8]=10000 [9]=10000 [10]=10000)
declare -A l_shape=([1]=plain [2]=plain [3]=plain [4]=plain [5]=plain [6]=dm [7]=raw-postings [8]=series [9]=plain [10]=plain)
# The heavy reads another loadgen makes all along a load, if any.
declare -A l_background=([10]="--conns 4 --shape raw-postings --multiget 100 --get-ratio 1 --keys 10000")

die() { echo "compare: $*" >&2; exit 1; }

[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive number, not '$ROUNDS'"
[[ -z $RATE || $RATE =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "RATE must be a number of requests per second, not '$RATE'"
for bin in go memcached nutcracker ss awk curl pgrep getconf; do
	command -v "$bin" >/dev/null || die "$bin is not installed"
done

read -ra loads <<<"$LOADS"
((${#loads[@]} > 0)) || die "LOADS is empty"
seen=" "
for l in "${loads[@]}"; do
	[[ $l =~ ^[0-9]+$ && -n ${l_servers[$l]:-} ]] || die "LOADS holds '$l': the loads are 1 2 3 4 5 6 7 8 9 10"
	[[ $seen != *" $l "* ]] || die "LOADS names load $l twice"
	seen+="$l "
	# Overrides from the environment apply to every load.
	l_conns[$l]=${CONNS:-${l_conns[$l]}}
	[[ ${l_shape[$l]} != plain ]] || l_size[$l]=${VALUE_SIZE:-${l_size[$l]}}
	l_ratio[$l]=${GET_RATIO:-${l_ratio[$l]}}
	l_multiget[$l]=${MULTIGET:-${l_multiget[$l]}}
	l_keys[$l]=${KEYS:-${l_keys[$l]}}
done
n_servers=1 want1=false want4=false
for l in "${loads[@]}"; do
	if ((l_servers[$l] == 4)); then
		n_servers=4 want4=true
	else
		want1=true
	fi
done

# seconds turns a Go duration of whole seconds or minutes (10s, 2m) into
# seconds, to bound each loadgen run from outside as well.
seconds() {
	case $1 in
	*[0-9]s) [[ ${1%s} =~ ^[0-9]+$ ]] && { echo "${1%s}"; return; } ;;
	*[0-9]m) [[ ${1%m} =~ ^[0-9]+$ ]] && { echo $((${1%m} * 60)); return; } ;;
	esac
	die "DURATION must look like 10s or 2m, not '$1'"
}
RUN_LIMIT=$(($(seconds "$DURATION") + 60))
QUIET_WAIT=${QUIET_WAIT:-5}
[[ $QUIET_WAIT =~ ^[0-9]+$ ]] || die "QUIET_WAIT must be a number of seconds, not '$QUIET_WAIT'"
# Each server runs under timeout too, so that it stops by itself even if
# this script is killed before its trap can run.
SERVER_LIMIT=$((ROUNDS * ${#loads[@]} * 3 * (RUN_LIMIT + QUIET_WAIT + 40) + 120))
# A background load runs this long: the measured run's, with room for its
# pre-population before the clock starts.
BG_SECS=$(($(seconds "$DURATION") + 15))

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/mcsidecar-compare.XXXXXX")
pids=()
cleanup() {
	local pid
	for pid in "${pids[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in "${pids[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ -n $PROXY_BIN ]]; then
	echo "building loadgen in $work from $(git -C "$root" describe --always --dirty 2>/dev/null || echo "an unknown revision"); proxy: $PROXY_BIN"
	cp "$PROXY_BIN" "$work/proxy"
else
	echo "building proxy and loadgen in $work from $(git -C "$root" describe --always --dirty 2>/dev/null || echo "an unknown revision")"
	(cd "$root" && go build -o "$work/proxy" ./cmd/proxy)
fi
(cd "$root" && go build -o "$work/loadgen" ./cmd/loadgen)

# free_port sets port to a loopback port that no socket uses and that this
# script has not handed out before. A server that still loses the race
# fails to start and is retried on another port.
taken=" "
free_port() {
	local p
	for _ in $(seq 200); do
		p=$((20000 + RANDOM % 40000))
		[[ $taken == *" $p "* ]] && continue
		if [[ -z $(ss -Htan "( sport = :$p or dport = :$p )") ]]; then
			taken+="$p "
			port=$p
			return
		fi
	done
	die "no free port found"
}

# listening waits until 127.0.0.1:$2 accepts connections while process $1
# is alive; it fails after five seconds or when the process has exited.
listening() {
	local pid=$1 port=$2
	for _ in $(seq 100); do
		kill -0 "$pid" 2>/dev/null || return 1
		if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			return 0
		fi
		sleep 0.05
	done
	return 1
}

# start runs "$@" in the background with its output in $work/$name.log,
# after substituting PORT (and PORT2) with free ports, until it listens on
# the first. A twemproxy* name gets $work/$name.yml written first, in front
# of the servers in $nut_servers. It sets started_port, started_port2 and
# started_pid, the server's own pid (its parent is the timeout that bounds
# its life).
start() {
	local name=$1 pid p p2 args a
	shift
	for _ in 1 2 3 4 5; do
		free_port
		p=$port
		free_port
		p2=$port
		args=()
		for a in "$@"; do
			a=${a//PORT2/$p2}
			args+=("${a//PORT/$p}")
		done
		if [[ $name == twemproxy* ]]; then
			write_nutcracker_conf "$work/$name.yml" "$p"
			nutcracker -t -c "$work/$name.yml" >"$work/$name-test.log" 2>&1 ||
				die "nutcracker rejects its config: $(cat "$work/$name-test.log")"
		fi
		timeout -k 5 "$SERVER_LIMIT" "${args[@]}" >"$work/$name.log" 2>&1 &
		pid=$!
		pids+=("$pid")
		if listening "$pid" "$p"; then
			started_port=$p
			started_port2=$p2
			started_pid=$(pgrep -P "$pid")
			[[ $started_pid =~ ^[0-9]+$ ]] || die "cannot find the pid of $name"
			return
		fi
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
		echo "compare: $name did not start on port $p, retrying:" >&2
		tail -n 5 "$work/$name.log" >&2 || true
	done
	die "$name would not start"
}

# write_nutcracker_conf writes config file $1 for a pool listening on port
# $2 in front of the memcached servers in $nut_servers.
write_nutcracker_conf() {
	local s
	cat >"$1" <<-EOF
		mc:
		  listen: 127.0.0.1:$2
		  hash: fnv1a_64
		  distribution: ketama
		  timeout: 1000
		  redis: false
		  auto_eject_hosts: false
		  server_connections: 1
		  servers:
	EOF
	for s in $nut_servers; do
		echo "    - $s:1" >>"$1"
	done
}

declare -A addr=() server_pid=() metrics=()
mc_pids=()
for ((s = 1; s <= n_servers; s++)); do
	start "memcached$s" memcached -l 127.0.0.1 -p PORT -U 0 -u nobody -t "$MEMCACHED_THREADS" -m 512 -c 4096
	addr[memcached$s]="127.0.0.1:$started_port"
	mc_pids+=("$started_pid")
done
# start_proxies starts twemproxy$1 and proxy$1 in front of the first $1
# memcached servers.
start_proxies() {
	local n=$1 s ups=()
	for ((s = 1; s <= n; s++)); do
		ups+=("${addr[memcached$s]}")
	done
	nut_servers=${ups[*]}
	start "twemproxy$n" nutcracker -c "$work/twemproxy$n.yml" -s PORT2 -a 127.0.0.1 -o "$work/twemproxy$n.out"
	addr[twemproxy$n]="127.0.0.1:$started_port"
	server_pid[twemproxy$n]=$started_pid
	# shellcheck disable=SC2086 # PROXY_ARGS is a list of flags
	start "proxy$n" "$work/proxy" --listen 127.0.0.1:PORT --upstream "${nut_servers// /,}" --metrics-listen 127.0.0.1:PORT2 --log-level warn $PROXY_ARGS
	addr[proxy$n]="127.0.0.1:$started_port"
	server_pid[proxy$n]=$started_pid
	metrics[proxy$n]=$started_port2
	curl -fsS --max-time 5 "http://127.0.0.1:$started_port2/readyz" >/dev/null || die "proxy$n is not ready"
}
proxies=()
if $want1; then
	start_proxies 1
	proxies+=(proxy1)
fi
if $want4; then
	start_proxies 4
	proxies+=(proxy4)
fi

targets=(memcached twemproxy proxy)
# instance prints the server that target $2 is in load $1, or nothing when
# the load has no such target.
instance() {
	local n=${l_servers[$1]}
	case $2 in
	memcached) ((n == 1)) && echo memcached1 ;;
	*) echo "$2$n" ;;
	esac
	return 0
}
declare -A results=() cpu_req=() rd_req=() wr_req=() cs_req=()
declare -A items_s=() mc_req=() bp50=() bp99=() late_n=()

# The machine is small and may be shared, so each run reports where the CPU
# went: the servers' own time, loadgen's (as this shell's reaped children),
# and how busy the whole machine was. Busy time nobody here accounts for is
# other work on the machine or kernel time charged to no process; the two
# sources are sampled differently, so it is only good to a few tenths of a
# second and may even come out slightly negative. These cover the whole
# run, pre-population included; the per-request figures do not.
HZ=$(getconf CLK_TCK)
[[ $HZ =~ ^[1-9][0-9]*$ ]] || die "getconf CLK_TCK gave '$HZ'"
NCPU=$(nproc)
# cpu_ticks prints the user+system clock ticks of the processes "$@".
cpu_ticks() {
	local pid t=0 f
	for pid in "$@"; do
		f=$(<"/proc/$pid/stat") || die "process $pid is gone"
		read -ra f <<<"${f##*) }" # fields from 3 on: the name may hold spaces
		[[ ${f[11]} =~ ^[0-9]+$ && ${f[12]} =~ ^[0-9]+$ ]] || die "bad /proc/$pid/stat"
		t=$((t + f[11] + f[12]))
	done
	echo "$t"
}
# proc_sample sets ps_ticks, ps_reads and ps_writes to the CPU clock ticks
# and the read and write system calls process $1 has made so far, and
# ps_switches to the context switches, voluntary and not, of its threads
# alive now (a thread that ended meanwhile takes its count with it; Go and
# twemproxy keep theirs).
proc_sample() {
	local k v
	ps_ticks=$(cpu_ticks "$1") ps_reads="" ps_writes=""
	while read -r k v; do
		case $k in
		syscr:) ps_reads=$v ;;
		syscw:) ps_writes=$v ;;
		esac
	done <"/proc/$1/io" || die "cannot read /proc/$1/io"
	[[ $ps_reads =~ ^[0-9]+$ && $ps_writes =~ ^[0-9]+$ ]] || die "no syscr/syscw in /proc/$1/io"
	ps_switches=$(cat /proc/"$1"/task/*/status 2>/dev/null | awk '/ctxt_switches:/ { n += $2 } END { print n + 0 }')
}
# machine_ticks prints the busy and the total clock ticks of all CPUs.
machine_ticks() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat; }
# children_ticks sets ticks to the CPU ticks of this shell's reaped
# children. It must not run in a subshell, whose times would see none.
children_ticks() {
	times >"$work/times"
	ticks=$(awk -v hz="$HZ" 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] } printf "%d\n", t * hz }' "$work/times")
}
# wait_quiet waits, at most QUIET_WAIT seconds, for the machine to be under
# 20% busy for a whole second, so that a run starts without a neighbour.
wait_quiet() {
	local b0 t0 b1 t1 waited=0
	while ((waited < QUIET_WAIT)); do
		read -r b0 t0 < <(machine_ticks)
		sleep 1
		read -r b1 t1 < <(machine_ticks)
		if (((b1 - b0) * 5 < (t1 - t0))); then
			if ((waited > 0)); then
				echo "  (waited ${waited}s for other work on the machine to stop)"
			fi
			return 0
		fi
		waited=$((waited + 1))
	done
	echo "  (the machine stayed busy for ${QUIET_WAIT}s: this run shares it with other work)"
}
secs() { awk -v t="$1" -v hz="$HZ" 'BEGIN { printf "%.2fs", t / hz }'; }
# field prints the value of name=value field $1 of loadgen's result line $2.
field() { awk -v k="$1=" '{ for (i = 1; i <= NF; i++) if (index($i, k) == 1) print substr($i, length(k) + 1) }' <<<"$2"; }
describe() {
	local values
	case ${l_shape[$1]} in
	plain) values="${l_size[$1]} B values" ;;
	dm) values="Mimir P2 keys (224 B), dm postings values (~3 KB)" ;;
	raw-postings) values="Mimir P2 keys (224 B), raw postings values (~23 KB)" ;;
	series) values="Mimir S keys (~185 B), series values (~300 B)" ;;
	esac
	local bg=""
	[[ -z ${l_background[$1]:-} ]] || bg=", while 4 more conns read 100-key batches of raw postings"
	awk -v l="$1" -v m="${l_multiget[$1]}" -v v="$values" -v g="${l_ratio[$1]}" -v c="${l_conns[$1]}" -v n="${l_servers[$1]}" -v k="${l_keys[$1]}" -v bg="$bg" \
		'BEGIN { printf "%s: %d-key gets, %s, %g %% gets, %d conns, %d server%s, %d keys%s\n", l, m, v, g * 100, c, n, (n > 1 ? "s" : ""), k, bg }'
}
# background_start starts load $1's background reads against address $2,
# if it has any, and returns once their clock runs; bg_tpid is their
# timeout's pid, or empty.
background_start() {
	local n=0 lpid
	bg_tpid=""
	[[ -n ${l_background[$1]:-} ]] || return 0
	rm -f "$work/background.out" "$work/background.err"
	# shellcheck disable=SC2086 # l_background holds a list of flags
	timeout "$((BG_SECS + RUN_LIMIT))" "$work/loadgen" --addr "$2" ${l_background[$1]} --duration "${BG_SECS}s" --seed "$SEED" \
		--wait-start "${RUN_LIMIT}s" >"$work/background.out" 2>"$work/background.err" &
	bg_tpid=$!
	pids+=("$bg_tpid")
	until grep -qs '^loadgen: populated' "$work/background.err"; do
		if ! kill -0 "$bg_tpid" 2>/dev/null || ((++n > RUN_LIMIT * 50)); then
			cat "$work/background.err" >&2
			die "the background reads against $2 did not start"
		fi
		sleep 0.02
	done
	lpid=$(pgrep -P "$bg_tpid") || true
	[[ $lpid =~ ^[0-9]+$ ]] || die "cannot find the pid of the background loadgen"
	kill -USR1 "$lpid"
}
# background_end waits for the background reads started last, if any,
# checks what they saw and prints their result line.
background_end() {
	local rc=0 out
	[[ -n $bg_tpid ]] || return 0
	wait "$bg_tpid" || rc=$?
	out=$(cat "$work/background.out")
	if ((rc != 0)); then
		grep -v '^loadgen: populated' "$work/background.err" | head -n 10 >&2 || true
		die "the background reads failed with status $rc (wrong values, protocol errors or a timeout): $out"
	fi
	[[ $(field wrong "$out") == 0 ]] || die "the background reads saw wrong values: $out"
	echo "  background: $out"
}
# shape_args prints load $1's loadgen flags for its keys and values, and
# for the open loop when RATE is set.
shape_args() {
	if [[ ${l_shape[$1]} == plain ]]; then
		echo "--value-size ${l_size[$1]}"
	else
		echo "--shape ${l_shape[$1]}"
	fi
	[[ -z $RATE ]] || echo "--rate $RATE"
}
# micros prints loadgen latency $1 (e.g. 231.5us) as a number of
# microseconds, or dies.
micros() {
	[[ $1 =~ ^[0-9]+(\.[0-9]+)?us$ ]] || die "loadgen reported latency '$1'"
	echo "${1%us}"
}

# measure runs loadgen for load $1 against target $2 in round $3, checks
# what it saw and records its figures.
measure() {
	local l=$1 t=$2 r=$3 inst a tpid lpid rc n out wrong requests ops
	local mc0 mc sv0 sv=0 lg lg0 busy0 total0 busy1 total1 other cpu per="" watched=false
	local t0="" r0 w0 c rd wr m0="" m1 mcr items late
	inst=$(instance "$l" "$t")
	a=${addr[$inst]}
	local mcs=("${mc_pids[@]:0:${l_servers[$l]}}")
	[[ $t == memcached ]] || watched=true
	wait_quiet
	background_start "$l" "$a"
	mc0=$(cpu_ticks "${mcs[@]}")
	$watched && sv0=$(cpu_ticks "${server_pid[$inst]}")
	children_ticks
	lg0=$ticks
	read -r busy0 total0 < <(machine_ticks)
	rm -f "$work/loadgen.out" "$work/loadgen.err"
	# shellcheck disable=SC2086 # LOADGEN_ARGS is a list of flags
	# shellcheck disable=SC2046 # shape_args prints a list of flags
	timeout "$RUN_LIMIT" "$work/loadgen" --addr "$a" --conns "${l_conns[$l]}" --duration "$DURATION" \
		$(shape_args "$l") --get-ratio "${l_ratio[$l]}" --keys "${l_keys[$l]}" --multiget "${l_multiget[$l]}" --seed "$SEED" \
		--wait-start "${RUN_LIMIT}s" $LOADGEN_ARGS >"$work/loadgen.out" 2>"$work/loadgen.err" &
	tpid=$!
	# loadgen says when its pre-population is done and waits for SIGUSR1
	# to start the clock: the server is sampled in between.
	n=0
	until grep -qs '^loadgen: populated' "$work/loadgen.err"; do
		if ! kill -0 "$tpid" 2>/dev/null || ((++n > RUN_LIMIT * 50)); then
			break
		fi
		sleep 0.02
	done
	if grep -qs '^loadgen: populated' "$work/loadgen.err"; then
		lpid=$(pgrep -P "$tpid") || true
		[[ $lpid =~ ^[0-9]+$ ]] || die "cannot find the pid of loadgen"
		if $watched; then
			proc_sample "${server_pid[$inst]}"
			t0=$ps_ticks r0=$ps_reads w0=$ps_writes s0=$ps_switches
		fi
		m0=$(cpu_ticks "${mcs[@]}")
		kill -USR1 "$lpid"
	fi
	rc=0
	wait "$tpid" || rc=$?
	if $watched; then
		proc_sample "${server_pid[$inst]}"
	fi
	m1=$(cpu_ticks "${mcs[@]}")
	out=$(grep -v '^loadgen: populated' "$work/loadgen.err" || true)
	[[ -z $out ]] || echo "$out" | head -n 10 >&2
	out=$(cat "$work/loadgen.out")
	if ((rc != 0)) || [[ -z $m0 ]]; then
		echo "round $r load $l $t: $out" >&2
		die "loadgen against $t ($a) failed with status $rc (wrong values, protocol errors or a timeout)"
	fi
	wrong=$(field wrong "$out")
	[[ $wrong == 0 ]] || die "loadgen against $t saw '$wrong' wrong values"
	requests=$(field requests "$out")
	[[ $requests =~ ^[1-9][0-9]*$ ]] || die "loadgen against $t completed '$requests' requests"
	ops=$(field ops/s "$out")
	[[ $ops =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "loadgen against $t reported ops/s '$ops'"
	results[$l,$t]+="$ops "
	items=$(field items/s "$out")
	[[ $items =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "loadgen against $t reported items/s '$items'"
	items_s[$l,$t]+="$items "
	bp50[$l,$t]+="$(micros "$(field batch_p50 "$out")") "
	bp99[$l,$t]+="$(micros "$(field batch_p99 "$out")") "
	late=$(field late "$out")
	[[ $late =~ ^[0-9]+$ ]] || die "loadgen against $t reported late '$late'"
	late_n[$l,$t]+="$late "
	mcr=$(awk -v dt=$((m1 - m0)) -v n="$requests" -v hz="$HZ" 'BEGIN { printf "%.3f", dt / hz * 1e6 / n }')
	mc_req[$l,$t]+="$mcr "
	read -r busy1 total1 < <(machine_ticks)
	children_ticks
	lg=$((ticks - lg0))
	mc=$(($(cpu_ticks "${mcs[@]}") - mc0))
	cpu="cpu: memcached=$(secs "$mc")"
	if $watched; then
		sv=$(($(cpu_ticks "${server_pid[$inst]}") - sv0))
		cpu+=" $t=$(secs "$sv")"
		read -r c rd wr cs < <(awk -v dt=$((ps_ticks - t0)) -v dr=$((ps_reads - r0)) -v dw=$((ps_writes - w0)) -v ds=$((ps_switches - s0)) -v n="$requests" -v hz="$HZ" \
			'BEGIN { printf "%.3f %.3f %.3f %.3f\n", dt / hz * 1e6 / n, dr / n, dw / n, ds / n }')
		cpu_req[$l,$t]+="$c "
		rd_req[$l,$t]+="$rd "
		wr_req[$l,$t]+="$wr "
		cs_req[$l,$t]+="$cs "
		per="  per request (timed phase only): $t cpu=${c}us reads=$rd writes=$wr context_switches=$cs; memcached cpu=${mcr}us"
	else
		per="  per request (timed phase only): memcached cpu=${mcr}us"
	fi
	cpu+=" loadgen=$(secs "$lg") (whole runs, pre-population included)"
	cpu+=" machine_busy=$(((busy1 - busy0) * 100 / (total1 - total0)))% of $NCPU CPUs"
	other=$((busy1 - busy0 - mc - sv - lg))
	cpu+=" unattributed~$(secs "$other")"
	if ((other * 100 > (total1 - total0) * 15)); then
		cpu+=" CONTENDED: over 15% of the machine went to other work"
	fi
	printf 'round %d load %d %-9s %s\n  %s\n' "$r" "$l" "$t" "$out" "$cpu"
	[[ -z $per ]] || echo "$per"
	background_end
}

echo "memcached $(memcached -V | awk '{print $2}') x$n_servers (-t $MEMCACHED_THREADS), nutcracker $(nutcracker -V 2>&1 | awk '{print $NF; exit}'), proxy; servers:"
for k in $(printf '%s\n' "${!addr[@]}" | sort); do
	printf '  %-10s %s%s\n' "$k" "${addr[$k]}" "${metrics[$k]:+ (metrics :${metrics[$k]})}"
done
echo "loads ($DURATION per run, seed $SEED; $NCPU CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)):"
for l in "${loads[@]}"; do
	echo "  $(describe "$l")"
done

for ((r = 1; r <= ROUNDS; r++)); do
	for ((li = 0; li < ${#loads[@]}; li++)); do
		l=${loads[$li]}
		for ((i = 0; i < ${#targets[@]}; i++)); do
			t=${targets[$(((i + r - 1 + li) % ${#targets[@]}))]}
			[[ -n $(instance "$l" "$t") ]] || continue
			measure "$l" "$t" "$r"
		done
		printf 'round %d load %d ops/s:' "$r" "$l"
		for t in "${targets[@]}"; do
			if [[ -n ${results[$l,$t]:-} ]]; then
				read -ra v <<<"${results[$l,$t]}"
				printf ' %s=%s' "$t" "${v[$((r - 1))]}"
			fi
		done
		printf '\n'
	done
done

median() { tr ' ' '\n' <<<"$1" | awk 'NF' | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.6f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
fmt() { awk -v v="$1" -v f="$2" 'BEGIN { printf f, v }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "n/a" }'; }

for p in "${proxies[@]}"; do
	up_errors=$(curl -fsS --max-time 5 "http://127.0.0.1:${metrics[$p]}/metrics" | awk '/^mcsidecar_upstream_errors_total[{ ]/ { n += $NF; seen = 1 } END { if (seen) print n }')
	echo "$p upstream errors over all rounds: ${up_errors:-unknown}"
done
echo
echo "medians over $ROUNDS round(s) of $DURATION; CPU and system calls of the twemproxy and proxy processes over the timed phase, per loadgen request:"
echo
echo "| load | memcached ops/s | twemproxy ops/s | proxy ops/s | proxy/twemproxy | CPU µs/req twemproxy | CPU µs/req proxy | ratio | reads+writes/req twemproxy | reads+writes/req proxy | context switches/req twemproxy | context switches/req proxy |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for l in "${loads[@]}"; do
	if [[ -n ${results[$l,memcached]:-} ]]; then
		m_mc=$(fmt "$(median "${results[$l,memcached]}")" '%.0f')
	else
		m_mc=n/a
	fi
	m_tw=$(median "${results[$l,twemproxy]}")
	m_px=$(median "${results[$l,proxy]}")
	c_tw=$(median "${cpu_req[$l,twemproxy]}")
	c_px=$(median "${cpu_req[$l,proxy]}")
	printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s + %s | %s + %s | %s | %s |\n' "$(describe "$l")" "$m_mc" \
		"$(fmt "$m_tw" '%.0f')" "$(fmt "$m_px" '%.0f')" "$(ratio "$m_px" "$m_tw")" \
		"$(fmt "$c_tw" '%.2f')" "$(fmt "$c_px" '%.2f')" "$(ratio "$c_px" "$c_tw")" \
		"$(fmt "$(median "${rd_req[$l,twemproxy]}")" '%.2f')" "$(fmt "$(median "${wr_req[$l,twemproxy]}")" '%.2f')" \
		"$(fmt "$(median "${rd_req[$l,proxy]}")" '%.2f')" "$(fmt "$(median "${wr_req[$l,proxy]}")" '%.2f')" \
		"$(fmt "$(median "${cs_req[$l,twemproxy]}")" '%.2f')" "$(fmt "$(median "${cs_req[$l,proxy]}")" '%.2f')"
done

echo
if [[ -n $RATE ]]; then
	mode="open loop at $RATE requests/s (latency from when each request was due; late: requests sent over 1 ms after)"
else
	mode="closed loop"
fi
echo "medians over $ROUNDS round(s) of $DURATION, $mode; items: values read (hits) or written (sets);"
echo "CPU over the timed phase per request: memcached's when loadgen talks to it, else twemproxy's or the proxy's + the memcached's behind it; batch: a get of all its keys:"
echo
hdr="| load | items/s memcached | items/s twemproxy | items/s proxy | CPU µs/req memcached | CPU µs/req twemproxy | CPU µs/req proxy | batch p50 / p99 µs memcached | batch p50 / p99 µs twemproxy | batch p50 / p99 µs proxy |"
sep="|---|---|---|---|---|---|---|---|---|---|"
if [[ -n $RATE ]]; then
	hdr+=" late memcached / twemproxy / proxy |"
	sep+="---|"
fi
echo "$hdr"
echo "$sep"
# cell prints the median of figures $1 in format $2, or n/a when there
# are none.
cell() {
	if [[ -n $1 ]]; then
		fmt "$(median "$1")" "$2"
	else
		echo n/a
	fi
}
for l in "${loads[@]}"; do
	row="| $(describe "$l") |"
	for t in "${targets[@]}"; do
		row+=" $(cell "${items_s[$l,$t]:-}" '%.0f') |"
	done
	row+=" $(cell "${mc_req[$l,memcached]:-}" '%.2f') |"
	for t in twemproxy proxy; do
		row+=" $(cell "${cpu_req[$l,$t]:-}" '%.2f') + $(cell "${mc_req[$l,$t]:-}" '%.2f') |"
	done
	for t in "${targets[@]}"; do
		if [[ -n ${bp50[$l,$t]:-} ]]; then
			row+=" $(cell "${bp50[$l,$t]}" '%.0f') / $(cell "${bp99[$l,$t]}" '%.0f') |"
		else
			row+=" n/a |"
		fi
	done
	if [[ -n $RATE ]]; then
		row+=" $(cell "${late_n[$l,memcached]:-}" '%.0f') / $(cell "${late_n[$l,twemproxy]:-}" '%.0f') / $(cell "${late_n[$l,proxy]:-}" '%.0f') |"
	fi
	echo "$row"
done

# spread prints the median, lowest and highest of the ratios of the
# figures $1 to the figures $2, round by round.
spread() {
	local r
	r=$(paste -d' ' <(tr ' ' '\n' <<<"$1" | awk 'NF') <(tr ' ' '\n' <<<"$2" | awk 'NF') | awk '$2 > 0 { print $1 / $2 }' | sort -g)
	if [[ -z $r ]]; then
		echo n/a
		return
	fi
	printf '%s (%s–%s)' "$(fmt "$(median "$r")" '%.2f')" "$(fmt "$(head -1 <<<"$r")" '%.2f')" "$(fmt "$(tail -1 <<<"$r")" '%.2f')"
}
# The same comparisons round by round: each round's twemproxy and proxy
# runs came back to back, on the machine as it was then, so their ratio
# is steadier than the ratio of medians above when the machine's speed
# drifts between rounds.
echo
echo "proxy / twemproxy in each round: median of the $ROUNDS rounds' ratios (lowest–highest):"
echo
echo "| load | throughput | CPU µs/req | batch p99 |"
echo "|---|---|---|---|"
for l in "${loads[@]}"; do
	echo "| $(describe "$l") | $(spread "${results[$l,proxy]}" "${results[$l,twemproxy]}") | $(spread "${cpu_req[$l,proxy]:-}" "${cpu_req[$l,twemproxy]:-}") | $(spread "${bp99[$l,proxy]:-}" "${bp99[$l,twemproxy]:-}") |"
done
