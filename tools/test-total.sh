#!/usr/bin/env bash
# The closing line of `make test`: the counts of every pytest process it ran, added up, as one
# "total: N passed, N failed" line (each process prints its own summary above it).
#
#   tools/test-total.sh LOG [LOG ...]
#
# A log whose summary line cannot be found counts as one error: a process that died before its
# summary must not read as a pass.
set -euo pipefail

declare -A total=([passed]=0 [failed]=0 [errors]=0 [skipped]=0)
for log in "$@"; do
  # pytest -q ends with e.g. "1 failed, 136 passed, 1 error in 641.28s (0:10:41)"
  summary="$(grep -E ' in [0-9.]+s( \([0-9:]+\))?$' "$log" | tail -n 1 || true)"
  if [ -z "$summary" ]; then
    echo "$log: no pytest summary line" >&2
    total[errors]=$((total[errors] + 1))
    continue
  fi
  for kind in passed failed skipped error errors; do
    n="$(grep -oE "[0-9]+ ${kind}(,| in)" <<<"$summary" | grep -oE '^[0-9]+' || true)"
    [ -n "$n" ] || continue
    case "$kind" in error | errors) total[errors]=$((total[errors] + n)) ;; *) total[$kind]=$((total[$kind] + n)) ;; esac
  done
done
line="total: ${total[passed]} passed, $((total[failed] + total[errors])) failed"
[ "${total[skipped]}" -eq 0 ] || line+=", ${total[skipped]} skipped"
echo "$line"
