// A pipeline whose stage k's output is not stage k + 1's input, or a stage that does not model
// the stage concept, must not compile (tests/pipeline/pipeline.cmake compiles this file once
// per case and expects the message; the control case must compile).
#include <cstddef>
#include <vector>

#include "trident/parallel/pipeline/pipeline.hpp"

namespace pp = trident::pipeline;

template <class In, class Out>
struct stage_of {
  using input_type = In;
  using output_type = Out;
  std::size_t input_numel() const { return 1; }
  std::size_t output_numel() const { return 1; }
  Out forward(const In&, int) { return Out(1); }
  In backward(const Out&, int) { return In(1); }
};
struct no_backward {
  using input_type = std::vector<float>;
  using output_type = std::vector<float>;
  std::size_t input_numel() const { return 1; }
  std::size_t output_numel() const { return 1; }
  std::vector<float> forward(const std::vector<float>& x, int) { return x; }
};

#if defined(CASE_mismatched_boundary)
// Stage 1 sends doubles; stage 2 expects floats.
using broken = pp::pipeline<stage_of<std::vector<float>, std::vector<float>>, stage_of<std::vector<float>, std::vector<double>>,
                            stage_of<std::vector<float>, std::vector<float>>>;
constexpr int stages = broken::stage_count;
#elif defined(CASE_not_a_stage)
using broken = pp::pipeline<stage_of<std::vector<float>, std::vector<float>>, no_backward>;
constexpr int stages = broken::stage_count;
#else  // the control
using fine = pp::pipeline<stage_of<std::vector<float>, std::vector<double>>, stage_of<std::vector<double>, std::vector<float>>>;
constexpr int stages = fine::stage_count;
#endif
int main() { return stages; }
