// flagship::train in fp16, for thread ranks (and MPI ranks where trident::mpi is linked): see
// train_instances.hpp.
#include "train_instances.hpp"

FLAGSHIP_TRAIN_INSTANCES(, trident::mixed_precision<trident::fp16>)
