// zero_optimizer::step_async on NCCL ranks sharing GPU 0: captured into a CUDA graph (stages 0-3;
// capture in cudaStreamCaptureModeGlobal fails on any allocation or synchronisation inside it),
// launched, and equal to step(); then the async suite's bodies (tests/zero/async_suite.hpp) as on
// thread ranks. The device computes the optimizer's scalars with its own pow, hence a tolerance
// where the host is bitwise.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "support/nccl_mpi_main.hpp"
#include "trident/comm/nccl.hpp"
#include "trident/parallel/data/cuda/zero_engine.cuh"
#include "zero/async_suite.hpp"

namespace zero = trident::zero;
namespace toy = zero_training::toy;

namespace {

std::optional<trident::nccl_comm> world;
constexpr double tolerance = 1e-6;

// Each step: forward and backward (reductions queued), finish() (they complete, outside the
// graph), then step_async() captured on the communicator's stream, the graph instantiated and
// launched once. The reference takes the same steps through step(). Step 1 goes through step()
// on both (so the capture of step 2 holds the store of the host's step count), and in step 3 a
// gradient on rank 1 is infinite (the captured decision skips it everywhere).
template <int Stage, class Precision, class Opt>
void captured(trident::nccl_comm& comm, Opt opt) {
  const auto spec = async_suite::model();
  const auto o = async_suite::options(64, 0.05f);
  using Z = zero::zero_optimizer<Stage, Opt, trident::nccl_comm, Precision>;
  Z reference(comm, spec, opt, o), graphed(comm, spec, opt, o);
  toy::initialise(reference, spec);
  toy::initialise(graphed, spec);
  auto walk_of = [&](Z& z, int s) {
    toy::walk w;
    if (s != 3 || comm.rank() != 1) return w;
    w.before_ready = [&comm, z = &z](int layer) {
      using H = typename Z::half_type;
      if (layer == 1) zero_training::on_host(comm, z->gradients("c"), [](std::span<H> g) { g[3] = H(INFINITY); });
    };
    return w;
  };
  const cudaStream_t stream = comm.stream();
  for (int s = 0; s < 5; ++s) {
    toy::step_samples(comm, reference, spec, s, walk_of(reference, s));
    const auto expected = reference.step();
    CHECK(expected.applied == (s != 3));
    toy::step_samples(comm, graphed, spec, s, walk_of(graphed, s));
    if (s == 1) {
      CHECK(graphed.step().applied);
      continue;
    }
    graphed.finish();
    cudaGraph_t graph = nullptr;
    TRIDENT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    std::string failure;
    try {
      graphed.step_async();
    } catch (const std::exception& e) {
      failure = e.what();
    }
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    INFO("stage ", Stage, ", step ", s, ", rank ", comm.rank(), ": ", failure, " / cudaStreamEndCapture: ", cudaGetErrorString(ended));
    REQUIRE(failure.empty());
    REQUIRE(ended == cudaSuccess);
    std::size_t nodes = 0;
    TRIDENT_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
    CHECK(nodes > 0);
    cudaGraphExec_t exec = nullptr;
    TRIDENT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    TRIDENT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    const auto got = graphed.last_step();
    TRIDENT_CUDA_CHECK(cudaGraphExecDestroy(exec));
    TRIDENT_CUDA_CHECK(cudaGraphDestroy(graph));
    CHECK(got.applied == expected.applied);
    if (expected.applied) CHECK(got.grad_norm == doctest::Approx(expected.grad_norm).epsilon(1e-5));
    else CHECK_FALSE(std::isfinite(got.grad_norm));
    CHECK(graphed.steps_taken() == reference.steps_taken());
  }
  CHECK(graphed.steps_taken() == 4);
  const auto want = toy::parameters(reference, spec), got = toy::parameters(graphed, spec);
  INFO("stage ", Stage, ", rank ", comm.rank(), ": largest relative difference ", async_suite::worst(got, want));
  CHECK(async_suite::worst(got, want) <= tolerance);
}

// Capturing with a reduction still in flight is a usage_error that says to finish() first, not
// a broken capture: the step would have waited for it.
void capture_without_finish(trident::nccl_comm& comm) {
  const auto spec = async_suite::model();
  zero::zero_optimizer<1, trident::optim::adamw, trident::nccl_comm> z(comm, spec, async_suite::adamw(),
                                                                      async_suite::options(64, 0.0f));
  toy::initialise(z, spec);
  toy::step_samples(comm, z, spec, 0);
  cudaGraph_t graph = nullptr;
  TRIDENT_CUDA_CHECK(cudaStreamBeginCapture(comm.stream(), cudaStreamCaptureModeGlobal));
  const auto what = async_suite::usage_message([&] { z.step_async(); });
  const cudaError_t ended = cudaStreamEndCapture(comm.stream(), &graph);
  if (graph != nullptr) TRIDENT_CUDA_CHECK(cudaGraphDestroy(graph));
  INFO(what);
  CHECK(ended == cudaSuccess);
  CHECK(async_suite::contains(what, "call finish() before beginning the capture"));
  CHECK(z.step().applied);  // nothing was queued: step() goes on
}

}  // namespace

TEST_CASE("zero.graph_nccl: step_async is captured into a CUDA graph and equals step() (stages 0-3, fp32 and bf16)") {
  auto& comm = *world;
  captured<0, trident::full_precision>(comm, async_suite::adamw());
  captured<1, trident::full_precision>(comm, async_suite::sgd());
  captured<2, trident::mixed_precision<trident::bf16>>(comm, async_suite::adamw());
  captured<3, trident::full_precision>(comm, async_suite::adamw());
  captured<3, trident::mixed_precision<trident::bf16>>(comm, async_suite::adamw());
  capture_without_finish(comm);
}

TEST_CASE("zero.graph_nccl: the async suite on NCCL") {
  auto& comm = *world;
  async_suite::same_as_step<0, trident::full_precision>(comm, async_suite::adamw(), tolerance);
  async_suite::same_as_step<1, trident::mixed_precision<trident::bf16>>(comm, async_suite::adamw(), tolerance);
  async_suite::same_as_step<2, trident::full_precision>(comm, async_suite::sgd(), tolerance);
  async_suite::same_as_step<3, trident::full_precision>(comm, async_suite::adamw(), tolerance);
  async_suite::skipped_everywhere<1, trident::mixed_precision<trident::bf16>>(comm, tolerance);
  async_suite::skipped_everywhere<3, trident::full_precision>(comm, tolerance);
  async_suite::different_orders<2>(comm, tolerance);
  async_suite::refusals(comm);
}

int main(int argc, char** argv) { return test_support::nccl_mpi_doctest_main(argc, argv, world); }
