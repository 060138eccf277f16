#!/bin/sh
# install.sh installs nvpair-workload-manager on a PAIR node (Linux or
# macOS), checks it, and rolls it back. Windows: scripts/install.ps1.
#
#   sh scripts/install.sh install NEW-EXECUTABLE   replace the running worker, check, roll back on failure
#   sh scripts/install.sh check                     post a check job through the ingress and close it
#   sh scripts/install.sh rollback                  put the stock executable back and restart the worker
#
# Options (before or after the command):
#   --app-dir DIR        PAIR's app dir (default: the platform's, as the daemon finds it)
#   --listen HOST:PORT   the ingress address written to workload-ingress.json when
#                        that file does not exist yet (default 127.0.0.1:14324)
#   --timeout SECONDS    how long to wait for the restarted worker (default 60)
#
# PAIR's back end (the broker) runs the worker as
#   nvpair-workload-manager --log-level LEVEL --cluster-dir APP-DIR/cluster
# and starts it again when it exits. This script finds that process by its
# --cluster-dir and acts on it only once it is proven PAIR's workload
# manager (its executable answers --version as this project, or as the
# stock build with PAIR's broker as its parent; else it changes nothing
# and says why), resolves its real executable (/proc/PID/exe on Linux; ps or
# lsof on macOS), keeps the stock executable beside it as EXE.stock (once:
# an existing backup is never overwritten), moves the new one into place
# with a rename in the same directory, and stops the worker so the broker
# starts the new one. It exits 0 only when the check passed; when the check
# fails it puts the stock executable back, restarts the worker and exits 1.
set -eu

prog=install.sh
listen_default=127.0.0.1:14324
timeout=60
app_dir=""
listen=""
cmd=""
new_exe=""

say() { printf '%s: %s\n' "$prog" "$*"; }
die() { printf '%s: %s\n' "$prog" "$*" >&2; exit 1; }
usage() {
	printf 'usage: sh %s install NEW-EXECUTABLE | check | rollback [--app-dir DIR] [--listen HOST:PORT] [--timeout SECONDS]\n' "$prog" >&2
	exit 2
}

while [ $# -gt 0 ]; do
	case $1 in
	--app-dir) [ $# -ge 2 ] || usage; app_dir=$2; shift 2 ;;
	--app-dir=*) app_dir=${1#--app-dir=}; shift ;;
	--listen) [ $# -ge 2 ] || usage; listen=$2; shift 2 ;;
	--listen=*) listen=${1#--listen=}; shift ;;
	--timeout) [ $# -ge 2 ] || usage; timeout=$2; shift 2 ;;
	--timeout=*) timeout=${1#--timeout=}; shift ;;
	-h | --help) usage ;;
	-*) printf '%s: unknown option %s\n' "$prog" "$1" >&2; usage ;;
	*)
		if [ -z "$cmd" ]; then
			cmd=$1
		elif [ "$cmd" = install ] && [ -z "$new_exe" ]; then
			new_exe=$1
		else
			printf '%s: unexpected argument %s\n' "$prog" "$1" >&2
			usage
		fi
		shift
		;;
	esac
done
case $timeout in '' | *[!0-9]*) printf '%s: --timeout %s: want whole seconds\n' "$prog" "$timeout" >&2; usage ;; esac

# The platform's PAIR app dir, as the daemon and PAIR find it.
if [ -z "$app_dir" ]; then
	case $(uname -s) in
	Darwin) app_dir="$HOME/Library/Application Support/Nvidia Corporation/NVIDIA PAIR" ;;
	*) app_dir="${XDG_CONFIG_HOME:-$HOME/.config}/Nvidia Corporation/NVIDIA PAIR" ;;
	esac
fi
[ -d "$app_dir" ] || die "no PAIR app dir at $app_dir (is PAIR installed for this user? else give --app-dir)"
cluster_dir="$app_dir/cluster"
# record holds the path of the executable install replaced, for a rollback
# when no worker runs from it.
record="$app_dir/nvpair-workload-manager.installed-at"

# worker_pids prints the pid of every process whose arguments pass
# --cluster-dir with this node's cluster dir: the worker the broker runs.
worker_pids() {
	ps -ww -A -o pid= -o args= | awk -v want="$cluster_dir" -v self="$$" '
	{
		pid = $1
		if (pid == self) next
		line = $0
		sub(/^[ \t]*[0-9]+[ \t]+/, "", line)
		for (;;) {
			i = index(line, "--cluster-dir")
			if (i == 0) break
			rest = substr(line, i + length("--cluster-dir") + 1)
			if (index(rest, want) == 1) {
				after = substr(rest, length(want) + 1, 1)
				if (after == "" || after == " ") { print pid; break }
			}
			line = substr(line, i + 1)
		}
	}'
}

# worker_pid prints the pid of the one worker proven to be PAIR's workload
# manager (is_wlm). It returns 1, saying nothing, when no process passes
# --cluster-dir; when some do but none or several is proven, it says why
# on stderr, in one line, and returns 2. A process that is not proven is
# never acted on: any process of this user can pass --cluster-dir.
worker_pid() {
	pids=$(worker_pids)
	[ -n "$pids" ] || return 1
	proven=""
	why=""
	for p in $pids; do
		if r=$(is_wlm "$p"); then proven="$proven $p"; else why=$r; fi
	done
	# shellcheck disable=SC2086 # one word per pid
	set -- $proven
	case $# in
	1) printf '%s\n' "$1" ;;
	0)
		printf '%s: %s; nothing changed\n' "$prog" "$why" >&2
		return 2
		;;
	*)
		printf '%s: several workload managers run with --cluster-dir %s:%s; nothing changed\n' "$prog" "$cluster_dir" "$proven" >&2
		return 2
		;;
	esac
}

# the_worker prints the one proven worker's pid, or exits 1 saying why:
# "no running worker" only when no process passes --cluster-dir at all.
the_worker() {
	rc=0
	w=$(worker_pid) || rc=$?
	case $rc in
	0) printf '%s\n' "$w" ;;
	1) die "no running worker with --cluster-dir $cluster_dir (is PAIR running?)" ;;
	*) exit 1 ;;
	esac
}

# is_wlm PID succeeds when the process is PAIR's workload manager: its
# executable answers --version as this project does ("nvpair-workload-manager
# VERSION GO OS/ARCH"), or answers one word, as the stock build prints its
# bare version, and its parent is PAIR's broker (nvpair-ui-broker).
# Otherwise it prints why not.
is_wlm() {
	x=$(exe_of "$1") || {
		printf 'pid %s passes --cluster-dir %s, but its executable cannot be resolved' "$1" "$cluster_dir"
		return 1
	}
	v=$(version_of "$x")
	case $v in "nvpair-workload-manager "*) return 0 ;; esac
	parent=$(parent_name "$1")
	case $v in
	"" | *[!A-Za-z0-9._+-]*) ;;
	*) [ "$parent" != nvpair-ui-broker ] || return 0 ;;
	esac
	printf "pid %s passes --cluster-dir %s but is not PAIR's workload manager: %s --version answers \"%s\", and its parent (%s) is not PAIR's broker" \
		"$1" "$cluster_dir" "$x" "$(printf '%s' "$v" | cut -c 1-80)" "${parent:-unknown}"
	return 1
}

# version_of EXE prints the first line EXE --version answers within 5 s
# (nothing when it does not): a stand-in that hangs must not hang the script.
version_of() {
	vout=$(mktemp) || return 0
	"$1" --version </dev/null >"$vout" 2>/dev/null &
	vpid=$!
	(
		sleep 5
		kill -KILL "$vpid" 2>/dev/null
	) &
	wpid=$!
	wait "$vpid" 2>/dev/null || true
	kill "$wpid" 2>/dev/null || true
	head -n 1 "$vout"
	rm -f "$vout"
}

# parent_name PID prints the base name of the executable of the process's
# parent (the broker runs the worker), or nothing.
parent_name() {
	pp=$(ps -o ppid= -p "$1" 2>/dev/null | tr -d ' ') || return 0
	[ -n "$pp" ] || return 0
	pe=$(exe_of "$pp" 2>/dev/null) || return 0
	basename "$pe" .exe
}

# exe_of PID prints the real path of the process's executable.
exe_of() {
	if [ -e "/proc/$1/exe" ]; then
		p=$(readlink "/proc/$1/exe") || return 1
		printf '%s\n' "${p% (deleted)}"
		return 0
	fi
	p=$(ps -o comm= -p "$1" 2>/dev/null) || return 1
	case $p in
	/*) printf '%s\n' "$p" ;;
	*)
		# macOS's comm is the path the process was started with; a
		# relative one is resolved by lsof from the open executable.
		command -v lsof >/dev/null 2>&1 || return 1
		lsof -a -p "$1" -d txt -Fn 2>/dev/null | sed -n 's/^n//p' | head -n 1
		;;
	esac
}

# running_from PID EXE succeeds when PID runs the file now at EXE (not one
# that was replaced: Linux marks that one "(deleted)").
running_from() {
	if [ -e "/proc/$1/exe" ]; then
		[ "$(readlink "/proc/$1/exe" 2>/dev/null)" = "$2" ]
	else
		[ "$(exe_of "$1" 2>/dev/null)" = "$2" ]
	fi
}

# stop_worker PID stops the worker (SIGTERM, SIGKILL after 15 s) and
# waits until it has exited: the broker then starts the executable anew.
stop_worker() {
	kill -TERM "$1" 2>/dev/null || return 0
	n=0
	while kill -0 "$1" 2>/dev/null; do
		n=$((n + 1))
		if [ "$n" -eq 150 ]; then kill -KILL "$1" 2>/dev/null || true; fi
		[ "$n" -lt 200 ] || die "worker $1 did not exit"
		sleep 0.1
	done
}

# wait_restarted OLD-PID EXE waits until the broker runs a new worker from
# EXE, and prints its pid. A process running the file just installed (or
# put back) is the worker: the script knows what that file is.
wait_restarted() {
	end=$(($(date +%s) + timeout))
	while [ "$(date +%s)" -le "$end" ]; do
		for p in $(worker_pids); do
			if [ "$p" != "$1" ] && running_from "$p" "$2"; then
				printf '%s\n' "$p"
				return 0
			fi
		done
		sleep 0.2
	done
	return 1
}

# node_id prints this node's id as the daemon resolves it: the cluster
# manager's cluster/identity.json when it exists, else node-id.json in the
# app dir, else the bare node-id file of earlier versions. A file that
# exists but names no UUID is an error, as it is for the daemon.
uuid_re='^[0-9a-fA-F]\{8\}-[0-9a-fA-F]\{4\}-[0-9a-fA-F]\{4\}-[0-9a-fA-F]\{4\}-[0-9a-fA-F]\{12\}$'
node_id() {
	for f in "$cluster_dir/identity.json" "$app_dir/node-id.json"; do
		[ -e "$f" ] || continue
		id=$(tr -d '\n\r' <"$f" | sed -n 's/.*"node_uuid"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p')
		printf '%s\n' "$id" | grep -q "$uuid_re" || die "$f names no node_uuid that is a UUID (the daemon refuses to start on it too)"
		printf '%s\n' "$id"
		return 0
	done
	f="$app_dir/node-id"
	if [ -e "$f" ]; then
		id=$(tr -d ' \n\r\t' <"$f")
		printf '%s\n' "$id" | grep -q "$uuid_re" || die "$f is not a UUID"
		printf '%s\n' "$id"
		return 0
	fi
	die "no node id yet: neither $cluster_dir/identity.json nor $app_dir/node-id.json exists (the daemon writes node-id.json when it starts)"
}

# ingress_addr prints the ingress address workload-ingress.json names.
ingress_addr() {
	f="$app_dir/workload-ingress.json"
	[ -e "$f" ] || die "$f does not exist: the ingress is off (install writes it; or write {\"listen\": \"$listen_default\"} there and restart the worker)"
	a=$(tr -d '\n\r' <"$f" | sed -n 's/.*"listen"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p')
	[ -n "$a" ] || die "$f names no listen address"
	printf '%s\n' "$a"
}

# ensure_ingress_file writes workload-ingress.json when it is missing, so the
# new worker's first start serves the ingress the check posts to.
ensure_ingress_file() {
	f="$app_dir/workload-ingress.json"
	if [ -e "$f" ]; then
		[ -z "$listen" ] || say "keeping the existing $f ($(ingress_addr)); --listen is used only when it is missing"
		return 0
	fi
	printf '{"listen": "%s"}\n' "${listen:-$listen_default}" >"$f.tmp.$$"
	mv -f "$f.tmp.$$" "$f"
	say "wrote $f: the ingress listens on ${listen:-$listen_default}"
}

# post URL BODY posts one frame and prints the answer; a non-2xx answer is
# a failure (curl -f), with the daemon's one-line reason on stderr.
post() {
	out=$(curl -sS --fail-with-body --max-time 10 -X POST "$1" -H 'Content-Type: application/json' --data-binary "$2" 2>&1) || {
		printf '%s: the ingress refused the check: %s\n' "$prog" "$out" >&2
		return 1
	}
	printf '%s\n' "$out"
}

# frame METHOD STATE SEQ ID NODE STARTED [COMPLETED] prints a check job's
# frame (times in epoch ms; a running job has no completedAt).
frame() {
	printf '{"jsonrpc":"2.0","method":"%s","params":{"workloadInfo":{"id":"%s","runId":"%s","model":"install-check","engine":"install-check","state":"%s","originatedFrom":"%s","scheduledOn":null,"seq":%s,"createdAt":%s,"startedAt":%s,"completedAt":%s,"error":null,"requesterId":"install-check"}}}' \
		"$1" "$4" "$4" "$2" "$5" "$3" "$6" "$6" "${7:-null}"
}

# check posts a check job through the ingress, naming this node's id as
# the daemon reads it, reads it back, and closes it. It waits up to the
# timeout for the ingress to answer first (the worker may just have
# started).
check() {
	# check runs as a condition (if check, check ||), where sh ignores set -e:
	# every failure below returns explicitly. An empty id would not fail the
	# post (the ingress stamps its own id), so a check that could not read
	# the node's id must never get that far.
	node=$(node_id) || return 1
	addr=$(ingress_addr) || return 1
	base="http://$addr"
	end=$(($(date +%s) + timeout))
	until curl -sf --max-time 5 -o /dev/null -H 'Workload-Read-Back: 1' "$base/v1/workloads?requesterId=install-check&limit=1" 2>/dev/null; do
		if [ "$(date +%s)" -gt "$end" ]; then
			printf '%s: the ingress at %s did not answer within %s s\n' "$prog" "$addr" "$timeout" >&2
			return 1
		fi
		sleep 0.2
	done
	started=$(date +%s)000
	job="install-check-$(date +%s)-$$"
	post "$base/v1/workloads/events" "$(frame workload:started running 1 "$job" "$node" "$started")" >/dev/null || return 1
	shown=$(curl -sS --fail-with-body --max-time 10 -H 'Workload-Read-Back: 1' "$base/v1/workloads?requesterId=install-check&limit=10000" 2>&1) || {
		printf '%s: the read-back failed: %s\n' "$prog" "$shown" >&2
		return 1
	}
	case $shown in
	*"\"$job\""*) ;;
	*)
		printf '%s: the node does not show the check job %s: %s\n' "$prog" "$job" "$shown" >&2
		return 1
		;;
	esac
	post "$base/v1/workloads/events" "$(frame workload:completed completed 2 "$job" "$node" "$started" "$(date +%s)000")" >/dev/null || return 1
	say "check passed: node $node took job $job through $addr and closed it"
}

# put_stock_back moves the stock executable back into place and restarts
# the worker on it.
put_stock_back() {
	exe=$1
	[ -e "$exe.stock" ] || die "no stock executable at $exe.stock to roll back to"
	cp -p "$exe.stock" "$exe.rollback.$$"
	mv -f "$exe.rollback.$$" "$exe"
	if pid=$(worker_pid 2>/dev/null); then
		stop_worker "$pid"
	else
		pid=none
	fi
	if newpid=$(wait_restarted "$pid" "$exe"); then
		say "rolled back: the broker runs the stock executable $exe again (pid $newpid)"
	else
		die "rolled back $exe, but the broker started no worker from it within $timeout s"
	fi
}

# stock_exe prints the executable to roll back: the running worker's when
# a stock copy sits beside it, else the one the last install recorded (the
# worker may be a new executable that fails at start, or none at all).
stock_exe() {
	if pid=$(worker_pid 2>/dev/null) && exe=$(exe_of "$pid") && [ -e "$exe.stock" ]; then
		printf '%s\n' "$exe"
		return 0
	fi
	[ -e "$record" ] || die "no stock executable recorded in $record and none beside the running worker (was this node installed with this script?)"
	cat "$record"
}

case $cmd in
install)
	[ -n "$new_exe" ] || usage
	[ -f "$new_exe" ] || die "$new_exe: no such file"
	ver=$("$new_exe" --version 2>&1) || die "$new_exe does not run on this machine: $ver"
	pid=$(the_worker) || exit 1
	exe=$(exe_of "$pid") || die "cannot resolve the executable of worker $pid"
	[ -f "$exe" ] || die "worker $pid runs $exe, which is not a file"
	say "worker $pid runs $exe"
	printf '%s\n' "$exe" >"$record"
	if [ -e "$exe.stock" ]; then
		say "keeping the stock executable already saved at $exe.stock"
	else
		cp -p "$exe" "$exe.stock.tmp.$$"
		mv "$exe.stock.tmp.$$" "$exe.stock"
		say "saved the stock executable as $exe.stock"
	fi
	ensure_ingress_file
	cp "$new_exe" "$exe.new.$$"
	chmod 755 "$exe.new.$$"
	mv -f "$exe.new.$$" "$exe"
	say "installed $ver as $exe; stopping worker $pid so the broker starts it"
	stop_worker "$pid"
	if newpid=$(wait_restarted "$pid" "$exe"); then
		if check; then
			say "installed: worker $newpid runs $exe"
			exit 0
		fi
	else
		printf '%s: the broker ran no worker from %s within %s s\n' "$prog" "$exe" "$timeout" >&2
	fi
	printf '%s: the new executable failed its check; rolling back to %s.stock\n' "$prog" "$exe" >&2
	put_stock_back "$exe"
	exit 1
	;;
check)
	check || exit 1
	;;
rollback)
	exe=$(stock_exe) || exit 1
	put_stock_back "$exe"
	;;
*) usage ;;
esac
