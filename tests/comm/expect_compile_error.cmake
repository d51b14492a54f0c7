# cmake -DCXX=... -DSOURCE=... -DINCLUDE=... -DCASE=... -DEXPECT=<regex or empty> -P expect_compile_error.cmake
# With EXPECT empty the case must compile; otherwise it must fail with a message matching EXPECT.
execute_process(COMMAND "${CXX}" -std=c++20 -fsyntax-only "-I${INCLUDE}" "-DCASE_${CASE}" "${SOURCE}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(EXPECT STREQUAL "")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the control case does not compile:\n${err}")
  endif()
else()
  if(rc EQUAL 0)
    message(FATAL_ERROR "case ${CASE} compiled, but it must be rejected")
  endif()
  if(NOT err MATCHES "${EXPECT}")
    message(FATAL_ERROR "case ${CASE} failed, but not with the expected message (${EXPECT}):\n${err}")
  endif()
endif()
