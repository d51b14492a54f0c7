#pragma once
// Flat storage for data parallelism and ZeRO: tensors registered by name, shape and layer,
// packed into one contiguous buffer, cut into size-capped buckets, each bucket padded so it
// splits evenly over the data-parallel group. How a bucket, and a `sharded<T>`, is divided is
// the one rule of model/sharding.hpp (a 1-D `sharding::split`), the same that tensor
// parallelism and checkpoints use.
//
//   struct model_spec        tensors by name, shape and layer, in forward order
//   class tensor_handle      a tensor of one flat_layout, resolved once: look-ups by index, not name
//   class flat_layout        offsets of tensors and buckets; which piece of each bucket a rank owns
//   class sharded<T, Space>  one flat buffer partitioned over a group, with padding: the local
//                            shard, all_gather into the full buffer, reduce_scatter from it
//
// Why buckets are sharded one by one (as in PyTorch FSDP) instead of sharding the whole buffer
// once: a bucket can then be reduce-scattered the moment its gradients are ready, with equal
// chunks, and a ZeRO-3 layer can be gathered without touching the rest. A rank's shard is the
// concatenation of its piece of every bucket; element-wise optimizers do not care.
//
// Layers without tensors are legal anywhere (a model's first layers may hold no parameters):
// each falls in the bucket of the next layer that has tensors and holds no elements of it, so
// whoever tracks "every layer of the bucket is ready" counts only layers with tensors
// (layer_elements() > 0).
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "trident/comm/communicator.hpp"
#include "trident/core/buffer.hpp"
#include "trident/core/error.hpp"
#include "trident/model/sharding.hpp"

namespace trident {

//! How a tensor of one rank's model relates to the other ranks of its model-parallel group
//! (tensor parallelism): a `shard` is this rank's own part (a column-parallel weight), a
//! `replica` holds the same values on every rank of the group (a LayerNorm, a row-parallel
//! bias). The global gradient norm counts shards on every rank and replicas once, as
//! Megatron-LM's clipping does. Without model parallelism every tensor is its own shard.
enum class model_copy { shard, replica };

//! The parameters of a model: name, shape and the layer that uses them (layers are numbered in
//! forward order; ZeRO-3 gathers parameters layer by layer, and buckets never split a layer),
//! and, under tensor parallelism, whether this rank's tensor is a shard or a replica.
//!
//! Registered with its global sharding (model/sharding.hpp) and this rank's part, a tensor also
//! says what it is a part of: its global shape and split axis, which is what lets a checkpoint
//! written at one tensor-parallel size be loaded at another. Registered by shape, it is whole
//! (a replicated sharding of that shape, part 0).
//!
//!   trident::model_spec spec;
//!   spec.add("fc1.weight", {256, 784}, 0).add("fc1.bias", {256}, 0).add("fc2.weight", {10, 256}, 1);
//!   spec.add("ln.weight", {768}, 2, trident::model_copy::replica);
//!   spec.bucket_boundary(2);   // no bucket holds tensors of layers both below and from layer 2
//!   // Tensor parallelism: rank t of the tensor group holds part t of the global weight.
//!   spec.add("h0.mlp.fc1.weight", trident::sharding::split_exact({3072, 768}, 0, 4), t, 3);
class model_spec {
 public:
  struct tensor {
    std::string name;
    std::vector<std::size_t> shape;  // this rank's (local) shape
    int layer;
    std::size_t numel;
    model_copy copy = model_copy::shard;
    sharding global = sharding::replicated({});  // what it is a part of (set by add)
    int part = 0;                                // which part: the rank in the tensor-parallel group
  };

  model_spec& add(std::string name, std::vector<std::size_t> shape, int layer, model_copy copy = model_copy::shard) {
    auto global = sharding::replicated(shape);
    return add_tensor(std::move(name), std::move(shape), layer, copy, std::move(global), 0);
  }
  //! Part `part` of a tensor divided as `global` says: local shape global.local_shape(); a split
  //! is this rank's `shard`, a replicated sharding a `replica` (the same on every part).
  model_spec& add(std::string name, const sharding& global, int part, int layer) {
    TRIDENT_EXPECT(part >= 0 && (!global.is_split() || part < global.parts()), "model_spec::add(", name, "): part ", part,
                   " of a tensor split into ", global.parts(), " parts; expected 0..", global.parts() - 1);
    return add_tensor(std::move(name), global.local_shape(), layer, global.is_split() ? model_copy::shard : model_copy::replica, global,
                      part);
  }

 private:
  model_spec& add_tensor(std::string name, std::vector<std::size_t> shape, int layer, model_copy copy, sharding global, int part) {
    TRIDENT_EXPECT(!name.empty(), "model_spec::add: a tensor needs a name");
    TRIDENT_EXPECT(layer >= 0, "model_spec::add(", name, "): layer ", layer, " must be >= 0");
    TRIDENT_EXPECT(tensors_.empty() || layer >= tensors_.back().layer, "model_spec::add(", name, "): layer ", layer,
                   " comes after layer ", tensors_.back().layer, "; add tensors in forward order");
    for (const auto& t : tensors_) TRIDENT_EXPECT(t.name != name, "model_spec::add: tensor '", name, "' is already registered");
    std::size_t n = 1;
    for (std::size_t d : shape) n *= d;
    TRIDENT_EXPECT(n > 0, "model_spec::add(", name, "): the shape has no elements");
    tensors_.push_back({std::move(name), std::move(shape), layer, n, copy, std::move(global), part});
    return *this;
  }

 public:
  const std::vector<tensor>& tensors() const noexcept { return tensors_; }
  std::size_t parameters() const noexcept {
    std::size_t n = 0;
    for (const auto& t : tensors_) n += t.numel;
    return n;
  }
  int layers() const noexcept { return tensors_.empty() ? 0 : tensors_.back().layer + 1; }

  //! No bucket holds tensors of layers on both sides of the boundary before `layer` (between
  //! layer - 1 and layer). For parts of a model whose gradients are complete at different times
  //! and are marked ready separately: a pipeline rank's virtual stages, or a tied embedding whose
  //! gradient is reduced once per step, after every micro-batch, while the layers beside it are
  //! reduced per micro-batch.
  model_spec& bucket_boundary(int layer) {
    TRIDENT_EXPECT(layer >= 1, "model_spec::bucket_boundary(", layer, "): a boundary lies between two layers, so the layer must be >= 1");
    boundaries_.push_back(layer);
    return *this;
  }
  //! Whether a boundary lies between layer - 1 and layer.
  bool boundary_before(int layer) const noexcept {
    for (const int b : boundaries_)
      if (b == layer) return true;
    return false;
  }

 private:
  std::vector<tensor> tensors_;
  std::vector<int> boundaries_;
};

//! A tensor of one flat_layout, resolved from its name once, so that hot paths (a
//! zero_optimizer's parameters() and gradients() on every micro-batch) index an array instead of
//! searching a map of strings. Valid for the layout that made it and its copies; any other layout
//! rejects it with a usage_error. A default-constructed handle refers to nothing.
//!
//!   const auto fc1 = layout.handle("fc1.weight");
//!   std::size_t at = layout.at(fc1).offset;
class tensor_handle {
 public:
  tensor_handle() = default;
  //! The tensor's position in the model_spec (forward order).
  std::size_t index() const noexcept { return index_; }

 private:
  friend class flat_layout;
  tensor_handle(std::uint64_t layout, std::size_t index) : layout_(layout), index_(index) {}
  std::uint64_t layout_ = 0;  // which layout it belongs to (0: none)
  std::size_t index_ = 0;
};

//! Where everything lives in the flat buffer for a group of `ranks`.
class flat_layout {
 public:
  struct bucket {
    std::size_t begin;        // first element in the full flat buffer
    std::size_t size;         // elements including padding (a multiple of ranks x granule)
    std::size_t used;         // elements of real tensors
    int first_layer, last_layer;  // the layers it covers, some of which may hold no tensors
    std::size_t shard_begin;  // where this rank's piece of it starts in the shard
    sharding split;           // how it divides over the ranks: 1-D, {used} padded to `size`
  };
  struct placement {
    std::size_t offset;  // in the full flat buffer
    std::size_t numel;
    int layer;
    std::size_t bucket;
  };

  //! Buckets collect whole layers, walking backwards from the last layer (the order in which
  //! backward produces gradients), up to `bucket_elements`; the first bucket formed is capped at
  //! `first_bucket_elements` so communication starts early. A layer larger than the cap gets a
  //! bucket of its own. Every bucket is padded to a multiple of ranks x `granule` elements.
  flat_layout(const model_spec& spec, int ranks, std::size_t bucket_elements, std::size_t first_bucket_elements,
              std::size_t granule = 16)
      : ranks_(ranks), id_(next_id()) {
    TRIDENT_EXPECT(ranks >= 1, "flat_layout: expected at least one rank, got ", ranks);
    TRIDENT_EXPECT(bucket_elements >= 1 && first_bucket_elements >= 1, "flat_layout: bucket sizes must be at least one element, got ",
                   bucket_elements, " (bucket_elements) and ", first_bucket_elements, " (first_bucket_elements)");
    TRIDENT_EXPECT(granule >= 1, "flat_layout: the granule must be at least one element, got ", granule);
    TRIDENT_EXPECT(!spec.tensors().empty(), "flat_layout: the model has no parameters");
    const int layers = spec.layers();
    auto& layer_size = layer_elements_;
    layer_size.assign(static_cast<std::size_t>(layers), 0);
    for (const auto& t : spec.tensors()) layer_size[static_cast<std::size_t>(t.layer)] += t.numel;

    // Group layers into buckets from the back. Only a layer with tensors starts a new bucket, so a
    // layer without tensors joins the bucket of the next layer that has some (the last layer always
    // has some): no bucket is empty, and every layer falls in exactly one bucket. (Dropping empty
    // buckets instead left their layers pointing at a bucket that did not cover them.)
    std::vector<std::pair<int, int>> groups;  // [first, last] layer, in backward order
    // A boundary (model_spec::bucket_boundary) between the layers gathered so far and the next
    // layer with tensors closes the bucket as a full one does.
    int last = layers - 1;
    std::size_t cap = first_bucket_elements, filled = 0;
    bool crossed = false;
    for (int l = layers - 1; l >= 0; --l) {
      if (spec.boundary_before(l + 1)) crossed = true;
      const std::size_t s = layer_size[static_cast<std::size_t>(l)];
      if (filled > 0 && s > 0 && (crossed || filled + s > cap)) {
        groups.push_back({l + 1, last});
        last = l;
        filled = 0;
        cap = bucket_elements;
      }
      if (s > 0) crossed = false;
      filled += s;
    }
    groups.push_back({0, last});
    std::reverse(groups.begin(), groups.end());  // memory order = forward order

    std::size_t begin = 0, shard = 0;
    for (auto [first, end_layer] : groups) {
      std::size_t used = 0;
      for (int l = first; l <= end_layer; ++l) used += layer_size[static_cast<std::size_t>(l)];
      sharding split = sharding::split({used}, 0, ranks, granule);
      const std::size_t size = split.padded_extent();
      buckets_.push_back({begin, size, used, first, end_layer, shard, std::move(split)});
      begin += size;
      shard += buckets_.back().split.part_extent();
    }
    full_size_ = begin;
    shard_size_ = shard;
    layer_bucket_.assign(static_cast<std::size_t>(layers), 0);
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      for (int l = buckets_[b].first_layer; l <= buckets_[b].last_layer; ++l) layer_bucket_[static_cast<std::size_t>(l)] = b;
    std::vector<std::size_t> cursor(buckets_.size());
    for (std::size_t b = 0; b < buckets_.size(); ++b) cursor[b] = buckets_[b].begin;
    for (const auto& t : spec.tensors()) {
      const std::size_t b = layer_bucket_[static_cast<std::size_t>(t.layer)];
      const placement p{cursor[b], t.numel, t.layer, b};
      placements_.emplace(t.name, p);
      index_.emplace(t.name, by_index_.size());
      by_index_.push_back(p);
      names_.push_back(t.name);
      specs_.push_back(t);
      cursor[b] += t.numel;
    }
    parameters_ = spec.parameters();
  }

  int ranks() const noexcept { return ranks_; }
  const std::vector<bucket>& buckets() const noexcept { return buckets_; }
  std::size_t full_size() const noexcept { return full_size_; }
  std::size_t shard_size() const noexcept { return shard_size_; }
  std::size_t parameters() const noexcept { return parameters_; }
  //! Elements added so that every bucket divides evenly (part of full_size()).
  std::size_t padding() const noexcept { return full_size_ - parameters_; }
  //! Layers of the model: 0 .. layers() - 1, some of which may hold no tensors.
  int layers() const noexcept { return static_cast<int>(layer_bucket_.size()); }
  //! The bucket whose layers include `layer` (for a layer without tensors: the bucket it falls
  //! in, which holds none of its elements). `what` names the caller in the error.
  std::size_t bucket_of_layer(int layer, const char* what = "flat_layout::bucket_of_layer") const {
    check_layer(layer, what);
    return layer_bucket_[static_cast<std::size_t>(layer)];
  }
  //! Elements of the tensors of `layer`: 0 for a layer without tensors.
  std::size_t layer_elements(int layer, const char* what = "flat_layout::layer_elements") const {
    check_layer(layer, what);
    return layer_elements_[static_cast<std::size_t>(layer)];
  }
  const placement& find(const std::string& name) const {
    auto it = placements_.find(name);
    TRIDENT_EXPECT(it != placements_.end(), "flat_layout: no tensor named '", name, "'");
    return it->second;
  }
  const std::map<std::string, placement>& placements() const noexcept { return placements_; }
  //! The tensor `name`, resolved once (a usage_error naming `what` if there is none).
  tensor_handle handle(const std::string& name, const char* what = "flat_layout::handle") const {
    auto it = index_.find(name);
    TRIDENT_EXPECT(it != index_.end(), what, ": no tensor named '", name, "'");
    return {id_, it->second};
  }
  //! Where the tensor of a handle lives: an index, no name search.
  const placement& at(tensor_handle h, const char* what = "flat_layout::at") const {
    TRIDENT_EXPECT(h.layout_ == id_ && h.index_ < by_index_.size(), what, ": the tensor handle ",
                   h.layout_ == 0 ? "is empty (default-constructed)" : "comes from another layout",
                   "; expected one made by handle(name) of this layout (or of the optimizer that owns it)");
    return by_index_[h.index_];
  }
  //! The name of the tensor of a handle.
  const std::string& name(tensor_handle h) const {
    (void)at(h, "flat_layout::name");
    return names_[h.index_];
  }
  //! Tensors of the model, in model_spec order; at_index(i) and name_at(i) index them (for
  //! whoever walks every tensor, as a checkpoint does).
  std::size_t tensors() const noexcept { return by_index_.size(); }
  const placement& at_index(std::size_t i) const {
    TRIDENT_EXPECT(i < by_index_.size(), "flat_layout::at_index(", i, "): the model has ", by_index_.size(), " tensors");
    return by_index_[i];
  }
  const std::string& name_at(std::size_t i) const {
    TRIDENT_EXPECT(i < names_.size(), "flat_layout::name_at(", i, "): the model has ", names_.size(), " tensors");
    return names_[i];
  }
  //! The tensor as the model_spec registered it (local shape, global sharding and part).
  const model_spec::tensor& spec_at(std::size_t i) const {
    TRIDENT_EXPECT(i < specs_.size(), "flat_layout::spec_at(", i, "): the model has ", specs_.size(), " tensors");
    return specs_[i];
  }
  //! Elements of each rank's piece of bucket b.
  std::size_t piece_size(std::size_t b) const noexcept { return buckets_[b].split.part_extent(); }
  //! Where rank r's piece of bucket b starts in the full flat buffer.
  std::size_t piece_begin(std::size_t b, int r) const noexcept {
    return buckets_[b].begin + static_cast<std::size_t>(r) * piece_size(b);
  }

 private:
  // Every layout gets its own identity, shared by its copies, so a handle is only ever read
  // against the offsets it was resolved for.
  static std::uint64_t next_id() noexcept {
    static std::atomic<std::uint64_t> last{0};
    return ++last;
  }
  void check_layer(int layer, const char* what) const {
    TRIDENT_EXPECT(layer >= 0 && static_cast<std::size_t>(layer) < layer_bucket_.size(), what, "(", layer,
                   "): not a layer of the model; expected 0..", layer_bucket_.size() - 1);
  }

  int ranks_;
  std::uint64_t id_;
  std::vector<bucket> buckets_;
  std::vector<std::size_t> layer_bucket_;
  std::vector<std::size_t> layer_elements_;  // per layer: elements of its tensors
  std::map<std::string, placement> placements_;
  std::vector<placement> by_index_;  // the same, in model_spec order, for handles
  std::map<std::string, std::size_t> index_;
  std::vector<std::string> names_;
  std::vector<model_spec::tensor> specs_;
  std::size_t full_size_ = 0, shard_size_ = 0, parameters_ = 0;
};

//! A flat array of `size()` elements partitioned over a group of `ranks`: padded to a multiple
//! of ranks, each rank holding one contiguous shard.
//!
//!   trident::sharded<float> w(1000, comm.rank(), comm.size(), trident::mem_category::parameters);
//!   std::vector<float> full(w.padded_size());
//!   w.all_gather(comm, full);                            // every rank: all shards in order
//!   w.reduce_scatter(comm, full, trident::reduce_op::avg);
template <element_type T, memory_space Space = host_space>
class sharded {
 public:
  sharded(std::size_t size, int rank, int ranks, mem_category category = mem_category::other)
      : split_(checked_split(size, rank, ranks)), rank_(rank), ranks_(ranks) {
    shard_ = buffer<T, Space>(split_.part_extent(), category);
    fill_zero(shard_);  // padding stays zero, so it never disturbs sums or norms
  }

  //! How the array is divided: model/sharding.hpp's rule, as everywhere else.
  const sharding& split() const noexcept { return split_; }
  std::size_t size() const noexcept { return split_.extent(); }
  std::size_t padded_size() const noexcept { return split_.padded_extent(); }
  std::size_t padding() const noexcept { return split_.padding(); }
  std::size_t shard_size() const noexcept { return split_.part_extent(); }
  //! Index in the full array of this rank's first element.
  std::size_t shard_begin() const noexcept { return split_.part_extent() * static_cast<std::size_t>(rank_); }
  buffer<T, Space>& shard() noexcept { return shard_; }
  const buffer<T, Space>& shard() const noexcept { return shard_; }

  template <communicator C>
    requires std::same_as<typename C::space, Space>
  void all_gather(C& comm, space_span<T, Space> full) {
    check(comm, full.size(), "all_gather");
    comm.all_gather(shard_, full);
  }
  template <communicator C>
    requires std::same_as<typename C::space, Space>
  void reduce_scatter(C& comm, space_span<const T, Space> full, reduce_op op = reduce_op::sum) {
    check(comm, full.size(), "reduce_scatter");
    comm.reduce_scatter(full, shard_, op);
  }

 private:
  template <class C>
  void check(C& comm, std::size_t full, const char* what) const {
    TRIDENT_EXPECT(comm.size() == ranks_ && comm.rank() == rank_, "sharded::", what, ": the communicator is rank ", comm.rank(),
                   " of ", comm.size(), " but the array was partitioned for rank ", rank_, " of ", ranks_);
    TRIDENT_EXPECT(full == padded_size(), "sharded::", what, ": the full buffer has ", full, " elements; expected the padded size ",
                   padded_size(), " (", size(), " + ", padding(), " padding)");
  }
  static sharding checked_split(std::size_t size, int rank, int ranks) {
    TRIDENT_EXPECT(ranks >= 1 && rank >= 0 && rank < ranks, "sharded: rank ", rank, " is not in a group of ", ranks);
    return sharding::split({size}, 0, ranks);
  }

  sharding split_;
  int rank_, ranks_;
  buffer<T, Space> shard_;
};

}  // namespace trident
