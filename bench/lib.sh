# Shared by the bench/gpu_*.sh scripts (source it): one measurement per step, each under its own time
# limit, its whole output in $RESULTS/NAME.log; a failing step is reported and the next one still runs.
# STEP_FILTER, when set, is an extended regex: only matching lines are echoed (the device tool returns
# the tail of the output, and warnings would push the figures out of it); STEP_TAIL (default 14) is how
# many of them, the last ones.
STATUS=()

step() {  # step NAME SECONDS COMMAND...
  local name="$1" limit="$2"; shift 2
  echo; echo "=== $name (limit ${limit}s) ==="
  local start=$SECONDS
  if [ -n "${STEP_FILTER:-}" ]; then
    timeout --signal=KILL "$limit" "$@" > "$RESULTS/$name.log" 2>&1
  else
    timeout --signal=KILL "$limit" "$@" 2>&1 | tee "$RESULTS/$name.log"
  fi
  local rc=${PIPESTATUS[0]}
  [ -n "${STEP_FILTER:-}" ] && grep -E "$STEP_FILTER" "$RESULTS/$name.log" | tail -n "${STEP_TAIL:-14}"
  STATUS+=("$name: rc=$rc, $((SECONDS - start))s")
  echo "--- $name: rc=$rc in $((SECONDS - start))s"
}

summary() {
  echo; echo "=== summary ==="
  printf '%s\n' "${STATUS[@]}"
}
