# Pipeline parallelism (parallel/pipeline/): schedules as data and their validator.
trident_add_test(pipeline.schedule SOURCES pipeline/test_schedule.cpp LABELS pipeline)
