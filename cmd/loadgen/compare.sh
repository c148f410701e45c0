#!/usr/bin/env bash
# compare.sh measures the sidecar proxy against memcached itself and against
# twemproxy (nutcracker), all on loopback in front of one memcached. The same
# loadgen load runs against each in turn, round by round, with the order
# rotated every round so that no target always goes first; at the end it
# prints the median throughput of each and their ratios. Any wrong value or
# protocol error seen by loadgen fails the script.
#
# Usage: cmd/loadgen/compare.sh [ROUNDS]
# Environment (defaults in brackets):
#   ROUNDS [3]  DURATION [10s]  CONNS [32]  VALUE_SIZE [1024]  GET_RATIO [0.9]
#   KEYS [10000]  MULTIGET [1]  SEED [1]  MEMCACHED_THREADS [2]
#   LOADGEN_ARGS []: more loadgen flags, passed as they are
#   PROXY_ARGS []: more proxy flags, e.g. --upstream-timeout 1s
#   QUIET_WAIT [30]: longest wait, in seconds, before each run for the
#     machine to fall quiet (other work would skew the numbers)
set -euo pipefail

ROUNDS=${1:-${ROUNDS:-3}}
DURATION=${DURATION:-10s}
CONNS=${CONNS:-32}
VALUE_SIZE=${VALUE_SIZE:-1024}
GET_RATIO=${GET_RATIO:-0.9}
KEYS=${KEYS:-10000}
MULTIGET=${MULTIGET:-1}
SEED=${SEED:-1}
MEMCACHED_THREADS=${MEMCACHED_THREADS:-2}
LOADGEN_ARGS=${LOADGEN_ARGS:-}
PROXY_ARGS=${PROXY_ARGS:-}

die() { echo "compare: $*" >&2; exit 1; }

[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive number, not '$ROUNDS'"
for bin in go memcached nutcracker ss awk curl; do
	command -v "$bin" >/dev/null || die "$bin is not installed"
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
QUIET_WAIT=${QUIET_WAIT:-30}
[[ $QUIET_WAIT =~ ^[0-9]+$ ]] || die "QUIET_WAIT must be a number of seconds, not '$QUIET_WAIT'"
# Each server runs under timeout too, so that it stops by itself even if
# this script is killed before its trap can run.
SERVER_LIMIT=$((ROUNDS * 3 * (RUN_LIMIT + QUIET_WAIT + 10) + 120))

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

echo "building proxy and loadgen in $work from $(git -C "$root" describe --always --dirty 2>/dev/null || echo "an unknown revision")"
(cd "$root" && go build -o "$work/proxy" ./cmd/proxy && go build -o "$work/loadgen" ./cmd/loadgen)

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
# the first. It sets started_port, started_port2 and started_pid, the
# server's own pid (its parent is the timeout that bounds its life).
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
		if [[ $name == nutcracker ]]; then
			write_nutcracker_conf "$p"
			nutcracker -t -c "$work/nutcracker.yml" >"$work/nutcracker-test.log" 2>&1 ||
				die "nutcracker rejects its config: $(cat "$work/nutcracker-test.log")"
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

write_nutcracker_conf() {
	cat >"$work/nutcracker.yml" <<-EOF
		mc:
		  listen: 127.0.0.1:$1
		  hash: fnv1a_64
		  distribution: ketama
		  timeout: 1000
		  redis: false
		  auto_eject_hosts: false
		  server_connections: 1
		  servers:
		    - 127.0.0.1:$MC_PORT:1
	EOF
}

start memcached memcached -l 127.0.0.1 -p PORT -U 0 -u nobody -t "$MEMCACHED_THREADS" -m 512 -c 4096
MC_PORT=$started_port MC_PID=$started_pid
start nutcracker nutcracker -c "$work/nutcracker.yml" -s PORT2 -a 127.0.0.1 -o "$work/nutcracker.out"
TW_PORT=$started_port TW_STATS=$started_port2 TW_PID=$started_pid
# shellcheck disable=SC2086 # PROXY_ARGS is a list of flags
start proxy "$work/proxy" --listen 127.0.0.1:PORT --upstream "127.0.0.1:$MC_PORT" --metrics-listen 127.0.0.1:PORT2 --log-level warn $PROXY_ARGS
PX_PORT=$started_port PX_METRICS=$started_port2 PX_PID=$started_pid
curl -fsS --max-time 5 "http://127.0.0.1:$PX_METRICS/readyz" >/dev/null || die "proxy is not ready"

targets=(memcached twemproxy proxy)
declare -A addr=([memcached]="127.0.0.1:$MC_PORT" [twemproxy]="127.0.0.1:$TW_PORT" [proxy]="127.0.0.1:$PX_PORT")
declare -A server_pid=([memcached]=$MC_PID [twemproxy]=$TW_PID [proxy]=$PX_PID)
declare -A results=()

# The machine is small and may be shared, so each run reports where the CPU
# went: the servers' own time, loadgen's (as this shell's reaped children),
# and how busy the whole machine was. Busy time nobody here accounts for is
# other work on the machine or kernel time charged to no process; the two
# sources are sampled differently, so it is only good to a few tenths of a
# second and may even come out slightly negative.
HZ=$(getconf CLK_TCK)
NCPU=$(nproc)
# cpu_ticks prints the user+system clock ticks process $1 has used.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
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

echo "memcached $(memcached -V | awk '{print $2}') on ${addr[memcached]} (-t $MEMCACHED_THREADS), nutcracker $(nutcracker -V 2>&1 | awk '{print $NF; exit}') on ${addr[twemproxy]}, proxy on ${addr[proxy]} (metrics :$PX_METRICS)"
echo "load: $CONNS conns, $DURATION, value $VALUE_SIZE B, get ratio $GET_RATIO, $KEYS keys, $MULTIGET keys per get, seed $SEED; $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"

for ((r = 1; r <= ROUNDS; r++)); do
	for ((i = 0; i < ${#targets[@]}; i++)); do
		t=${targets[$(((i + r - 1) % ${#targets[@]}))]}
		wait_quiet
		mc0=$(cpu_ticks "$MC_PID")
		sv0=$(cpu_ticks "${server_pid[$t]}")
		children_ticks
		lg0=$ticks
		read -r busy0 total0 < <(machine_ticks)
		# shellcheck disable=SC2086 # LOADGEN_ARGS is a list of flags
		if ! out=$(timeout "$RUN_LIMIT" "$work/loadgen" --addr "${addr[$t]}" --conns "$CONNS" --duration "$DURATION" \
			--value-size "$VALUE_SIZE" --get-ratio "$GET_RATIO" --keys "$KEYS" --multiget "$MULTIGET" --seed "$SEED" \
			$LOADGEN_ARGS 2>"$work/loadgen.err"); then
			echo "round $r $t: $out" >&2
			head -n 10 "$work/loadgen.err" >&2
			die "loadgen against $t failed (wrong values, protocol errors or a timeout)"
		fi
		wrong=$(awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^wrong=/) { sub(/^wrong=/, "", $i); print $i } }' <<<"$out")
		[[ $wrong == 0 ]] || die "loadgen against $t saw $wrong wrong values"
		ops=$(awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^ops\/s=/) { sub(/^ops\/s=/, "", $i); print $i } }' <<<"$out")
		results[$t]+="$ops "
		read -r busy1 total1 < <(machine_ticks)
		children_ticks
		lg=$((ticks - lg0))
		mc=$(($(cpu_ticks "$MC_PID") - mc0))
		sv=0
		cpu="cpu: memcached=$(secs "$mc")"
		if [[ $t != memcached ]]; then
			sv=$(($(cpu_ticks "${server_pid[$t]}") - sv0))
			cpu+=" $t=$(secs "$sv")"
		fi
		cpu+=" loadgen=$(secs "$lg") (pre-population included)"
		cpu+=" machine_busy=$(((busy1 - busy0) * 100 / (total1 - total0)))% of $NCPU CPUs"
		other=$((busy1 - busy0 - mc - sv - lg))
		cpu+=" unattributed~$(secs "$other")"
		if ((other * 100 > (total1 - total0) * 15)); then
			cpu+=" CONTENDED: over 15% of the machine went to other work"
		fi
		printf 'round %d %-9s %s\n  %s\n' "$r" "$t" "$out" "$cpu"
	done
	printf 'round %d ops/s:' "$r"
	for t in "${targets[@]}"; do
		read -ra v <<<"${results[$t]}"
		printf ' %s=%s' "$t" "${v[$((r - 1))]}"
	done
	printf '\n'
done

median() { tr ' ' '\n' <<<"$1" | awk 'NF' | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
m_mc=$(median "${results[memcached]}")
m_tw=$(median "${results[twemproxy]}")
m_px=$(median "${results[proxy]}")
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }

up_errors=$(curl -fsS --max-time 5 "http://127.0.0.1:$PX_METRICS/metrics" | awk '/^mcsidecar_upstream_errors_total[{ ]/ { n += $NF; seen = 1 } END { if (seen) print n }')
echo "proxy upstream errors over all rounds: ${up_errors:-unknown}"
echo "median ops/s over $ROUNDS rounds: memcached=$m_mc twemproxy=$m_tw proxy=$m_px"
echo "ratios: proxy/memcached=$(ratio "$m_px" "$m_mc") twemproxy/memcached=$(ratio "$m_tw" "$m_mc") proxy/twemproxy=$(ratio "$m_px" "$m_tw")"
