# Local SGD and DiLoCo (parallel/local_sgd/) on thread ranks, over the simulated network.
trident_add_test(local_sgd.diloco SOURCES local_sgd/test_diloco.cpp LIBRARIES Threads::Threads LABELS local_sgd local TIMEOUT 600)
target_include_directories(test_local_sgd_diloco PRIVATE "${PROJECT_SOURCE_DIR}/examples/common")
