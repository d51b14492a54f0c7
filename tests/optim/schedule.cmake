# Learning-rate schedules against hand-computed values and DeepSpeed's / PyTorch's traces.
trident_add_test(optim.schedule SOURCES optim/test_schedule.cpp LABELS optim)
target_compile_definitions(test_optim_schedule PRIVATE TRIDENT_FIXTURES="${PROJECT_SOURCE_DIR}/tests/fixtures")
