# Pipeline parallelism (parallel/pipeline/): schedules as data, their validator and the simulator.
trident_add_test(pipeline.schedule SOURCES pipeline/test_schedule.cpp pipeline/test_simulator.cpp pipeline/test_partition.cpp LABELS pipeline)
