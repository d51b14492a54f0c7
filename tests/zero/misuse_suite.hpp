#pragma once
// zero_optimizer under bad input, one test body per behaviour, written against the communicator
// concept and run on every backend (thread ranks in test_zero_misuse.cpp, MPI in
// test_zero_mpi.cpp, NCCL in test_zero_misuse_nccl.cu). Every body here makes its mistake on
// every rank alike, or is detected collectively (at step()), so every rank throws the same
// usage_error and goes on: no rank is left waiting, on any backend. Mistakes that one rank makes
// alone and that fail at once on that rank only need the thread backend to fail its peers; they
// are in test_zero_misuse.cpp.
//
// The bodies touch the elements of parameters() and gradients() only through
// zero_training::to_host and on_host (toy::micro_batch uses them too), so they run in any memory
// space: in place on the host; on a device (nccl_comm: cuda_space) through a host vector, once
// the communicator's stream is synchronised. Comparing the spans' data() pointers needs neither.
#include <doctest/doctest.h>

#include <cmath>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "trident/parallel/data/zero_optimizer.hpp"
#include "zero/zero_training.hpp"

namespace misuse_suite {

namespace zero = trident::zero;
namespace toy = zero_training::toy;

inline trident::optim::sgd sgd() {
  trident::optim::sgd o;
  o.opt.lr = 0.1f;
  o.opt.momentum = 0.9f;
  return o;
}

//! Three layers of 32 elements, each alone in its bucket with buckets_of(32): equal sizes, so
//! no communicator can tell one bucket's collective from another's.
inline trident::model_spec three_layers() {
  trident::model_spec s;
  s.add("a", {32}, 0).add("b", {4, 8}, 1).add("c", {32}, 2);
  return s;
}
inline zero::zero_options buckets_of(std::size_t elements) {
  zero::zero_options o;
  o.bucket_bytes = o.first_bucket_bytes = elements * sizeof(float);
  o.persistence_threshold = 0;  // stage 3 really gathers and releases
  return o;
}

//! The models of issue 17 whose first layers hold no tensors, and one with an empty layer inside
//! a bucket; each with the bucket size that makes it interesting.
struct empty_layers_case {
  trident::model_spec spec;
  std::size_t bucket_elements;
};
inline std::vector<empty_layers_case> empty_layer_models() {
  std::vector<empty_layers_case> m(3);
  m[0].spec.add("big", {100}, 1).add("tail", {8}, 2);  // no tensors on layer 0, then a layer over the cap
  m[0].bucket_elements = 30;
  m[1].spec.add("a", {24}, 2).add("b", {24}, 3).add("c", {24}, 4);  // first tensors on layer 2, small buckets
  m[1].bucket_elements = 30;
  m[2].spec.add("a", {8}, 0).add("b", {8}, 2).add("c", {40}, 5);  // empty layers inside buckets
  m[2].bucket_elements = 20;
  return m;
}

//! The message of the usage_error that f throws (a failed check if it throws none).
template <class F>
std::string usage_message(F&& f) {
  try {
    f();
  } catch (const trident::usage_error& e) {
    return e.what();
  }
  FAIL_CHECK("expected a trident::usage_error");
  return {};
}
inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

using zero_training::for_each_stage;

template <int Stage, class Comm>
using optimizer = zero::zero_optimizer<Stage, trident::optim::sgd, Comm>;

//! grad_ready twice for a layer alone in its bucket, on every rank, after every grad_ready: a
//! usage_error each time, before anything is queued, so training ends exactly as without the
//! mistakes (with average = false, a second reduction would have doubled the gradients).
template <int Stage, class Comm>
void grad_ready_twice(Comm& comm) {
  auto options = buckets_of(32);
  options.average = false;
  const auto spec = three_layers();
  const auto clean = toy::train<Stage>(comm, spec, sgd(), options, 3);
  optimizer<Stage, Comm> z(comm, spec, sgd(), options);
  toy::initialise(z, spec);
  toy::walk how;
  how.after_ready = [&](int layer) {
    const std::string l = std::to_string(layer);
    const auto what = usage_message([&] { z.grad_ready(layer); });
    INFO(what);
    CHECK(contains(what, "grad_ready(" + l + "): layer " + l + " was already marked ready"));
    CHECK(contains(what, "bucket " + l + " of 3 (layers " + l + ".." + l + ")"));
    CHECK(contains(what, "Expected each layer once per micro-batch"));
  };
  for (int s = 0; s < 3; ++s) {
    toy::step_samples(comm, z, spec, s, how);
    z.step();
  }
  CHECK(toy::parameters(z, spec) == clean);
}

//! grad_ready twice in a bucket of two layers: while the bucket waits for its other layer, and
//! once its reduction is queued. In stages 0-1 a second micro-batch with gradient sync on would
//! reduce the buckets again; in stages 2-3 it is legal.
template <int Stage, class Comm>
void grad_ready_twice_in_shared_bucket(Comm& comm) {
  trident::model_spec spec;
  spec.add("a", {32}, 0).add("b", {16}, 1).add("c", {16}, 2);  // layers 1 and 2 share a bucket
  optimizer<Stage, Comm> z(comm, spec, sgd(), buckets_of(32));
  toy::initialise(z, spec);
  REQUIRE(z.layout().buckets().size() == 2);
  toy::walk how;
  how.after_ready = [&](int layer) {
    if (layer == 2) {
      const auto what = usage_message([&] { z.grad_ready(2); });
      CHECK(contains(what, "grad_ready(2): layer 2 was already marked ready in this micro-batch; its bucket 1 of 2 (layers 1..2) "
                           "still waits for layer 1"));
    }
    if (layer == 1) {
      const auto what = usage_message([&] { z.grad_ready(2); });
      CHECK(contains(what, "grad_ready(2): layer 2 was already marked ready"));
      CHECK(contains(what, "bucket 1 of 2 (layers 1..2)"));
      CHECK(contains(what, Stage < 2 ? "set_gradient_sync(false)" : "is in flight"));
    }
  };
  toy::step_samples(comm, z, spec, 0, how);
  if constexpr (Stage < 2) {
    const auto what = usage_message([&] { toy::step_samples(comm, z, spec, 1); });
    CHECK(contains(what, "since the last step(). Expected each layer once per micro-batch"));
    z.zero_grad();
  }
  toy::step_samples(comm, z, spec, 1);
  CHECK(z.step().applied);
}

//! Layers without tensors are legal: the model trains like one rank on the global batch
//! (`serial`: toy::train<0> on one rank), every stage alike, whether or not grad_ready and
//! release are called for the empty layers.
template <int Stage, class Comm>
void layers_without_tensors(Comm& comm, const empty_layers_case& m, bool skip_empty, const std::vector<float>& serial,
                            const std::vector<float>& stage0) {
  toy::walk how;
  how.skip_empty = skip_empty;
  const auto mine = toy::train<Stage>(comm, m.spec, sgd(), buckets_of(m.bucket_elements), 4, how);
  CHECK(zero_training::relative_difference(mine, serial) <= 1e-6);
  if (!stage0.empty()) CHECK(mine == stage0);  // bit for bit with stage 0 (thread backend)
}

//! Rank 1 visits layer 2 before layer 1 (data-dependent control flow), so its bucket collectives
//! come in another order. Every rank throws a usage_error naming the first position where the
//! ranks' bucket collectives differ and both buckets, applies nothing, and training goes on as if
//! that step never was.
//!   prefetch = false: the collectives differ only in which equal-sized bucket they carry, so
//!     the communicator cannot tell; step() finds it (stage 3: the gathers of buckets 1 and 2).
//!   prefetch = true (stage 3): rank 1's prefetch, following its order, gathers bucket 0 again
//!     where the others reduce-scatter bucket 2, so the communicator meets an all-gather against
//!     a reduce-scatter (the thread backend and MPI with its argument check see it; the optimizer
//!     turns that into the same message). Where it surfaces depends on the backend: the
//!     thread backend reports it when the collective is waited for (step()), MPI's argument check
//!     when it is started (rank 1's parameters(), the others' grad_ready()).
template <int Stage, class Comm>
void different_orders(Comm& comm, bool prefetch = false) {
  if (comm.size() < 2) return;
  const auto spec = three_layers();
  auto options = buckets_of(32);
  options.prefetch = prefetch;
  auto later_steps = [&](optimizer<Stage, Comm>& z) {
    for (int s = 1; s < 3; ++s) {
      toy::step_samples(comm, z, spec, s);
      z.step();
    }
    return toy::parameters(z, spec);
  };
  optimizer<Stage, Comm> reference(comm, spec, sgd(), options);
  toy::initialise(reference, spec);
  const auto expected = later_steps(reference);

  optimizer<Stage, Comm> z(comm, spec, sgd(), options);
  toy::initialise(z, spec);
  toy::walk data_dependent;
  if (comm.rank() == 1) data_dependent.forward = {0, 2, 1};
  const auto what = usage_message([&] {
    toy::step_samples(comm, z, spec, 0, data_dependent);
    z.step();
  });
  INFO(what);
  CHECK(contains(what, "the ranks issued their bucket collectives in different orders"));
  if (Stage == 3 && prefetch) {
    CHECK(contains(what, "collective 4 was the reduce-scatter of bucket 2 of 3 (layers 2..2) on rank 0 but the all-gather of "
                         "bucket 0 of 3 (layers 0..0) on rank 1"));
    CHECK(contains(what, "prefetch"));
  } else if (Stage == 3) {
    CHECK(contains(what, "step: the ranks issued their bucket collectives in different orders"));
    CHECK(contains(what, "collective 2 was the all-gather of bucket 1 of 3 (layers 1..1) on rank 0 but the all-gather of "
                         "bucket 2 of 3 (layers 2..2) on rank 1"));
  } else {
    const std::string kind = Stage < 2 ? "all-reduce" : "reduce-scatter";
    CHECK(contains(what, "step: the ranks issued their bucket collectives in different orders"));
    CHECK(contains(what, "the " + kind + " of bucket 2 of 3 (layers 2..2) on rank 0 but the " + kind +
                             " of bucket 1 of 3 (layers 1..1) on rank 1"));
  }
  CHECK(contains(what, "Expected every rank to touch its layers"));
  CHECK(contains(what, "Nothing was applied"));
  CHECK(later_steps(z) == expected);
}

//! Rank 1 adds to layer 2's gradients after grad_ready(2): through a span it held from before
//! (`old_span`) or through a new gradients() call. step() throws the same usage_error on every
//! rank, naming rank 1 and the bucket, and applies nothing. Needs checked mode, except for a new
//! gradients() call in stages 2-3 (a micro-batch that is never reduced, caught in any mode).
template <int Stage, class Comm>
void written_after_ready(Comm& comm, bool checked, bool old_span) {
  if (comm.size() < 2) return;
  const auto spec = three_layers();
  auto options = buckets_of(32);
  options.check_usage = checked;
  auto one_step = [&](optimizer<Stage, Comm>& z) {
    toy::step_samples(comm, z, spec, 1);
    z.step();
    return toy::parameters(z, spec);
  };
  optimizer<Stage, Comm> reference(comm, spec, sgd(), options);
  toy::initialise(reference, spec);
  const auto expected = one_step(reference);

  optimizer<Stage, Comm> z(comm, spec, sgd(), options);
  toy::initialise(z, spec);
  std::optional<trident::space_span<float, typename Comm::space>> held;
  toy::walk late;
  late.before_ready = [&](int layer) {
    if (layer == 2) held = z.gradients("c");
  };
  late.after_ready = [&](int layer) {
    if (comm.rank() != 1 || layer != 2) return;
    // Too late: bucket 2's reduction has (or may have) taken its gradients.
    zero_training::on_host(comm, old_span ? *held : z.gradients("c"), [](std::span<float> g) { g[3] += 1.0f; });
  };
  toy::step_samples(comm, z, spec, 0, late);
  const auto what = usage_message([&] { z.step(); });
  INFO(what);
  if (Stage >= 2 && !old_span)
    CHECK(contains(what, "step: on rank 1, gradients of bucket 2 of 3 (layers 2..2) were written after the bucket's last "
                         "reduction and never reduced"));
  else
    CHECK(contains(what, "step: on rank 1, gradients of bucket 2 of 3 (layers 2..2) were written after grad_ready()"));
  CHECK(contains(what, "Nothing was applied"));
  CHECK(one_step(z) == expected);
}

//! Stage 3, checked mode: a parameters() span read after release() holds NaN (a forward through
//! it computes NaN), even while another bucket of the same size is gathered; gathered again, the
//! bucket is back in the same memory, so the old span sees this bucket's values, never another's.
template <class Comm>
void stale_parameters_read_nan(Comm& comm) {
  const auto spec = three_layers();
  auto options = buckets_of(32);
  options.check_usage = true;
  options.prefetch = false;
  optimizer<3, Comm> z(comm, spec, sgd(), options);
  toy::initialise(z, spec);
  auto a = z.parameters("a");
  const std::vector<float> before = zero_training::to_host(comm, a);
  for (float v : before) CHECK(std::isfinite(v));
  z.release(0);
  (void)z.parameters("b");
  bool all_nan = true;
  for (float v : zero_training::to_host(comm, a)) all_nan = all_nan && std::isnan(v);
  CHECK(all_nan);
  auto again = z.parameters("a");
  CHECK(again.data() == a.data());
  CHECK(zero_training::to_host(comm, again) == before);
  toy::step_samples(comm, z, spec, 0);
  auto b = z.parameters("b");
  z.step();  // releases every bucket
  CHECK(std::isnan(zero_training::to_host(comm, b)[0]));
}

//! Checked mode changes no result: the MLP and the toy model with two micro-batches per step
//! train bit for bit as without it.
template <int Stage, class Comm>
void checked_mode_is_exact(Comm& comm) {
  auto checked = zero_training::small_buckets();
  checked.check_usage = true;
  auto unchecked = checked;
  unchecked.check_usage = false;
  CHECK(zero_training::by_name<Stage>(comm, sgd(), 5, checked) == zero_training::by_name<Stage>(comm, sgd(), 5, unchecked));
  const auto spec = three_layers();
  auto toy_options = buckets_of(32);
  toy_options.check_usage = true;
  const auto a = toy::train<Stage>(comm, spec, sgd(), toy_options, 3, {}, 2);
  toy_options.check_usage = false;
  CHECK(toy::train<Stage>(comm, spec, sgd(), toy_options, 3, {}, 2) == a);
}

//! Handles see the same memory as names; another optimizer's handle or an empty one is refused.
template <int Stage, class Comm>
void handles(Comm& comm) {
  const auto spec = three_layers();
  optimizer<Stage, Comm> z(comm, spec, sgd(), buckets_of(32));
  optimizer<Stage, Comm> other(comm, spec, sgd(), buckets_of(64));
  toy::initialise(z, spec);
  const auto b = z.handle("b");
  CHECK(z.parameters(b).data() == z.parameters("b").data());
  CHECK(z.parameters(b).size() == 32);
  CHECK(z.gradients(b).data() == z.gradients("b").data());
  CHECK_THROWS_WITH_AS((void)other.parameters(b), doctest::Contains("parameters: the tensor handle comes from another layout"),
                       trident::usage_error);
  CHECK_THROWS_WITH_AS((void)z.gradients(trident::tensor_handle{}), doctest::Contains("gradients: the tensor handle is empty"),
                       trident::usage_error);
  CHECK_THROWS_WITH_AS((void)z.handle("nope"), doctest::Contains("handle: no tensor named 'nope'"), trident::usage_error);
  CHECK_THROWS_WITH_AS((void)z.parameters("nope"), doctest::Contains("parameters: no tensor named 'nope'"), trident::usage_error);
}

}  // namespace misuse_suite
