# Host optimizer step: vectorised, multithreaded AdamW against a plain scalar loop and memcpy.
# Included from bench/CMakeLists.txt (after Google Benchmark was found).
find_package(Threads REQUIRED)
add_executable(bench_optim bench_optim.cpp)
target_link_libraries(bench_optim PRIVATE trident::trident Threads::Threads benchmark::benchmark)
trident_strict_warnings(bench_optim)
