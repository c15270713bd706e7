# ctest's Build.CpuOnly: configures this source tree with GDNKIT_WITH_CUDA=OFF and no CUDA compiler
# in reach, builds the library and the CLI, and runs a small checked prefill with it.
file(REMOVE_RECURSE "${WORK}")
set(ENV{CUDACXX} "${WORK}/no-nvcc")
execute_process(COMMAND "${CMAKE_COMMAND}" -S "${SRC}" -B "${WORK}" -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Release
                        "-DCMAKE_CXX_COMPILER=${CXX}" -DGDNKIT_WITH_CUDA=OFF -DGDNKIT_BUILD_TESTS=OFF
                        -DGDNKIT_BUILD_BENCH=OFF -DGDNKIT_BUILD_PYTHON=OFF -DGDNKIT_INSTALL=OFF -DGDNKIT_BUILD_CLI=ON
                COMMAND_ERROR_IS_FATAL ANY OUTPUT_QUIET)
file(READ "${WORK}/CMakeCache.txt" cache)
if(cache MATCHES "CMAKE_CUDA_COMPILER:FILEPATH=[^\n]*nvcc")
  message(FATAL_ERROR "the CPU-only configure found a CUDA compiler")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${WORK}" COMMAND_ERROR_IS_FATAL ANY OUTPUT_QUIET)
execute_process(COMMAND "${WORK}/gdnkit" --lens 100,37,0 --heads 2,2,4 --dk 32 --dv 32 --check 6 COMMAND_ERROR_IS_FATAL ANY)
