#pragma once
// The trainer's instantiations, compiled once each in train_<precision>.cpp (one file per
// precision, so they compile in parallel): flagship::train for thread ranks, and for MPI ranks
// where the including target links trident::mpi. The flagship and the tests link the same objects
// (the trainer is the slowest code in the project to compile: tens of seconds per instantiation).
#include <functional>
#include <vector>

#include "trainer.hpp"
#include "trident/comm/local.hpp"
#include "trident/core/config.hpp"
#include "trident/precision/mixed_precision.hpp"
#if TRIDENT_HAS_MPI
#include "trident/comm/mpi.hpp"
#endif

#define FLAGSHIP_TRAIN_INSTANCE(EXTERN, PRECISION, COMM)                                                          \
  EXTERN template std::vector<flagship::step_report> flagship::train<PRECISION, COMM>(COMM&, const flagship::train_options&, \
                                                                                      const std::function<void(const flagship::step_report&)>&);

#if TRIDENT_HAS_MPI
#define FLAGSHIP_TRAIN_INSTANCES(EXTERN, PRECISION)         \
  FLAGSHIP_TRAIN_INSTANCE(EXTERN, PRECISION, trident::local_comm) \
  FLAGSHIP_TRAIN_INSTANCE(EXTERN, PRECISION, trident::mpi_comm)
#else
#define FLAGSHIP_TRAIN_INSTANCES(EXTERN, PRECISION) FLAGSHIP_TRAIN_INSTANCE(EXTERN, PRECISION, trident::local_comm)
#endif

FLAGSHIP_TRAIN_INSTANCES(extern, trident::full_precision)
FLAGSHIP_TRAIN_INSTANCES(extern, trident::mixed_precision<trident::bf16>)
FLAGSHIP_TRAIN_INSTANCES(extern, trident::mixed_precision<trident::fp16>)
