#pragma once
// The 3-D process grid: a world communicator cut into tensor-, data- and pipeline-parallel
// groups, Megatron-style.
//
//   enum class grid_axis              tensor, data, pipeline
//   struct grid_order                 which axis varies fastest over consecutive ranks
//   template <communicator C>         process_grid: the sizes, this rank's coordinates, one
//                                     communicator per axis and one for the model group
//                                     (tensor x pipeline), made with split
//
// With Megatron's default order (tensor fastest, then data, then pipeline) world rank
//   r = t + T * (d + D * p)
// so a tensor-parallel group is T consecutive ranks (on one node, where its traffic is heaviest)
// and pipeline stages are the farthest apart.
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <string>

#include "trident/comm/communicator.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/error.hpp"

namespace trident {

enum class grid_axis { tensor = 0, data = 1, pipeline = 2 };

constexpr std::string_view name_of(grid_axis a) noexcept {
  switch (a) {
    case grid_axis::tensor: return "tensor";
    case grid_axis::data: return "data";
    case grid_axis::pipeline: return "pipeline";
  }
  return "unknown";
}

//! The axes from the fastest-varying (neighbouring ranks) to the slowest.
struct grid_order {
  std::array<grid_axis, 3> fastest_first{grid_axis::tensor, grid_axis::data, grid_axis::pipeline};

  //! Megatron-LM's order: tensor, data, pipeline.
  static constexpr grid_order megatron() { return {}; }
};

//! A world communicator split into the three axes of 3-D parallelism. The data-parallel size
//! is inferred: world size / (tensor size x pipeline size), which must divide exactly.
//! Construction is collective (every rank of `world` calls it with the same sizes and order;
//! one all-reduce checks that they do, so ranks that disagree all get a usage_error instead of
//! a grid whose groups contradict each other). The grid owns the axis communicators; `world`
//! must outlive it.
//!
//!   trident::local_world::run(8, [](trident::local_comm& world) {
//!     trident::process_grid grid(world, /*tensor=*/2, /*pipeline=*/2);   // data = 2
//!     grid.data().all_reduce(grads, trident::reduce_op::avg);
//!     if (grid.coordinate(trident::grid_axis::pipeline) == 0) { ... }     // first stage
//!   });
template <communicator C>
class process_grid {
 public:
  process_grid(C& world, int tensor_size, int pipeline_size, grid_order order = grid_order::megatron())
      : world_(&world), order_(order), rank_(world.rank()) {
    const int n = world.size();
    // First, so that every rank reaches it: a rank that rejected its own sizes before the
    // collective would leave the others waiting in it (under MPI, for good).
    check_agreement(world, tensor_size, pipeline_size);
    TRIDENT_EXPECT(tensor_size >= 1 && pipeline_size >= 1, "process_grid: tensor size (", tensor_size,
                   ") and pipeline size (", pipeline_size, ") must be at least 1");
    // In 64 bits: 65536 x 65536 wraps an int to 0 (and n % 0 was a SIGFPE).
    const std::int64_t model_ranks = std::int64_t{tensor_size} * pipeline_size;
    TRIDENT_EXPECT(model_ranks <= n && n % model_ranks == 0, "process_grid: world size ", n,
                   " is not divisible by tensor size (", tensor_size, ") x pipeline size (", pipeline_size, ") = ",
                   model_ranks);
    bool seen[3] = {false, false, false};
    for (grid_axis a : order_.fastest_first) seen[static_cast<int>(a)] = true;
    TRIDENT_EXPECT(seen[0] && seen[1] && seen[2], "process_grid: the order must name tensor, data and pipeline once each");

    sizes_[axis_index(grid_axis::tensor)] = tensor_size;
    sizes_[axis_index(grid_axis::pipeline)] = pipeline_size;
    sizes_[axis_index(grid_axis::data)] = n / (tensor_size * pipeline_size);
    coords_ = coordinates_of(rank_);

    // One split per axis: ranks that agree on the other two coordinates share a group, ordered
    // by their coordinate on this axis.
    for (grid_axis a : {grid_axis::tensor, grid_axis::data, grid_axis::pipeline}) {
      std::array<int, 3> c = coords_;
      c[axis_index(a)] = 0;
      comms_[axis_index(a)].emplace(world.split(rank_of(c), coords_[axis_index(a)]));
    }
    // The model group: every rank at this data coordinate (the tensor and pipeline axes
    // together), ordered by world rank; what a global gradient norm sums over.
    std::array<int, 3> m{};
    m[axis_index(grid_axis::data)] = coords_[axis_index(grid_axis::data)];
    model_.emplace(world.split(rank_of(m), rank_));
  }

  int size(grid_axis a) const noexcept { return sizes_[axis_index(a)]; }
  int coordinate(grid_axis a) const noexcept { return coords_[axis_index(a)]; }
  int tensor_size() const noexcept { return size(grid_axis::tensor); }
  int data_size() const noexcept { return size(grid_axis::data); }
  int pipeline_size() const noexcept { return size(grid_axis::pipeline); }
  const grid_order& order() const noexcept { return order_; }

  C& comm(grid_axis a) noexcept { return *comms_[axis_index(a)]; }
  C& tensor() noexcept { return comm(grid_axis::tensor); }
  C& data() noexcept { return comm(grid_axis::data); }
  C& pipeline() noexcept { return comm(grid_axis::pipeline); }
  C& world() noexcept { return *world_; }
  //! The ranks at this rank's data coordinate: tensor x pipeline ranks holding, between them,
  //! one whole copy of the model (the model-parallel group of a clipped zero_optimizer under
  //! pipeline parallelism).
  C& model() noexcept { return *model_; }

  //! The world rank at coordinates {tensor, data, pipeline}.
  int rank_of(const std::array<int, 3>& coordinates) const {
    int r = 0;
    for (int i = 2; i >= 0; --i) {
      const auto a = axis_index(order_.fastest_first[static_cast<std::size_t>(i)]);
      TRIDENT_EXPECT(coordinates[a] >= 0 && coordinates[a] < sizes_[a], "process_grid: ", name_of(static_cast<grid_axis>(a)),
                     " coordinate ", coordinates[a], " is outside 0..", sizes_[a] - 1);
      r = r * sizes_[a] + coordinates[a];
    }
    return r;
  }
  //! The coordinates {tensor, data, pipeline} of a world rank.
  std::array<int, 3> coordinates_of(int world_rank) const {
    TRIDENT_EXPECT(world_rank >= 0 && world_rank < sizes_[0] * sizes_[1] * sizes_[2], "process_grid: rank ", world_rank,
                   " is outside the grid of ", sizes_[0] * sizes_[1] * sizes_[2]);
    std::array<int, 3> c{};
    for (grid_axis a : order_.fastest_first) {
      const auto i = axis_index(a);
      c[i] = world_rank % sizes_[i];
      world_rank /= sizes_[i];
    }
    return c;
  }

 private:
  static constexpr std::size_t axis_index(grid_axis a) noexcept { return static_cast<std::size_t>(a); }

  // One max all-reduce of (x, -x) for each value gives every rank the maximum and the minimum,
  // so every rank reaches the same verdict (the same trick as MPI's optional argument check).
  void check_agreement(C& world, int tensor_size, int pipeline_size) {
    std::array<std::int64_t, 10> mine{};
    const std::int64_t values[5] = {tensor_size, pipeline_size, static_cast<int>(order_.fastest_first[0]),
                                    static_cast<int>(order_.fastest_first[1]), static_cast<int>(order_.fastest_first[2])};
    for (std::size_t i = 0; i < 5; ++i) {
      mine[2 * i] = values[i];
      mine[2 * i + 1] = -values[i];
    }
    buffer<std::int64_t, typename C::space> shared(mine.size(), mem_category::communication);
    copy(std::span<const std::int64_t>(mine), shared);
    world.all_reduce(shared, reduce_op::max);
    world.synchronize();
    std::array<std::int64_t, 10> all{};
    copy(shared, std::span<std::int64_t>(all));
    const char* names[5] = {"tensor size", "pipeline size", "order[0]", "order[1]", "order[2]"};
    for (std::size_t i = 0; i < 5; ++i) {
      const std::int64_t hi = all[2 * i], lo = -all[2 * i + 1];
      TRIDENT_EXPECT(hi == lo, "process_grid on rank ", world.rank(), ": ranks disagree on the ", names[i], " (from ", lo,
                     " to ", hi, "; this rank passed ", values[i], "); every rank must build the grid with the same "
                     "sizes and order");
    }
  }

  C* world_;
  grid_order order_;
  int rank_;
  std::array<int, 3> sizes_{};   // indexed by grid_axis
  std::array<int, 3> coords_{};  // indexed by grid_axis
  std::array<std::optional<C>, 3> comms_;
  std::optional<C> model_;
};

}  // namespace trident
