#!/usr/bin/env bash
# stress.sh — `make test` several times in a row, each in a fresh clone of
# HEAD, while a CPU burner keeps every core busy: no test may fail because
# the machine is slow (docs/testing.md).
#
#   scripts/stress.sh            # 3 runs of HEAD, one busy loop per core
#   RUNS=1 BURNERS=4 REV=main scripts/stress.sh
#
# Every run tests the same commit (REV, resolved once at the start), so the
# runs are "in a row" even while others commit.
# The burner is a shell busy loop per core at the suite's own priority, so
# the suite gets about half of each core — no package to install. Each run's
# output goes to tmp/stress/run-N.log; the script prints each run's wall
# time and exit status and stops at the first failure.
set -uo pipefail

runs="${RUNS:-3}"
burners="${BURNERS:-$(nproc)}"
root="$(git rev-parse --show-toplevel)"
rev="$(git -C "$root" rev-parse "${REV:-HEAD}")"
out="$root/tmp/stress"
mkdir -p "$out"

pids=()
stop_burners() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; }
trap stop_burners EXIT
for _ in $(seq "$burners"); do
	bash -c 'while :; do :; done' &
	pids+=("$!")
done
echo "stress: $burners busy loops started; $runs runs of make test at ${rev:0:7}"

for n in $(seq "$runs"); do
	clone="$(mktemp -d)"
	git clone -q "$root" "$clone" && git -C "$clone" checkout -q "$rev"
	start=$(date +%s)
	(cd "$clone" && make test) >"$out/run-$n.log" 2>&1
	status=$?
	wall=$(( $(date +%s) - start ))
	echo "stress: run $n: exit $status after ${wall}s (load $(cut -d' ' -f1-3 /proc/loadavg)); log $out/run-$n.log"
	rm -rf "$clone"
	if [ "$status" -ne 0 ]; then
		grep -E '^(--- FAIL|FAIL|TIMEOUT)' "$out/run-$n.log" | head -20
		exit "$status"
	fi
done
