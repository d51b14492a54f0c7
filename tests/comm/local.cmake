# The thread backend needs nothing but the standard library.
find_package(Threads REQUIRED)
trident_add_test(comm.local SOURCES comm/test_local.cpp LIBRARIES Threads::Threads LABELS comm local TIMEOUT 600)

# The same tests built with ThreadSanitizer as part of every build: the thread backend's
# synchronisation is its correctness, so every CI run checks it, not only the tsan preset.
include(CheckCXXSourceCompiles)
set(CMAKE_REQUIRED_FLAGS "-fsanitize=thread")
set(CMAKE_REQUIRED_LINK_OPTIONS "-fsanitize=thread")
check_cxx_source_compiles("int main() { return 0; }" TRIDENT_HAVE_TSAN)
unset(CMAKE_REQUIRED_FLAGS)
unset(CMAKE_REQUIRED_LINK_OPTIONS)
option(TRIDENT_TSAN_TESTS "Also build and run the thread backend's tests under ThreadSanitizer" ${TRIDENT_HAVE_TSAN})
# trident_add_tsan_test(name <trident_add_test arguments>): that test under ThreadSanitizer, which
# stops at its first report (support/tsan.supp: what TSan cannot see inside libstdc++). zero/zero.cmake
# uses it too, under the same condition.
function(trident_add_tsan_test name)
  trident_add_test(${name} ${ARGN})
  string(REPLACE "." "_" target "test_${name}")
  target_compile_options(${target} PRIVATE -fsanitize=thread -O1 -g)
  target_link_options(${target} PRIVATE -fsanitize=thread)
  set_property(TEST ${name} APPEND PROPERTY ENVIRONMENT
               "TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=${PROJECT_SOURCE_DIR}/tests/support/tsan.supp")
endfunction()
if(TRIDENT_TSAN_TESTS AND NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  trident_add_tsan_test(comm.local_tsan SOURCES comm/test_local.cpp LIBRARIES Threads::Threads LABELS comm local tsan TIMEOUT 900)
endif()

# Random legal and illegal call sequences (seeded; bench/random_misuse.sh runs a longer budget).
trident_add_test(comm.random SOURCES comm/test_random.cpp LIBRARIES Threads::Threads LABELS comm local TIMEOUT 600)
if(TRIDENT_TSAN_TESTS AND NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  trident_add_tsan_test(comm.random_tsan SOURCES comm/test_random.cpp LIBRARIES Threads::Threads LABELS comm local tsan TIMEOUT 600)
endif()

# The simulated network (comm/slow_link.hpp) and the hierarchical all-reduce, on thread ranks.
trident_add_test(comm.slow_link SOURCES comm/test_slow_link.cpp LIBRARIES Threads::Threads LABELS comm local TIMEOUT 600)
