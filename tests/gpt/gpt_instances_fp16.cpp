// The trainer compiled once for the thread-rank tests (gpt_suite.hpp declares these
// instantiations extern): each precision costs tens of seconds to compile, minutes under the
// sanitizers, and four test files use them. One file per precision, so they compile in parallel.
#include "gpt/gpt_suite.hpp"

template std::vector<flagship::step_report> flagship::train<trident::mixed_precision<trident::fp16>, trident::local_comm>(
    trident::local_comm&, const flagship::train_options&, const std::function<void(const flagship::step_report&)>&);
