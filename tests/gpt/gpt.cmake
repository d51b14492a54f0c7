# The flagship GPT trainer (examples/01_flagship): every grid and ZeRO stage against one rank.
find_package(Threads REQUIRED)
trident_add_test(gpt.local SOURCES gpt/test_gpt_local.cpp LIBRARIES Threads::Threads LABELS gpt local)
target_include_directories(test_gpt_local PRIVATE "${PROJECT_SOURCE_DIR}/examples")
if(TARGET trident::mpi)
  trident_add_test(gpt.mpi SOURCES gpt/test_gpt_mpi.cpp LIBRARIES trident::mpi Threads::Threads MPI_RANKS 4 LABELS gpt mpi)
  target_include_directories(test_gpt_mpi PRIVATE "${PROJECT_SOURCE_DIR}/examples")
endif()
