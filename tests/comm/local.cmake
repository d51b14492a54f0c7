# The thread backend needs nothing but the standard library.
find_package(Threads REQUIRED)
trident_add_test(comm.local SOURCES comm/test_local.cpp LIBRARIES Threads::Threads LABELS comm local TIMEOUT 600)
