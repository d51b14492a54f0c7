# Memory of the wrong space, or mismatched element types, is a compile-time error with a
# readable message (checked with the compiler, so it cannot silently stop being one).
set(_cases "control|" "host_range_to_device_comm|works on memory in its own space"
           "device_buffer_to_host_comm|works on memory in its own space" "mixed_element_types|must have the same element type"
           "zero_stage_4|Stage must be 0, 1, 2 or 3" "zero_wrong_optimizer|Opt must model trident::optim::optimizer"
           "zero_wrong_precision|Precision must model trident::precision_policy")
foreach(entry IN LISTS _cases)
  string(REPLACE "|" ";" parts "${entry}")
  list(GET parts 0 case)
  list(LENGTH parts n)
  set(expect "")
  if(n GREATER 1)
    list(GET parts 1 expect)
  endif()
  add_test(NAME comm.compile_fail.${case}
           COMMAND ${CMAKE_COMMAND} "-DCXX=${CMAKE_CXX_COMPILER}" "-DSOURCE=${CMAKE_CURRENT_SOURCE_DIR}/comm/compile_fail.cpp"
                   "-DINCLUDE=${PROJECT_SOURCE_DIR}/include" "-DCASE=${case}" "-DEXPECT=${expect}"
                   -P "${CMAKE_CURRENT_SOURCE_DIR}/comm/expect_compile_error.cmake")
  set_tests_properties(comm.compile_fail.${case} PROPERTIES LABELS "comm")
endforeach()
