# The flagship's DeepSpeed config loader (examples/01_flagship/ds_config.hpp) against what
# DeepSpeed itself accepted and resolved (tests/fixtures/deepspeed_config.txt) and against the
# configs from DeepSpeed's documentation (tests/fixtures/deepspeed_config/).
find_package(nlohmann_json 3 REQUIRED)
trident_add_test(gpt.ds_config SOURCES gpt/test_ds_config.cpp LIBRARIES nlohmann_json::nlohmann_json LABELS gpt)
target_include_directories(test_gpt_ds_config PRIVATE "${PROJECT_SOURCE_DIR}/examples")
target_compile_definitions(test_gpt_ds_config PRIVATE TRIDENT_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                                                      TRIDENT_FIXTURES="${PROJECT_SOURCE_DIR}/tests/fixtures")
