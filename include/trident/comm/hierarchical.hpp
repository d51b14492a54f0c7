#pragma once
// An all-reduce in levels for ranks grouped into clusters (nodes, or data centres joined by a
// slow link): reduce inside each cluster, exchange across clusters, spread inside again, so that
// the slow links between clusters carry one cluster's worth of data instead of every rank's.
//
//   class hierarchical_all_reduce<Comm>   made once from a communicator and a cluster map (two
//                                         splits), then called like all_reduce
//
// With clusters of equal size k (the usual case) it runs Horovod's and NCCL's two-level scheme:
//   1. reduce_scatter inside the cluster: local rank i holds chunk i of the cluster's sum;
//   2. all_reduce across clusters, among the ranks with the same local index: chunk i of the
//      global result; each of the k ranks sends 1/k of the data over the slow links, in parallel;
//   3. all_gather inside the cluster.
// With clusters of different sizes it falls back to leaders: reduce to each cluster's first rank,
// all_reduce among the leaders, broadcast inside (the leader carries the whole vector across).
// Data not divisible by k is padded in a scratch buffer. Any backend and memory space: the
// levels are the communicator's own collectives (on NCCL, enqueued on its stream).
//
//   std::vector<int> cluster_of = {0, 0, 0, 0, 1, 1, 1, 1};     // two clusters of 4 ranks
//   trident::hierarchical_all_reduce<trident::local_comm> h(comm, cluster_of);
//   h(grads, trident::reduce_op::avg);                          // = comm.all_reduce(grads, avg)
#include <cstddef>
#include <map>
#include <span>
#include <vector>

#include "trident/comm/communicator.hpp"
#include "trident/comm/host_reduce.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/error.hpp"

namespace trident {

template <communicator Comm>
class hierarchical_all_reduce {
 public:
  using space = typename Comm::space;

  //! Collective over `comm` (two splits). cluster_of[r] is rank r's cluster (ids >= 0, the
  //! same list on every rank).
  hierarchical_all_reduce(Comm& comm, std::span<const int> cluster_of)
      : inside_(split_inside(comm, cluster_of)), across_(split_across(comm, cluster_of)), world_(comm.size()) {}

  //! data = op over every rank of the world of data; every rank passes the same size.
  template <class Data>
  void operator()(Data&& data, reduce_op op = reduce_op::sum) {
    auto d = as_space_span<space>(data);
    if (equal_) levels(d, op);
    else leaders(d, op);
  }

  //! True when the clusters have equal sizes (the reduce_scatter / all_gather scheme).
  bool equal_clusters() const noexcept { return equal_; }
  //! The ranks of this rank's cluster.
  Comm& inside() noexcept { return inside_; }
  //! The ranks this rank exchanges with across clusters (equal clusters: one per cluster, the
  //! same local index; otherwise the leaders, with the other ranks in a group of their own).
  Comm& across() noexcept { return across_; }

 private:
  static void check(const Comm& comm, std::span<const int> cluster_of) {
    TRIDENT_EXPECT(cluster_of.size() == static_cast<std::size_t>(comm.size()), "hierarchical_all_reduce: the cluster map places ",
                   cluster_of.size(), " ranks; the communicator has ", comm.size(), " (expected one cluster id per rank)");
    for (std::size_t r = 0; r < cluster_of.size(); ++r)
      TRIDENT_EXPECT(cluster_of[r] >= 0, "hierarchical_all_reduce: rank ", r, " is in cluster ", cluster_of[r],
                     "; expected an id >= 0");
  }
  static Comm split_inside(Comm& comm, std::span<const int> cluster_of) {
    check(comm, cluster_of);
    return comm.split(cluster_of[static_cast<std::size_t>(comm.rank())], comm.rank());
  }
  Comm split_across(Comm& comm, std::span<const int> cluster_of) {
    const int me = comm.rank();
    std::map<int, int> sizes;  // cluster id -> ranks (ids may be any non-negative ints)
    for (int c : cluster_of) ++sizes[c];
    const int k = sizes.begin()->second;
    equal_ = true;
    for (const auto& [id, n] : sizes) equal_ = equal_ && n == k;
    // Ordered by cluster, so that every rank of the across group agrees on its order: the
    // cluster's place among the ids, then the rank.
    int place = 0;
    for (const auto& [id, n] : sizes) {
      if (id == cluster_of[static_cast<std::size_t>(me)]) break;
      ++place;
    }
    const int local = inside_.rank();
    if (equal_) return comm.split(local, place);
    return comm.split(local == 0 ? 0 : 1, place * comm.size() + me);
  }

  template <class T>
  void levels(space_span<T, space> d, reduce_op op) {
    const std::size_t k = static_cast<std::size_t>(inside_.size()), n = d.size();
    const std::size_t chunk = (n + k - 1) / k, at = static_cast<std::size_t>(inside_.rank()) * chunk;
    if (n % k == 0) {
      space_span<T, space> mine(d.data() + at, chunk);
      inside_.reduce_scatter(d, mine, op);
      across_.all_reduce(mine, op);
      inside_.all_gather(mine, d);
      return;
    }
    // Padded to k equal chunks (the padding is reduced too, and dropped).
    buffer<T, space> padded(k * chunk, mem_category::communication);
    inside_.synchronize();  // the copies below are synchronous, the collectives stream-ordered
    fill_zero(padded);
    copy(d, space_span<T, space>(padded.data(), n));
    space_span<T, space> mine(padded.data() + at, chunk);
    inside_.reduce_scatter(padded, mine, op);
    across_.all_reduce(mine, op);
    inside_.all_gather(mine, padded);
    inside_.synchronize();
    copy(space_span<const T, space>(padded.data(), n), d);
  }

  template <class T>
  void leaders(space_span<T, space> d, reduce_op op) {
    // avg does not compose over groups of different sizes: the sum, divided by the world after
    // (fp16/bf16: each input scaled by 1 / world before, so that the sum cannot overflow, as
    // the backends' own avg does).
    const reduce_op level = op == reduce_op::avg ? reduce_op::sum : op;
    TRIDENT_EXPECT(op != reduce_op::avg || space::host_accessible, "hierarchical_all_reduce: avg over clusters of different "
                   "sizes needs host memory (it scales on the host); on ", space::name, " memory use sum and scale");
    constexpr dtype type = dtype_of<std::remove_const_t<T>>;
    if constexpr (space::host_accessible) {
      if (detail::premultiplied_avg(type, op)) detail::host_prescale(type, d.data(), d.data(), d.size(), world_);
    }
    inside_.reduce(d, d, 0, level);
    if (inside_.rank() == 0) across_.all_reduce(d, level);
    inside_.broadcast(d, 0);
    if constexpr (space::host_accessible) {
      if (op == reduce_op::avg && !detail::premultiplied_avg(type, op)) detail::host_divide(type, d.data(), d.size(), world_);
    }
  }

  Comm inside_;
  bool equal_ = true;
  Comm across_;
  int world_;
};

}  // namespace trident
