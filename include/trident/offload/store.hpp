// trident/offload/store.hpp — where a rank's fp32 master weights and optimizer states live
// (ZeRO-Offload, Ren et al. 2021; ZeRO-Infinity, Rajbhandari et al. 2021).
//
// Synopsis
//   enum class offload::tier { memory, host, nvme }    the optimizer's own memory space, host
//                                                     memory, files
//   struct offload::piece                              a run of the state arrays updated at once
//   class  offload::state_store                        the home of the state: pieces brought in
//                                                     and written back in passes
//   class  offload::placement                          what a user passes (zero_options::offload):
//                                                     makes each rank's store
//   std::shared_ptr<const placement> offload::host()   host memory (pinned for device optimizers)
//   offload::nvme(dir, options)                        files through io_uring: offload/nvme.hpp
//   offload::tiered(rule, host, nvme)                  each tensor on the tier rule(name) says
//   double offload::device_bytes_per_parameter(stage, tier, ranks)   ZeRO's formulas, per tier
//
// How zero_optimizer uses a store (parallel/data/zero_optimizer.hpp, stages 1-3): the state it
// would keep as `fields` arrays of `total` floats (the master weights when there are any, then
// each optimizer state, all sharded) lives in the store instead. Each step is one pass over the
// buckets' pieces: begin_pass(order) lets the store bring the next pieces in while the host
// optimizer updates the current one (acquire), release(p, true) writes it back behind the next
// update, end_pass() waits for the writes. The arithmetic is the in-memory optimizer's, on the
// same values in the same order, so offloaded training equals in-memory training bit for bit
// (tests/offload).
//
// A store opts in by deriving from state_store; a placement by deriving from placement. Stores
// are used by one thread (the rank's) at a time.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "trident/core/buffer.hpp"
#include "trident/core/error.hpp"
#include "trident/core/memory_ledger.hpp"

namespace trident::offload {

//! Where the optimizer's fp32 state lives. `memory`: the optimizer's own memory space (no
//! offload; device memory for a CUDA optimizer). `host`: host memory. `nvme`: files.
enum class tier : std::uint8_t { memory, host, nvme };

constexpr std::string_view name_of(tier t) noexcept {
  switch (t) {
    case tier::memory: return "memory";
    case tier::host: return "host";
    case tier::nvme: return "nvme";
  }
  return "unknown";
}

//! Elements [begin, begin + size) of every state array: what one optimizer update touches (a
//! bucket's piece of this rank's shard).
struct piece {
  std::size_t begin = 0;
  std::size_t size = 0;
};

//! What a store holds: `fields` arrays of `total` floats, updated piece by piece. A field is
//! charged to the ledger under its category (master weights: parameters; states:
//! optimizer_state), in the store's space.
struct store_request {
  std::vector<mem_category> fields;  // one per array, in the order acquire() returns them
  std::vector<piece> pieces;         // disjoint, inside [0, total)
  std::size_t total = 0;
  int rank = 0;
  bool for_device = false;  // the optimizer's memory is a device's: host memory should be pinned
  //! Per piece, the names of the tensors of its bucket (the same on every rank), for placements
  //! that choose by tensor; may be empty for a placement that does not.
  std::vector<std::vector<std::string>> tensors;
};

//! The home of a rank's optimizer state. Passes: begin_pass(order), then acquire(p) and
//! release(p, modified) for each p of `order` in turn, then end_pass(). Outside a pass,
//! resident(f) is field f whole when the tier keeps it in memory (nullptr for files).
//!
//!   store.begin_pass(order);
//!   for (std::size_t p : order) { float* const* f = store.acquire(p); update(f[0], f[1], ...); store.release(p, true); }
//!   store.end_pass();
class state_store {
 public:
  virtual ~state_store() = default;
  virtual offload::tier where() const noexcept = 0;
  //! Checks that the store is whole (e.g. its files were not truncated) before a pass changes
  //! anything: a usage_error or trident::error naming what is wrong.
  virtual void verify() const = 0;
  //! Starts a pass over these pieces, in this order (indices into store_request::pieces); the
  //! store may start bringing them in.
  virtual void begin_pass(std::span<const std::size_t> order) = 0;
  //! The fields of the pass's next piece, which must be `p`: one pointer per field, to host
  //! memory holding the piece's `size` floats; valid until release(p).
  virtual float* const* acquire(std::size_t p) = 0;
  //! Done with piece p; `modified`: its values changed and must be kept.
  virtual void release(std::size_t p, bool modified) = 0;
  //! Waits for everything the pass wrote; rethrows the first failure.
  virtual void end_pass() = 0;
  //! Field f whole (`total` floats) if it stays in host memory, else nullptr.
  virtual float* resident(std::size_t f) noexcept = 0;
};

//! A user's choice of tier, which makes each rank's store. zero_options::offload holds one.
class placement {
 public:
  virtual ~placement() = default;
  virtual offload::tier where() const noexcept = 0;
  virtual std::unique_ptr<state_store> make(const store_request& request) const = 0;
};

namespace detail {

inline void check_request(const store_request& r, std::string_view who) {
  TRIDENT_EXPECT(!r.fields.empty(), who, ": a store of no fields");
  for (const piece& p : r.pieces)
    TRIDENT_EXPECT(p.begin <= r.total && p.size <= r.total - p.begin, who, ": piece [", p.begin, ", ", p.begin + p.size,
                   ") outside the ", r.total, " elements of a field");
}

//! Host memory: each field one array, in place; a pass only hands out pointers.
template <memory_space Space>
class host_store final : public state_store {
 public:
  explicit host_store(const store_request& r) : pieces_(r.pieces) {
    check_request(r, "offload::host");
    for (mem_category c : r.fields) {
      buffer<float, Space> b(r.total, c);
      std::fill(b.data(), b.data() + b.size(), 0.0f);
      fields_.push_back(std::move(b));
    }
    pointers_.resize(fields_.size());
  }
  offload::tier where() const noexcept override { return tier::host; }
  void verify() const override {}
  void begin_pass(std::span<const std::size_t>) override {}
  float* const* acquire(std::size_t p) override {
    TRIDENT_EXPECT(p < pieces_.size(), "offload::host: piece ", p, " of ", pieces_.size());
    for (std::size_t f = 0; f < fields_.size(); ++f) pointers_[f] = fields_[f].data() + pieces_[p].begin;
    return pointers_.data();
  }
  void release(std::size_t, bool) override {}
  void end_pass() override {}
  float* resident(std::size_t f) noexcept override { return f < fields_.size() ? fields_[f].data() : nullptr; }

 private:
  std::vector<piece> pieces_;
  std::vector<buffer<float, Space>> fields_;
  std::vector<float*> pointers_;
};

class host_placement final : public placement {
 public:
  offload::tier where() const noexcept override { return tier::host; }
  std::unique_ptr<state_store> make(const store_request& r) const override {
    // Pinned memory is what lets a device's copies run asynchronously at full speed; a host
    // optimizer gains nothing from it (and a build without CUDA has none).
    if (r.for_device) {
      if constexpr (pinned_host_space::available) return std::make_unique<host_store<pinned_host_space>>(r);
    }
    return std::make_unique<host_store<host_space>>(r);
  }
};

//! Pieces on several tiers: each piece in one of `stores`, made from a request of its pieces
//! alone (packed one after another), so each tier holds only its share of the state.
class tiered_store final : public state_store {
 public:
  struct part {
    std::unique_ptr<state_store> store;
    offload::tier where;
  };
  // `home[p]`: which part piece p went to; its index there is its rank among that part's pieces.
  tiered_store(std::vector<part> parts, const std::vector<std::size_t>& home)
      : parts_(std::move(parts)), home_(home), local_(home.size()), orders_(parts_.size()) {
    std::vector<std::size_t> count(parts_.size(), 0);
    for (std::size_t p = 0; p < home_.size(); ++p) local_[p] = count[home_[p]]++;
  }
  offload::tier where() const noexcept override {
    for (const part& t : parts_)
      if (t.where == tier::nvme) return tier::nvme;
    return tier::host;
  }
  void verify() const override {
    for (const part& t : parts_) t.store->verify();
  }
  void begin_pass(std::span<const std::size_t> order) override {
    for (auto& o : orders_) o.clear();
    for (std::size_t p : order) {
      TRIDENT_EXPECT(p < home_.size(), "offload::tiered: piece ", p, " of ", home_.size());
      orders_[home_[p]].push_back(local_[p]);
    }
    for (std::size_t i = 0; i < parts_.size(); ++i) parts_[i].store->begin_pass(orders_[i]);
  }
  float* const* acquire(std::size_t p) override {
    TRIDENT_EXPECT(p < home_.size(), "offload::tiered: piece ", p, " of ", home_.size());
    return parts_[home_[p]].store->acquire(local_[p]);
  }
  void release(std::size_t p, bool modified) override {
    TRIDENT_EXPECT(p < home_.size(), "offload::tiered: piece ", p, " of ", home_.size());
    parts_[home_[p]].store->release(local_[p], modified);
  }
  void end_pass() override {
    for (part& t : parts_) t.store->end_pass();
  }
  // Each tier holds its pieces packed, not the field whole.
  float* resident(std::size_t) noexcept override { return nullptr; }

 private:
  std::vector<part> parts_;
  std::vector<std::size_t> home_, local_;
  std::vector<std::vector<std::size_t>> orders_;
};

class tiered_placement final : public placement {
 public:
  using rule_type = std::function<tier(std::string_view)>;
  tiered_placement(rule_type rule, std::shared_ptr<const placement> host, std::shared_ptr<const placement> nvme)
      : rule_(std::move(rule)), host_(std::move(host)), nvme_(std::move(nvme)) {}
  offload::tier where() const noexcept override { return tier::nvme; }

  std::unique_ptr<state_store> make(const store_request& r) const override {
    check_request(r, "offload::tiered");
    TRIDENT_EXPECT(r.tensors.size() == r.pieces.size(), "offload::tiered: the request names the tensors of ", r.tensors.size(),
                   " pieces; expected all ", r.pieces.size(), " (this optimizer does not say which tensors a piece holds)");
    // Each piece's tier: the one its bucket's tensors agree on.
    std::vector<tier> tier_of(r.pieces.size(), tier::host);
    for (std::size_t p = 0; p < r.pieces.size(); ++p) {
      const std::string* first = nullptr;
      for (const std::string& name : r.tensors[p]) {
        const tier t = rule_(name);
        TRIDENT_EXPECT(t != tier::memory, "offload::tiered: the rule puts tensor '", name,
                       "' on tier memory; a tiered placement sends every tensor's state to host or nvme (without "
                       "zero_options::offload it all stays in the optimizer's memory)");
        if (first == nullptr) {
          first = &name;
          tier_of[p] = t;
        }
        TRIDENT_EXPECT(t == tier_of[p], "offload::tiered: bucket ", p, " holds tensor '", *first, "' (", name_of(tier_of[p]),
                       ") and tensor '", name, "' (", name_of(t),
                       "); a bucket's state lives on one tier: put a model_spec::bucket_boundary between their layers");
      }
    }
    // One store per tier in use, over its own pieces packed from 0.
    std::vector<tiered_store::part> parts;
    std::vector<std::size_t> home(r.pieces.size());
    for (const tier t : {tier::host, tier::nvme}) {
      store_request sub;
      sub.fields = r.fields;
      sub.rank = r.rank;
      sub.for_device = r.for_device;
      for (std::size_t p = 0; p < r.pieces.size(); ++p) {
        if (tier_of[p] != t) continue;
        home[p] = parts.size();
        sub.pieces.push_back({sub.total, r.pieces[p].size});
        sub.tensors.push_back(r.tensors[p]);
        sub.total += r.pieces[p].size;
      }
      if (sub.pieces.empty()) continue;
      parts.push_back({(t == tier::host ? host_ : nvme_)->make(sub), t});
    }
    return std::make_unique<tiered_store>(std::move(parts), home);
  }

 private:
  rule_type rule_;
  std::shared_ptr<const placement> host_, nvme_;
};

}  // namespace detail

//! Each tensor's state on the tier `rule(tensor name)` names: tier::host through `host`
//! (offload::host()), tier::nvme through `nvme` (offload::nvme(dir)). The state of a bucket
//! lives on one tier, so the tensors of one bucket must agree (a model_spec::bucket_boundary
//! between layers keeps them apart); the optimizer's construction says which do not. The rule
//! must answer the same on every rank.
//!
//!   zero::zero_options o;   // the embeddings' state in host memory, the blocks' in files
//!   o.offload = trident::offload::tiered(
//!       [](std::string_view t) { return t.starts_with("wte") ? offload::tier::host : offload::tier::nvme; },
//!       trident::offload::host(), trident::offload::nvme("/mnt/nvme0/offload"));
inline std::shared_ptr<const placement> tiered(std::function<tier(std::string_view)> rule, std::shared_ptr<const placement> host,
                                               std::shared_ptr<const placement> nvme) {
  TRIDENT_EXPECT(static_cast<bool>(rule), "offload::tiered: an empty rule");
  TRIDENT_EXPECT(host != nullptr && host->where() == tier::host, "offload::tiered: the host placement is ",
                 host ? name_of(host->where()) : std::string_view("null"), "; expected offload::host()");
  TRIDENT_EXPECT(nvme != nullptr && nvme->where() == tier::nvme, "offload::tiered: the nvme placement is ",
                 nvme ? name_of(nvme->where()) : std::string_view("null"), "; expected offload::nvme(directory)");
  return std::make_shared<detail::tiered_placement>(std::move(rule), std::move(host), std::move(nvme));
}

//! The optimizer's fp32 state in host memory (pinned when the optimizer's memory is a device's):
//! ZeRO-Offload's placement.
//!
//!   zero::zero_options o;
//!   o.offload = trident::offload::host();
//!   zero::zero_optimizer<2, optim::adamw, nccl_comm, mixed_precision<bf16>> zero(comm, spec, adamw, o);
inline std::shared_ptr<const placement> host() { return std::make_shared<detail::host_placement>(); }

//! Bytes per parameter a rank keeps in its optimizer's memory space (the device's, for a GPU
//! optimizer), for mixed-precision training (2-byte parameters and gradients, fp32 master
//! weights) with an optimizer of `states` fp32 states (Adam: 2), N = `ranks`:
//!   stage     memory tier (no offload)        host or nvme tier
//!   0         2 + 2 + 4 + 4·states            (refused: offload needs stage 1-3)
//!   1         2 + 2 + (4 + 4·states)/N        2 + 2
//!   2         2 + (2 + 4 + 4·states)/N        2 + 2/N
//!   3         (2 + 2 + 4 + 4·states)/N        (2 + 2)/N
//! Host bytes per parameter with the host tier: (4 + 4·states)/N; the nvme tier moves them to
//! files (and keeps a few pieces in host memory). tests/offload checks these against the ledger;
//! docs/OFFLOAD.md tabulates the largest model per 80 GB GPU from them.
constexpr double device_bytes_per_parameter(int stage, offload::tier t, int ranks, int states = 2, int half_bytes = 2) {
  const double n = ranks, h = half_bytes, fp32 = 4.0 + 4.0 * states;
  const bool off = t != tier::memory;
  switch (stage) {
    case 0: return off ? -1.0 : h + h + fp32;
    case 1: return off ? h + h : h + h + fp32 / n;
    case 2: return off ? h + h / n : h + (h + fp32) / n;
    case 3: return off ? (h + h) / n : (h + h + fp32) / n;
  }
  return -1.0;
}

}  // namespace trident::offload
