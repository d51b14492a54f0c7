# Mixed precision: the loss scalers against DeepSpeed's recorded traces (tests/fixtures/).
trident_add_test(precision.loss_scaler SOURCES precision/test_loss_scaler.cpp LABELS precision)
target_compile_definitions(test_precision_loss_scaler PRIVATE
                           TRIDENT_FIXTURES="${PROJECT_SOURCE_DIR}/tests/fixtures")
