# ctest's Install.FindPackage: installs the build into a fresh prefix, then configures, builds and
# runs tests/install as a separate project that finds the package there.
file(REMOVE_RECURSE "${WORK}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD}" --prefix "${WORK}/prefix" COMMAND_ERROR_IS_FATAL ANY
                OUTPUT_QUIET)
execute_process(COMMAND "${CMAKE_COMMAND}" -S "${SRC}" -B "${WORK}/build" -G "${GENERATOR}"
                        "-DCMAKE_PREFIX_PATH=${WORK}/prefix" "-DCMAKE_CXX_COMPILER=${CXX}" COMMAND_ERROR_IS_FATAL ANY)
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${WORK}/build" COMMAND_ERROR_IS_FATAL ANY)
execute_process(COMMAND "${WORK}/build/app" COMMAND_ERROR_IS_FATAL ANY)
