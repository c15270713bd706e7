#!/usr/bin/env bash
# Builds benchmark drivers (bench_gdnkit) on this machine, which needs nvcc and the CUTLASS headers
# but no GPU, for an A/B that then costs a GPU machine only its timing (gpu_check.sh's drivers
# stage). Writes OUTDIR/this.xz (this tree), OUTDIR/NAME.xz for each compile-time variant NAME:FLAGS
# of the fused kernel (flags joined by '#', scripts/variant_driver.sh) and OUTDIR/TREE.xz for each
# other source tree (e.g. `git archive BASE | tar -x -C build-ab/base-src`). Old .xz files in
# OUTDIR are removed first, so that every file there is a side of the next comparison.
#
#   VARIANTS="kq1:-DGDNKIT_FUSED_KQ_FIRST=1" TREES=build-ab/base-src bash scripts/prebuild_drivers.sh
#   VARIANTS="fc1:-DGDNKIT_FUSED_FIRST_COPIES=1" bash scripts/prebuild_drivers.sh
#   then, on the GPU machine, carrying OUTDIR:
#   STAGES=drivers DRIVERS=build-ab/drivers AB_ROWS=... bash scripts/gpu_check.sh
# CHECKS=1 also packs this tree's and each variant's GPU tests and CLI (CHECKDIR, default
# build-ab/checks: NAME-gpu_tests.xz, NAME-cli.xz), for gpu_check.sh's checks stage: the GPU suite
# and compute-sanitizer on a variant, again without a build there.
#
# The drivers link the CUDA runtime statically; the GPU machine needs a driver as new as this
# toolkit's and a C++ runtime as new as this compiler's (the device machine's image matches).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-sm90}
OUTDIR=${OUTDIR:-build-ab/drivers}
JOBS=${JOBS:-$(nproc)}
# Other trees have no .deps of their own: every build takes this tree's CUTLASS headers.
GDNKIT_CUTLASS_DIR=${GDNKIT_CUTLASS_DIR:-$(ls -d "$PWD"/.deps/cutlass-*/include 2>/dev/null | sort -V | tail -1)}

configure() {  # source folder, build folder
  [ -f "$2/build.ninja" ] && return 0
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real \
    -DGDNKIT_SPILL_CHECK=ON -DGDNKIT_BUILD_TESTS=OFF ${GDNKIT_CUTLASS_DIR:+-DGDNKIT_CUTLASS_DIR=$GDNKIT_CUTLASS_DIR} >/dev/null
}
pack() {  # driver, side name
  xz -T0 -3 -c "$1" >"$OUTDIR/$2.xz"
  echo "$OUTDIR/$2.xz ($(du -h "$OUTDIR/$2.xz" | cut -f1))"
}

CHECKDIR=${CHECKDIR:-build-ab/checks}
checks=${CHECKS:-0}
pack_checks() {  # folder holding gdnkit_gpu_tests and gdnkit, side name
  [ "$checks" = 1 ] || return 0
  OUTDIR=$CHECKDIR pack "$1/gdnkit_gpu_tests" "$2-gpu_tests"
  OUTDIR=$CHECKDIR pack "$1/gdnkit" "$2-cli"
}

mkdir -p "$OUTDIR"
rm -f "$OUTDIR"/*.xz
if [ "$checks" = 1 ]; then
  mkdir -p "$CHECKDIR"
  rm -f "$CHECKDIR"/*.xz
fi
configure . "$BUILD"
if [ "$checks" = 1 ]; then
  # (This tree's tests need GDNKIT_BUILD_TESTS, which the drivers' own configure leaves off.)
  cmake -S . -B "$BUILD" -DGDNKIT_BUILD_TESTS=ON >/dev/null
  cmake --build "$BUILD" -j "$JOBS" --target bench_gdnkit gdnkit_gpu_tests gdnkit_cli >/dev/null
  mkdir -p "$BUILD/checks-this"
  cp "$BUILD/tests/gdnkit_gpu_tests" "$BUILD/gdnkit" "$BUILD/checks-this/"
  pack_checks "$BUILD/checks-this" this
  export TARGETS="bench_gdnkit tests/gdnkit_gpu_tests gdnkit"
else
  cmake --build "$BUILD" -j "$JOBS" --target bench_gdnkit >/dev/null
fi
pack "$BUILD/bench_gdnkit" this
for v in ${VARIANTS:-}; do
  name=${v%%:*}
  bash scripts/variant_driver.sh "$BUILD" "$name" "${v#*:}"
  pack "$BUILD/variant-$name/bench_gdnkit" "$name"
  pack_checks "$BUILD/variant-$name" "$name"
done
for tree in ${TREES:-}; do
  dir=$BUILD-ab-$(basename "$tree")
  configure "$tree" "$dir"
  cmake --build "$dir" -j "$JOBS" --target bench_gdnkit >/dev/null
  pack "$dir/bench_gdnkit" "$(basename "$tree")"
done
