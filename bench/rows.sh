#!/usr/bin/env bash
# Every row of the benchmark page's fleet-scale table, with the page's own commands: prints
# figures, asserts nothing. Each bench's output goes to OUT/<row>.txt (default: a new
# directory under /tmp), and the SUMMARY lines are gathered at the end.
#
#     DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/10 \
#         bench/rows.sh [row ...]
#     bench/rows.sh --list [row ...]      # each row's command, one a line; runs nothing
#
# With no row names it runs them all, one after the other (about an hour on an idle 2-core
# machine: the 10,000-worker rows and the end-to-end bench at 2,000 workers are most of it).
# Run it on an otherwise idle machine: every bench alternates ours and the bare baseline, so
# a busy spell hits both, but wall-time ratios still spread more on a loaded machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python

declare -A ROWS=(
  [gate_api]="bench/gate_api.py --runs 5"
  [ws_fleet]="bench/ws_fanout.py --subscribers 500 2000 --runs 5"
  [ws_gates_10k]="bench/ws_fanout.py --stream gates --subscribers 10000 --runs 2 --events 10"
  [discovery_2k]="bench/discovery.py --workers 2000 --repetitions 5"
  [discovery_10k]="bench/discovery.py --workers 10000 --repetitions 2"
  [refresh_500]="bench/policy_refresh.py --workers 500 --repetitions 5"
  [refresh_10k]="bench/policy_refresh.py --workers 10000 --repetitions 2"
  [end_to_end_500]="bench/end_to_end.py --workers 500 --repetitions 5"
  [end_to_end_2k]="bench/end_to_end.py --workers 2000 --repetitions 5"
  [new_paths]="bench/new_paths.py --workers 100,2000 --runs 5"
  [fleet_map_10k]="bench/fleet_map.py --workers 10000 --runs 5"
  [memory]="bench/memory.py --workers 2000 10000"
)
ORDER=(refresh_500 end_to_end_500 discovery_2k gate_api ws_fleet new_paths fleet_map_10k
  end_to_end_2k discovery_10k refresh_10k ws_gates_10k memory)

# Running them all means running every row: a row in one list and not the other is refused.
declare -A ordered=()
for row in "${ORDER[@]}"; do
  [[ -v "ROWS[$row]" ]] || { echo "rows.sh: $row is in ORDER but not in ROWS" >&2; exit 2; }
  [[ ! -v "ordered[$row]" ]] || { echo "rows.sh: $row is twice in ORDER" >&2; exit 2; }
  ordered[$row]=1
done
for row in "${!ROWS[@]}"; do
  [[ -v "ordered[$row]" ]] || { echo "rows.sh: $row is in ROWS but not in ORDER" >&2; exit 2; }
done

list=false
if [[ "${1:-}" == "--list" ]]; then
  list=true
  shift
fi
rows=("$@")
[[ ${#rows[@]} -gt 0 ]] || rows=("${ORDER[@]}")
for row in "${rows[@]}"; do
  [[ -v "ROWS[$row]" ]] || { echo "rows.sh: unknown row $row (rows: ${ORDER[*]})" >&2; exit 2; }
done
if $list; then
  for row in "${rows[@]}"; do
    echo "$row: ${ROWS[$row]}"
  done
  exit 0
fi
OUT="${OUT:-$(mktemp -d /tmp/bench-rows.XXXXXX)}"
mkdir -p "$OUT"
for row in "${rows[@]}"; do
  command="${ROWS[$row]}"
  echo "== $row: $command (load $(cut -d' ' -f1-3 /proc/loadavg))" | tee "$OUT/$row.txt"
  # shellcheck disable=SC2086  # the command's words are meant to split
  $PY $command 2>&1 | tee -a "$OUT/$row.txt"
done
echo
echo "outputs in $OUT"
grep -h "^SUMMARY\|^== " "$OUT"/*.txt || true
