# The flagship GPT against the same model in PyTorch: per-step losses of tests/fixtures/
# gpt_torch_losses.txt (recorded by bench/gpt_vs_torch.sh --record-fixture).
if(NOT TARGET trident_test_gpt)  # the sanitizer build has no trainer (gpt.cmake)
  return()
endif()
find_package(Threads REQUIRED)
trident_add_test(gpt.torch SOURCES gpt/test_gpt_torch.cpp LIBRARIES trident_test_gpt LABELS gpt local)
target_compile_definitions(test_gpt_torch PRIVATE TRIDENT_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
