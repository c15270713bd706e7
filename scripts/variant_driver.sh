#!/usr/bin/env bash
# Builds bench_gdnkit for one compile-time variant: fused_sm90.cu (or the sources VARIANT_SOURCES
# names, e.g. "cp.cu" or "fused_sm90.cu cp.cu") recompiled with extra flags (ninja's own command for
# each), put into a copy of the library, the driver relinked against that copy. A minute per variant
# instead of a second build of the whole tree. TARGETS names other executables to relink the same
# way (ninja targets whose objects do not depend on the flags), e.g. the GPU tests and the CLI.
#
#   scripts/variant_driver.sh BUILD NAME FLAGS     -> BUILD/variant-NAME/bench_gdnkit
#   TARGETS="bench_gdnkit tests/gdnkit_gpu_tests gdnkit" scripts/variant_driver.sh BUILD NAME FLAGS
#       -> BUILD/variant-NAME/{bench_gdnkit,gdnkit_gpu_tests,gdnkit}
#
# BUILD is a configured build folder whose bench_gdnkit is built; FLAGS are nvcc flags joined by
# '#' (e.g. "-DGDNKIT_FUSED_KQ_FIRST=1#-DGDNKIT_FUSED_FIRST_COPIES=0"). Used by gpu_check.sh's variants stage
# and by prebuild_drivers.sh (drivers built without a GPU, timed on one later). SPILLS_OK=1 drops
# the spill check (GDNKIT_SPILL_CHECK) from the variant's compile: for instrumented builds (the step
# marks: -DGDNKIT_FUSED_TIMELINE#-DGDNKIT_STEP_MARKS), which spill and are read for their marks only.
set -euo pipefail
build=$1 name=$2 flags=${3//#/ }
cd "$build"
d=variant-$name
mkdir -p "$d"
: >"$d/build.log"
cp libgdnkit.a "$d/libgdnkit.a"
for src in ${VARIANT_SOURCES:-fused_sm90.cu}; do
  cc=$(ninja -t commands bench_gdnkit | grep -- "-c .*/$src" | head -1 | sed -E 's/ -MD -MT [^ ]+ -MF [^ ]+//')
  [ -n "$cc" ] || { echo "variant_driver.sh: no compile command for $src in $build" >&2; exit 1; }
  [ "${SPILLS_OK:-0}" = 1 ] && cc=${cc//-Xptxas=-warn-spills,-Werror/}
  obj=$(printf '%s\n' "$cc" | grep -oE -- '-o [^ ]+' | tail -1 | cut -c4-)
  eval "${cc/-o $obj/-o $d/$src.o} $flags" >>"$d/build.log" 2>&1
  ar r "$d/libgdnkit.a" "$d/$src.o"
done
for target in ${TARGETS:-bench_gdnkit}; do
  # The link line (ninja appends post-build steps, e.g. the tests' discovery, after " && cd ").
  ln=$(ninja -t commands "$target" | grep -- "-o $target " | tail -1 | sed 's/ && cd .*//')
  [ -n "$ln" ] || { echo "variant_driver.sh: no link command for $target in $build" >&2; exit 1; }
  eval "$(printf '%s' "$ln" | sed -e "s| libgdnkit.a | $d/libgdnkit.a |" -e "s|-o $target |-o $d/$(basename "$target") |")" \
    >>"$d/build.log" 2>&1
done
