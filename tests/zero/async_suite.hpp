#pragma once
// zero_optimizer::step_async against step(), one test body per behaviour, written against the
// communicator concept: thread ranks (test_zero_async.cpp), MPI (test_zero_mpi.cpp) and NCCL
// (test_zero_graph_nccl.cu, where the step is also captured into a CUDA graph). The toy model
// (zero_training.hpp) reads and writes the optimizer's spans through to_host / on_host, so the
// bodies run in any memory space. On host memory the deferred step is step(), bit for bit; on a
// device its update computes the optimizer's scalars with the device's pow, so `tolerance` there.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "trident/parallel/data/zero_optimizer.hpp"
#include "zero/zero_training.hpp"

namespace async_suite {

namespace zero = trident::zero;
namespace toy = zero_training::toy;

//! Two layers sharing a bucket, one alone, one without tensors: several buckets and pieces.
inline trident::model_spec model() {
  trident::model_spec s;
  s.add("a", {40}, 0).add("b", {6, 5}, 0).add("c", {70}, 1).add("d", {9}, 3);
  return s;
}
inline trident::model_spec equal_layers() {  // three buckets of 32 (see misuse_suite::three_layers)
  trident::model_spec s;
  s.add("a", {32}, 0).add("b", {4, 8}, 1).add("c", {32}, 2);
  return s;
}
inline zero::zero_options options(std::size_t bucket_elements, float max_grad_norm) {
  zero::zero_options o;
  o.bucket_bytes = o.first_bucket_bytes = bucket_elements * sizeof(float);
  o.persistence_threshold = 0;  // stage 3 really gathers and releases
  o.max_grad_norm = max_grad_norm;
  o.check_usage = false;  // step_async refuses checked mode
  return o;
}
inline trident::optim::adamw adamw() {
  trident::optim::adamw o;
  o.opt.lr = 0.05f;
  return o;
}
inline trident::optim::sgd sgd() {  // momentum: its first step is another update type
  trident::optim::sgd o;
  o.opt.lr = 0.1f;
  o.opt.momentum = 0.9f;
  o.opt.nesterov = true;
  return o;
}

inline double worst(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double w = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]) / (std::fabs(static_cast<double>(b[i])) + 1e-6);
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    if (d > w) w = d;
  }
  return w;
}

//! The norms of two runs: equal on host memory; on a device within what one float scalar's last
//! bit (the device's pow) makes of the later gradients.
inline doctest::Approx same_norm(double expected, double tolerance) {
  return doctest::Approx(expected).epsilon(tolerance == 0 ? 1e-12 : 1e-5);
}

//! Seven steps, clipped (the small max_grad_norm clips every one), through step() and through
//! step_async(): the async run reads its results only after steps 1, 2 and 7, so several deferred
//! steps queue behind each other, and steps 4-5 go through step() in between (the count moves
//! from the device to the host and back; a last_step() with nothing pending leaves it).
//! Same parameters, norms, counts.
template <int Stage, class Precision, class Opt, class Comm>
void same_as_step(Comm& comm, Opt opt, double tolerance) {
  const auto spec = model();
  const auto o = options(64, 0.05f);
  zero::zero_optimizer<Stage, Opt, Comm, Precision> reference(comm, spec, opt, o);
  zero::zero_optimizer<Stage, Opt, Comm, Precision> deferred(comm, spec, opt, o);
  toy::initialise(reference, spec);
  toy::initialise(deferred, spec);
  for (int s = 0; s < 7; ++s) {
    toy::step_samples(comm, reference, spec, s);
    const auto expected = reference.step();
    CHECK(expected.grad_norm > 0.05);  // clipped
    toy::step_samples(comm, deferred, spec, s);
    if (s == 3 || s == 4) {
      const auto got = deferred.step();
      CHECK(got.grad_norm == same_norm(expected.grad_norm, tolerance));
      if (s == 4) {
        CHECK(deferred.last_step().applied);  // nothing pending: the host's count stays
        CHECK(deferred.steps_taken() == reference.steps_taken());
      }
    } else {
      deferred.step_async();
      if (s == 0 || s == 1 || s == 6) {
        const auto got = deferred.last_step();
        CHECK(got.applied);
        CHECK(got.grad_norm == same_norm(expected.grad_norm, tolerance));
        CHECK(got.loss_scale == expected.loss_scale);
        CHECK(deferred.steps_taken() == reference.steps_taken());
      }
    }
  }
  const auto want = toy::parameters(reference, spec), got = toy::parameters(deferred, spec);
  INFO("stage ", Stage, ", rank ", comm.rank(), ": largest relative difference ", worst(got, want));
  if (tolerance == 0) CHECK(got == want);
  else CHECK(worst(got, want) <= tolerance);
  CHECK(deferred.steps_taken() == 7);
}

//! A non-finite gradient on rank 1 skips the deferred step on every rank, as step() does: the
//! parameters and the step count stay, and the next steps match the reference's, which skipped
//! the same step through step().
template <int Stage, class Precision, class Comm>
void skipped_everywhere(Comm& comm, double tolerance) {
  if (comm.size() < 2) return;
  const auto spec = model();
  const auto o = options(64, 0.0f);
  using Z = zero::zero_optimizer<Stage, trident::optim::adamw, Comm, Precision>;
  Z reference(comm, spec, adamw(), o), deferred(comm, spec, adamw(), o);
  toy::initialise(reference, spec);
  toy::initialise(deferred, spec);
  toy::walk poisoned;
  auto inject = [&](Z& target) {
    poisoned.before_ready = [&comm, z = &target](int layer) {
      if (layer != 1 || comm.rank() != 1) return;
      using H = typename Z::half_type;
      zero_training::on_host(comm, z->gradients("c"), [](std::span<H> g) { g[3] = H(std::numeric_limits<float>::infinity()); });
    };
  };
  for (int s = 0; s < 4; ++s) {
    if (s == 1) inject(reference);
    toy::step_samples(comm, reference, spec, s, s == 1 ? poisoned : toy::walk{});
    CHECK(reference.step().applied == (s != 1));
    if (s == 1) inject(deferred);
    const auto before = toy::parameters(deferred, spec);
    toy::step_samples(comm, deferred, spec, s, s == 1 ? poisoned : toy::walk{});
    deferred.step_async();
    const auto r = deferred.last_step();
    CHECK(r.applied == (s != 1));
    if (s == 1) {
      CHECK_FALSE(std::isfinite(r.grad_norm));
      CHECK(toy::parameters(deferred, spec) == before);
      CHECK(deferred.steps_taken() == 1);
    }
  }
  const auto want = toy::parameters(reference, spec), got = toy::parameters(deferred, spec);
  INFO("stage ", Stage, ", rank ", comm.rank(), ": largest relative difference ", worst(got, want));
  if (tolerance == 0) CHECK(got == want);
  else CHECK(worst(got, want) <= tolerance);
  CHECK(deferred.steps_taken() == 3);
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

template <class F>
std::string usage_message(F&& f) {
  try {
    f();
  } catch (const trident::usage_error& e) {
    return e.what();
  }
  return "(no usage_error)";
}

//! Rank 1 walks its layers in another order, so the ranks' bucket collectives differ: the
//! deferred step is skipped on every rank, the next last_step() says why on every rank (once),
//! and training goes on as if that step never was.
template <int Stage, class Comm>
void different_orders(Comm& comm, double tolerance) {
  if (comm.size() < 2) return;
  const auto spec = equal_layers();
  auto o = options(32, 0.0f);
  // Without prefetch the collectives differ only in which equal-sized bucket they carry, so the
  // communicator cannot tell and the reports must (with it, see misuse_suite::different_orders).
  o.prefetch = false;
  using Z = zero::zero_optimizer<Stage, trident::optim::sgd, Comm>;
  auto later_steps = [&](Z& z) {
    for (int s = 1; s < 3; ++s) {
      toy::step_samples(comm, z, spec, s);
      z.step_async();
    }
    CHECK(z.last_step().applied);
    return toy::parameters(z, spec);
  };
  Z reference(comm, spec, sgd(), o);
  toy::initialise(reference, spec);
  const auto expected = later_steps(reference);

  Z z(comm, spec, sgd(), o);
  toy::initialise(z, spec);
  toy::walk data_dependent;
  if (comm.rank() == 1) data_dependent.forward = {0, 2, 1};
  toy::step_samples(comm, z, spec, 0, data_dependent);
  z.step_async();  // returns: the decision is on the device
  const auto what = usage_message([&] { z.last_step(); });
  INFO(what);
  CHECK(contains(what, "last_step: a step_async() was skipped on every rank because the ranks issued their bucket "
                       "collectives in different orders"));
  CHECK(contains(what, "Nothing was applied"));
  CHECK(z.steps_taken() == 0);
  CHECK(z.last_step().applied);  // said once
  const auto got = later_steps(z);
  if (tolerance == 0) CHECK(got == expected);
  else CHECK(worst(got, expected) <= tolerance);
}

//! What decides on the host is refused by name, before anything is queued; a pending step's
//! count is not handed to a checkpoint.
template <class Comm>
void refusals(Comm& comm) {
  const auto spec = model();
  {
    zero::zero_optimizer<1, trident::optim::adamw, Comm, trident::mixed_precision<trident::fp16>> z(comm, spec, adamw(),
                                                                                                   options(64, 0.0f));
    toy::initialise(z, spec);
    toy::step_samples(comm, z, spec, 0);
    const auto what = usage_message([&] { z.step_async(); });
    CHECK(contains(what, "step_async on rank"));
    CHECK(contains(what, "the loss scaler changes its scale"));
    CHECK(z.step().applied);  // nothing was queued: step() goes on
  }
  {
    auto checked = options(64, 0.0f);
    checked.check_usage = true;
    zero::zero_optimizer<2, trident::optim::adamw, Comm> z(comm, spec, adamw(), checked);
    toy::initialise(z, spec);
    toy::step_samples(comm, z, spec, 0);
    CHECK(contains(usage_message([&] { z.step_async(); }), "checked mode"));
    CHECK(z.step().applied);
  }
  {
    zero::zero_optimizer<0, trident::optim::adamw, Comm> z(comm, spec, adamw(), options(64, 0.0f));
    z.reduce_gradients_with(std::make_shared<trident::compress::exact>());
    toy::initialise(z, spec);
    toy::step_samples(comm, z, spec, 0);
    CHECK(contains(usage_message([&] { z.step_async(); }), "a gradient reducer"));
    CHECK(z.step().applied);
  }
  {
    zero::zero_optimizer<3, trident::optim::adamw, Comm> z(comm, spec, adamw(), options(64, 0.0f));
    toy::initialise(z, spec);
    toy::step_samples(comm, z, spec, 0);
    z.step_async();
    CHECK(contains(usage_message([&] { (void)z.checkpoint_counters(); }), "call last_step() first"));
    CHECK(z.last_step().applied);
    CHECK(z.checkpoint_counters().steps == 1);
  }
}

}  // namespace async_suite
