#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (no network needed): build, run every test (CPU and GPU, C++ and
# Python), run the CLI on the GPU, and benchmark gdnkit against FLA on the rows of bench/rows.json.
# Prints a short table last; logs and the benchmark JSON go to $OUT (default: ./gpu-out).
#
# Expects, beside the tree: .deps/cutlass-*/include (CUTLASS headers, from scripts/setup.sh) and
# .whl/ (wheels of fla-core and einops for the FLA comparison; optional).
#
#   STAGES="build test cli bench" SUITE=all bash scripts/gpu_check.sh
#   STAGES=bench ONLY=fixed-b1-t512,fixed-b1-t16384 bash scripts/gpu_check.sh   (a few rows)
#   STAGES="build cli test rows sanitize" FUSED_SUITES=fused SANITIZE_TOOLS="memcheck racecheck" \
#       SANITIZE_MATCH='k128$|segments 4$|segments 32' bash scripts/gpu_check.sh
#       (every check and every row's C++ timing in one call of about eight minutes, for a session
#        that may get a single GPU call)
#   PYTEST=0 skips the Python tests of the test stage; FUSED_SUITES= skips its fused-kernel runs;
#   EMU=1 adds the emulator's tests (CPU only, minutes) to its ctest run.
#   BUILD=build-kq1 CMAKE_ARGS=-DCMAKE_CUDA_FLAGS=-DGDNKIT_FUSED_KQ_FIRST=1 STAGES="build test" ...
#       (a build with extra CMake arguments, here a compile-time switch, in a folder of its own)
#   STAGES="build sanitize" bash scripts/gpu_check.sh   (compute-sanitizer memcheck/racecheck/synccheck/initcheck)
#       (SANITIZE_TOOLS="memcheck racecheck" SANITIZE_MATCH=<regex of the cases> for fewer)
#   STAGES=profile bash scripts/gpu_check.sh    (Nsight Compute sections of the walk and prep kernels;
#                                                PROFILE_KERNELS=fused for the fused kernel)
#   STAGES="build ab" AB_BASE=build-ab/base-src AB_ROWS=... AB_KERNELS=... [AB_ARGS=--beta-bf16] bash scripts/gpu_check.sh
#       (A/B in one run: bench_gdnkit of other source trees, e.g. `git archive main | tar -x -C
#        build-ab/base-src`, against this one, alternating, two rounds; AB_BASE may name several
#        trees; carry them along)
#   STAGES="build variants" VARIANTS="o4:-DGDNKIT_WALK_PROBE_OUT=4 kq1:-DGDNKIT_FUSED_KQ_FIRST=1" AB_ROWS=... \
#       bash scripts/gpu_check.sh
#       (the same, against bench_gdnkit with only fused_sm90.cu recompiled under each variant's
#        flags, several flags joined by '#': a minute per variant instead of a second build;
#        VARIANT_SOURCES="cp.cu" recompiles other sources instead)
#   PACK_OUT=1 ... bash scripts/gpu_check.sh   (the logs in $OUT/logs.tar.xz, beside summary.txt,
#                                               the tables and the benchmark's files)
#   STAGES=drivers DRIVERS=build-ab/drivers AB_ROWS=... bash scripts/gpu_check.sh
#       (the same with drivers built beforehand without a GPU by scripts/prebuild_drivers.sh and
#        carried as DRIVERS/NAME.xz: nothing is built on the GPU machine)
#   STAGES=checks CHECK_SIDES=kq1 CHECK_CASES=segments bash scripts/gpu_check.sh
#       (the GPU suite and compute-sanitizer on a variant's tests and CLI, built beforehand by
#        prebuild_drivers.sh with CHECKS=1 and carried as build-ab/checks: nothing built here)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
STAGES=${STAGES:-"build test cli bench"}
SUITE=${SUITE:-all}
ONLY=${ONLY:-}
BUILD=${BUILD:-build-gpu}
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
status=0
summary=()

has() { [[ " $STAGES " == *" $1 "* ]]; }
note() { summary+=("$1"); echo "== $1"; }
# The A/B stages' timing: every driver (side) once per round, alternately, so that clocks and the
# machine are shared, on the rows of AB_ROWS (default: six cuLA and model rows), with AB_KERNELS
# and AB_ARGS as given; sides not built are left out.
# Usage: time_sides ROUNDS NAME SIDE...  -> $OUT/NAME.txt (bench/ab_table.py reads it)
time_sides() {
  local rounds=$1 name=$2; shift 2
  local rows=${AB_ROWS:-fixed-b1-t4096,fixed-b1-t16384,fixed-b2-t512,fixed-b2-t16384,varlen-n20-t4096-random,qwen35-16x64-b4-t8192}
  local sides=("$@") reversed=() i
  for ((i = $# - 1; i >= 0; i--)); do reversed+=("${sides[i]}"); done
  for round in $(seq "$rounds"); do
    # Even rounds in reverse order, so that no side always runs first (drift, clocks).
    local order=("${sides[@]}")
    [ $((round % 2)) -eq 0 ] && order=("${reversed[@]}")
    for bin in "${order[@]}"; do
      [ -x "$bin" ] || continue
      echo "== $bin (round $round)"
      "$bin" --reps 10 --only "$rows" ${AB_KERNELS:+--kernels $AB_KERNELS} ${AB_ARGS:-} 2>&1 | grep -v '^#'
    done
  done | tee "$OUT/$name.txt"
}

if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gdnkit-site .whl/*.whl \
    && export PYTHONPATH=/tmp/gdnkit-site${PYTHONPATH:+:$PYTHONPATH}
fi
cutlass=$(ls -d .deps/cutlass-*/include 2>/dev/null | head -1)

if has build; then
  t0=$(date +%s)
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real \
    -DGDNKIT_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v $PY)" ${cutlass:+-DGDNKIT_CUTLASS_DIR=$PWD/$cutlass} \
    -DGDNKIT_SPILL_CHECK=ON ${CMAKE_ARGS:-} >"$OUT/configure.log" 2>&1 && cmake --build "$BUILD" -j "$(nproc)" >"$OUT/build.log" 2>&1
  rc=$?
  note "build: rc=$rc in $(( $(date +%s) - t0 )) s"
  if [ $rc -ne 0 ]; then tail -40 "$OUT/build.log"; exit 1; fi
fi

if has test; then
  # The GPU suite directly, so that its per-case error lines are kept; then the CPU suites through
  # ctest, without the emulator's (label emu: six minutes here, and CI runs them) unless EMU=1.
  "$BUILD/tests/gdnkit_gpu_tests" >"$OUT/gpu_tests.log" 2>&1
  rc=$?; [ $rc -ne 0 ] && status=1
  note "gpu tests: rc=$rc: $(grep -E '^\[  PASSED|^\[  FAILED|tests ran' "$OUT/gpu_tests.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED' "$OUT/gpu_tests.log" | head -20
  # The same suite with every case the fused kernel takes run on it (tests/gpu/gpu_util.h): its
  # 128-column variant where dv = 128, then its 64-column variant everywhere; then every case of
  # 16-bit q/k/v on the short walk.
  for mode in ${FUSED_SUITES-fused fused-v64 short}; do
    GDNKIT_TEST_KERNEL=$mode "$BUILD/tests/gdnkit_gpu_tests" >"$OUT/gpu_tests_$mode.log" 2>&1
    rc=$?; [ $rc -ne 0 ] && status=1
    note "gpu tests, $mode: rc=$rc: $(grep -E '^\[  PASSED|^\[  FAILED|tests ran' "$OUT/gpu_tests_$mode.log" | tr '\n' ' ') ($(grep -c "cuda-${mode%%-*}" "$OUT/gpu_tests_$mode.log") cases on it)"
    grep -E '^\[  FAILED' "$OUT/gpu_tests_$mode.log" | head -20
  done
  ctest --test-dir "$BUILD" --output-on-failure -LE "gpu$([ "${EMU:-0}" = 1 ] || echo '|emu')" -j 4 >"$OUT/ctest.log" 2>&1
  rc=$?; [ $rc -ne 0 ] && status=1
  note "ctest (cpu): rc=$rc: $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)"
  if [ "${PYTEST:-1}" != 0 ]; then
    PYTHONPATH=$BUILD/python${PYTHONPATH:+:$PYTHONPATH} $PY -m pytest tests/python -q -s -rs >"$OUT/pytest.log" 2>&1
    rc=$?; [ $rc -ne 0 ] && status=1
    note "pytest: rc=$rc: $(tail -1 "$OUT/pytest.log")"
    grep -E '^(FAILED|ERROR)' "$OUT/pytest.log" | head -20
  fi
  grep -hE '^(ERR|ACC) ' "$OUT/gpu_tests.log" "$OUT/pytest.log" >"$OUT/accuracy.txt" 2>/dev/null || true
fi

if has cli; then
  "$BUILD/gdnkit" >"$OUT/cli.txt" 2>&1
  rc=$?; [ $rc -ne 0 ] && status=1
  note "cli: rc=$rc"
  cat "$OUT/cli.txt"
fi

# compute-sanitizer's cases on the CLI: a mixed varlen batch (empty and 1-token sequences, [dv, dk]
# state), many sequences (wide walk CTAs, linear gates) and one f16 sequence; then the fused kernel
# required by name on a small and a medium batch, and its 64-column variant alone (dv = 64) and in
# pairs (a small and a medium batch); the short walk on a batch of short and longer sequences;
# then a sequence split into segments (context parallelism), small and medium, with the decay
# shortcut, a packed batch split in value and map pairs, and one sequence in 32 segments (a long
# scan).
SANITIZE_CASES=("--lens 200,65,1,0,130 --heads 2,2,4 --layout vk"
                "--lens 70,70,70,70,70,70,70,128 --heads 16,16,16 --gate linear"
                "--lens 300 --heads 1,1,2 --dtype f16"
                "--lens 200,65,1,0,130 --heads 2,2,4 --layout vk --kernel cuda-fused-sm90-bf16-k128"
                "--lens 1000,700,64,3 --heads 4,4,8 --dk 64 --dtype f16 --gate linear --kernel cuda-fused-sm90-f16-k64"
                "--lens 300,1,130 --heads 2,2,4 --dv 64 --kernel cuda-fused-sm90-bf16-k128-v64"
                "--lens 300,1,130 --heads 2,2,4 --kernel cuda-fused-sm90-bf16-k128-v64"
                "--lens 1500,70 --heads 2,2,4 --kernel cuda-fused-sm90-bf16-k128-v64"
                "--lens 2,0,16,17,1,40,5,300 --heads 2,2,4 --kernel cuda-short-bf16-k128-w8"
                "--lens 700 --heads 1,1,2 --segments 4"
                "--lens 2000 --heads 2,2,8 --dk 64 --segments 9"
                "--lens 1500,300 --heads 2,2,4 --segments 5 --split-decay-cutoff 1e-3"
                "--lens 2900,2048,1536,900,512,190,65,33 --heads 2,2,8 --segments 4"
                "--lens 8192 --heads 1,1,4 --segments 32")
# Usage: sanitize_cli CLI "TOOLS" PATTERN: every tool on the cases that match the extended regex.
sanitize_cli() {
  local cli=$1 tools=$2 pattern=${3:-.} tool args rc
  for tool in $tools; do
    for args in "${SANITIZE_CASES[@]}"; do
      [[ "$args" =~ $pattern ]] || continue
      timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 "$cli" $args --repeat 1 --check 1 \
        >"$OUT/sanitizer.log" 2>&1
      rc=$?; [ $rc -ne 0 ] && status=1
      note "sanitizer $tool [$args]: rc=$rc $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY|backend' "$OUT/sanitizer.log" | tr -s ' ' | tr '\n' ' ')"
      [ $rc -ne 0 ] && grep -m5 -iE "error|invalid|hazard" "$OUT/sanitizer.log"
    done
  done
}

if has sanitize; then
  sanitize_cli "$BUILD/gdnkit" "${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}" "${SANITIZE_MATCH:-.}"
  # Invalid cu_seqlens (decreasing, negative, past T) on every kernel and a split: memcheck sees
  # any access outside the buffers that the test's guards cannot.
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/tests/gdnkit_gpu_tests" \
    --gtest_filter=Cuda.BadSeqlensStayInBounds >"$OUT/sanitizer.log" 2>&1
  rc=$?; [ $rc -ne 0 ] && status=1
  note "sanitizer memcheck [Cuda.BadSeqlensStayInBounds]: rc=$rc $(grep -hE 'ERROR SUMMARY|INFO bad|PASSED|FAILED' "$OUT/sanitizer.log" | tr -s ' ' | tr '\n' ' ')"
  [ $rc -ne 0 ] && grep -m5 -iE "error|invalid|Failure" "$OUT/sanitizer.log"
fi

if has profile; then
  # Nsight Compute on one walk and one prep launch of a long single-sequence row (PROFILE_ARGS):
  # the sections as text, and the SASS-level counters summarised (scripts/ncu_hotspots.py).
  args=${PROFILE_ARGS:-"--lens 4096 --heads 64,64,64 --repeat 1 --check 1"}
  for k in ${PROFILE_KERNELS:-walk prep}; do
    ncu --kernel-name "regex:$k" --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section SchedulerStats --section InstructionStats --section Occupancy \
      --section LaunchStats --section SourceCounters -f -o "$OUT/ncu-$k" \
      "$BUILD/gdnkit" $args >/dev/null 2>"$OUT/ncu-$k.err"
    note "ncu $k: rc=$?"
    ncu --import "$OUT/ncu-$k.ncu-rep" >"$OUT/ncu-$k.txt" 2>&1
    grep -m1 -E 'Duration' "$OUT/ncu-$k.txt"
    ncu --import "$OUT/ncu-$k.ncu-rep" --page source --csv --print-source sass >"$OUT/ncu-$k-sass.csv" 2>&1 &&
      $PY scripts/ncu_hotspots.py "$OUT/ncu-$k-sass.csv" >"$OUT/ncu-$k-hotspots.txt" 2>&1
    note "ncu $k hotspots: rc=$? ($(head -c 300 "$OUT/ncu-$k-hotspots.txt" | head -3 | tr '\n' ' '))"
    rm -f "$OUT/ncu-$k-sass.csv" "$OUT/ncu-$k.ncu-rep"
  done
fi

if has ab; then
  # The base trees' benchmark drivers, built beside this one's (same compiler and flags), then all
  # timed alternately on the same rows and kernels, so that clocks and the machine are shared.
  # AB_BASE may list several trees (space-separated): each is one more side of the comparison.
  sides=()
  for base in ${AB_BASE:-build-ab/base-src}; do
    dir=$BUILD-ab-$(basename "$base")
    cmake -S "$base" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real \
      -DGDNKIT_BUILD_TESTS=OFF ${cutlass:+-DGDNKIT_CUTLASS_DIR=$PWD/$cutlass} >"$OUT/ab-configure.log" 2>&1 &&
      cmake --build "$dir" -j "$(nproc)" --target bench_gdnkit >"$OUT/ab-build.log" 2>&1
    rc=$?
    note "ab: base build rc=$rc ($base)"
    if [ $rc -eq 0 ]; then sides+=("$dir/bench_gdnkit"); else status=1; tail -20 "$OUT/ab-build.log"; fi
  done
  sides+=("$BUILD/bench_gdnkit")
  time_sides 2 ab "${sides[@]}"
  $PY bench/ab_table.py "$OUT/ab.txt" --build "$(basename "$BUILD")" | tee "$OUT/ab-table.txt"
fi

if has variants; then
  # Each variant NAME:FLAGS recompiles fused_sm90.cu with FLAGS and relinks bench_gdnkit beside the
  # library (scripts/variant_driver.sh); all are built at once.
  sides=("$BUILD/bench_gdnkit")
  for v in ${VARIANTS:-}; do
    name=${v%%:*}
    bash scripts/variant_driver.sh "$BUILD" "$name" "${v#*:}" &
    sides+=("$BUILD/variant-$name/bench_gdnkit")
  done
  wait
  for bin in "${sides[@]:1}"; do
    [ -x "$bin" ] || { status=1; note "variants: $bin not built: $(tail -3 "$(dirname "$bin")/build.log" | tr '\n' ' ')"; }
  done
  time_sides 2 variants "${sides[@]}"
  $PY bench/ab_table.py "$OUT/variants.txt" --build "$(basename "$BUILD")" | tee "$OUT/variants-table.txt"
  note "variants: ${VARIANTS:-none} (times in $OUT/variants.txt, the table in variants-table.txt)"
fi

if has drivers; then
  # Drivers built elsewhere (scripts/prebuild_drivers.sh, on a machine without a GPU) and carried as
  # DRIVERS/NAME.xz: no build here, so an A/B costs only its timing. Each side is timed once per
  # round, alternately; the table compares every side with DRIVERS_REF (default: "this").
  dir=${DRIVERS:-build-ab/drivers}
  sides=()
  for f in "$dir"/*.xz; do
    [ -e "$f" ] || continue
    name=$(basename "$f" .xz)
    mkdir -p "/tmp/gdnkit-drivers/$name"
    xz -dc "$f" >"/tmp/gdnkit-drivers/$name/bench_gdnkit" && chmod +x "/tmp/gdnkit-drivers/$name/bench_gdnkit" &&
      sides+=("/tmp/gdnkit-drivers/$name/bench_gdnkit")
  done
  note "drivers: ${#sides[@]} from $dir"
  time_sides "${AB_ROUNDS:-3}" drivers "${sides[@]}"
  $PY bench/ab_table.py "$OUT/drivers.txt" --ref "${DRIVERS_REF:-this}" | tee "$OUT/drivers-table.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if has checks; then
  # The GPU suite and compute-sanitizer on tests and CLIs built elsewhere (prebuild_drivers.sh with
  # CHECKS=1: CHECKDIR/NAME-gpu_tests.xz, NAME-cli.xz), for the sides CHECK_SIDES names (default:
  # all): each side's suite as is and with every case on the fused kernel (FUSED_SUITES), then
  # CHECK_TOOLS (default memcheck, racecheck) on the sanitizer cases matching CHECK_CASES (a regex).
  dir=${CHECKDIR:-build-ab/checks}
  for f in "$dir"/*-gpu_tests.xz; do
    [ -e "$f" ] || continue
    name=$(basename "$f" -gpu_tests.xz)
    [ -n "${CHECK_SIDES:-}" ] && [[ " $CHECK_SIDES " != *" $name "* ]] && continue
    d=/tmp/gdnkit-checks/$name
    mkdir -p "$d"
    xz -dc "$f" >"$d/gdnkit_gpu_tests" && xz -dc "$dir/$name-cli.xz" >"$d/gdnkit" && chmod +x "$d/gdnkit_gpu_tests" "$d/gdnkit" ||
      { note "checks $name: unpacking failed"; status=1; continue; }
    for mode in default ${FUSED_SUITES-fused}; do
      if [ "$mode" = default ]; then "$d/gdnkit_gpu_tests" >"$OUT/checks-$name-$mode.log" 2>&1
      else GDNKIT_TEST_KERNEL=$mode "$d/gdnkit_gpu_tests" >"$OUT/checks-$name-$mode.log" 2>&1; fi
      rc=$?; [ $rc -ne 0 ] && status=1
      note "checks $name, gpu tests $mode: rc=$rc: $(grep -E '^\[  PASSED|^\[  FAILED|tests ran' "$OUT/checks-$name-$mode.log" | tr '\n' ' ')"
      grep -E '^\[  FAILED' "$OUT/checks-$name-$mode.log" | head -20
    done
    sanitize_cli "$d/gdnkit" "${CHECK_TOOLS:-memcheck racecheck}" "${CHECK_CASES:-.}"
  done
fi

if has rows; then
  # The C++ driver alone on every row (the planner's choice; seconds, where the bench stage's
  # Python and FLA sides take minutes): device ms, C++ host us and planning us per row.
  timeout 300 "$BUILD/bench_gdnkit" --reps 10 >"$OUT/rows.txt" 2>&1
  rc=$?; [ $rc -ne 0 ] && status=1
  note "rows: rc=$rc ($(grep -c ' cuda-' "$OUT/rows.txt") timings in rows.txt)"
fi

if has bench; then
  PYTHONPATH=$BUILD/python${PYTHONPATH:+:$PYTHONPATH} GDNKIT_COMMIT=${GDNKIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)} \
    $PY bench/bench.py --suite "$SUITE" --cpp-driver "$BUILD/bench_gdnkit" --out "$OUT/bench.json" ${ONLY:+--only "$ONLY"} \
    --plot "$OUT/bench.png" >"$OUT/bench.txt" 2>"$OUT/bench.err"
  rc=$?; [ $rc -ne 0 ] && status=1
  note "bench: rc=$rc"
  [ $rc -ne 0 ] && tail -30 "$OUT/bench.err"
  cat "$OUT/bench.txt"
fi

echo
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
# PACK_OUT=1: every log in one archive, beside the few files read first (the summary, the tables,
# the benchmark's results), for transports that bring back only a handful of files.
if [ "${PACK_OUT:-0}" = 1 ]; then
  (
    cd "$OUT" &&
      keep='^(summary\.txt|rows\.txt|bench\.(json|png|txt)|[a-z]+-table\.txt)$' &&
      files=$(ls -p | grep -v / | grep -vE "$keep" | grep -v '^logs\.tar\.xz$') &&
      [ -n "$files" ] && tar -cJf logs.tar.xz $files && rm -f $files
  )
fi
exit $status
