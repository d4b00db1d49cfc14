# Installs kvdrive to a temporary prefix, then configures, builds and runs tests/package/consumer
# against it with find_package(kvdrive). Run by ctest as: cmake -DSOURCE_DIR=.. -DWORK_DIR=.. -P
file(REMOVE_RECURSE "${WORK_DIR}")
function(step)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
step(${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/kvdrive" -DCMAKE_BUILD_TYPE=Release
     -DKVD_BUILD_TESTS=OFF -DKVD_BUILD_BENCH=OFF -DKVD_BUILD_EXAMPLES=OFF
     -DCMAKE_INSTALL_PREFIX=${WORK_DIR}/prefix)
step(${CMAKE_COMMAND} --install "${WORK_DIR}/kvdrive")
step(${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/package/consumer" -B "${WORK_DIR}/consumer"
     -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release)
step(${CMAKE_COMMAND} --build "${WORK_DIR}/consumer")
step("${WORK_DIR}/consumer/consumer")
