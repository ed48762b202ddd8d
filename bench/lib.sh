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

# relm reads prompts through `datasets`, which the GPU machine lacks (with dill and multiprocess; it has
# pandas, xxhash, fsspec, huggingface_hub and pyarrow). Where `import datasets` fails, the wheels carried in
# .whl/datasets/ (or TRL's set in .whl/trl/) go into $SITE (default /tmp/site), which joins PYTHONPATH.
# Make them with: pip download --no-deps --only-binary=:all: --python-version 3.12 --platform any
#   --platform manylinux2014_x86_64 -d .whl/datasets datasets dill multiprocess   (about 0.9 MB; carry .whl)
ensure_datasets() {
  local py="${PY:-python3}" site="${SITE:-/tmp/site}" dir
  "$py" -c "import datasets" 2>/dev/null && return 0
  for dir in .whl/datasets .whl/trl; do
    ls "$dir"/datasets-*.whl >/dev/null 2>&1 || continue
    "$py" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" "$dir"/*.whl || continue
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$site"
    "$py" -c "import datasets" && return 0
  done
  echo "relm needs the datasets library to read prompts: carry its wheels in .whl/datasets (see bench/lib.sh)"
  return 1
}
ensure_datasets || true  # every script that trains reads prompts; the line above says what is missing
