// trident/core/memory_ledger.hpp — who holds how many bytes, per memory space and category.
//
// Synopsis
//   enum class space_kind   { host, pinned_host, cuda, nvme };
//   enum class mem_category { parameters, gradients, optimizer_state, activations, communication, other };
//   class memory_ledger;                       thread-safe counters: bytes now, peak, live allocations,
//                                              allocations ever made per space
//   std::shared_ptr<memory_ledger> current_ledger();    the calling thread's ledger
//   class scoped_ledger;                       makes a ledger current for a scope
//
// Every buffer charges its bytes to the ledger that was current when it was allocated and gives
// them back to that same ledger when it is freed, whichever thread frees it. The default is one
// ledger for the process; a launcher that runs several ranks as threads of one process gives each
// rank its own ledger, so "what does rank 3 hold" has an answer and ZeRO's per-rank memory
// formulas can be checked by a test instead of trusted.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace trident {

//! Where bytes live, for accounting. Each memory space declares the kind it charges; `nvme` is
//! files on a disk (offload/nvme.hpp: the optimizer state it keeps there).
enum class space_kind : std::uint8_t { host, pinned_host, cuda, nvme };
inline constexpr std::size_t space_kind_count = 4;

//! What bytes are for. The ZeRO memory formulas are stated in the first three.
enum class mem_category : std::uint8_t { parameters, gradients, optimizer_state, activations, communication, other };
inline constexpr std::size_t mem_category_count = 6;

constexpr std::string_view name_of(space_kind s) noexcept {
  switch (s) {
    case space_kind::host: return "host";
    case space_kind::pinned_host: return "pinned";
    case space_kind::cuda: return "cuda";
    case space_kind::nvme: return "nvme";
  }
  return "unknown";
}

constexpr std::string_view name_of(mem_category c) noexcept {
  switch (c) {
    case mem_category::parameters: return "parameters";
    case mem_category::gradients: return "gradients";
    case mem_category::optimizer_state: return "optimizer_state";
    case mem_category::activations: return "activations";
    case mem_category::communication: return "communication";
    case mem_category::other: return "other";
  }
  return "unknown";
}

//! A copy of a ledger's counters at one moment, for comparisons and arithmetic in tests.
struct memory_snapshot {
  std::array<std::array<std::size_t, mem_category_count>, space_kind_count> bytes{};
  std::array<std::array<std::size_t, mem_category_count>, space_kind_count> peak{};

  std::size_t of(space_kind s, mem_category c) const noexcept {
    return bytes[static_cast<std::size_t>(s)][static_cast<std::size_t>(c)];
  }
  std::size_t total(space_kind s) const noexcept {
    std::size_t sum = 0;
    for (std::size_t b : bytes[static_cast<std::size_t>(s)]) sum += b;
    return sum;
  }
  friend bool operator==(const memory_snapshot&, const memory_snapshot&) = default;
};

//! Thread-safe byte counters per (space, category): current bytes, peak bytes and the number of
//! live allocations, plus the peak of each space's total.
//!
//!   auto ledger = std::make_shared<trident::memory_ledger>("rank 0");
//!   trident::scoped_ledger use{ledger};
//!   trident::buffer<float> w(1024, trident::mem_category::parameters);
//!   assert(ledger->bytes(trident::space_kind::host, trident::mem_category::parameters) == 4096);
//!   std::puts(ledger->report().c_str());
class memory_ledger {
 public:
  explicit memory_ledger(std::string label = "process") : label_(std::move(label)) {}
  memory_ledger(const memory_ledger&) = delete;
  memory_ledger& operator=(const memory_ledger&) = delete;

  const std::string& label() const noexcept { return label_; }

  void charge(space_kind s, mem_category c, std::size_t bytes) noexcept {
    cell& k = at(s, c);
    raise_peak(k.peak, k.bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes);
    k.live.fetch_add(1, std::memory_order_relaxed);
    auto& t = totals_[static_cast<std::size_t>(s)];
    raise_peak(t.peak, t.bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes);
    t.allocations.fetch_add(1, std::memory_order_relaxed);
  }

  void discharge(space_kind s, mem_category c, std::size_t bytes) noexcept {
    cell& k = at(s, c);
    k.bytes.fetch_sub(bytes, std::memory_order_relaxed);
    k.live.fetch_sub(1, std::memory_order_relaxed);
    totals_[static_cast<std::size_t>(s)].bytes.fetch_sub(bytes, std::memory_order_relaxed);
  }

  //! Bytes held now in space `s` for category `c`.
  std::size_t bytes(space_kind s, mem_category c) const noexcept {
    return at(s, c).bytes.load(std::memory_order_relaxed);
  }
  //! Bytes held now in space `s`, all categories.
  std::size_t bytes(space_kind s) const noexcept {
    return totals_[static_cast<std::size_t>(s)].bytes.load(std::memory_order_relaxed);
  }
  //! The most bytes ever held at once in (s, c) since construction or reset_peaks().
  std::size_t peak(space_kind s, mem_category c) const noexcept {
    return at(s, c).peak.load(std::memory_order_relaxed);
  }
  //! The most bytes ever held at once in space `s`, all categories together.
  std::size_t peak(space_kind s) const noexcept {
    return totals_[static_cast<std::size_t>(s)].peak.load(std::memory_order_relaxed);
  }
  //! Allocations ever charged in space `s`, all categories: what shows that a loop allocates
  //! nothing once warm (take it before and after; on CUDA every allocation is a cudaMalloc).
  std::size_t allocations(space_kind s) const noexcept {
    return totals_[static_cast<std::size_t>(s)].allocations.load(std::memory_order_relaxed);
  }
  //! Allocations alive now in (s, c).
  std::size_t live_allocations(space_kind s, mem_category c) const noexcept {
    return at(s, c).live.load(std::memory_order_relaxed);
  }

  //! Starts peak tracking afresh from the current holdings (e.g. after set-up, before a step).
  void reset_peaks() noexcept {
    for (auto& row : cells_)
      for (cell& k : row) k.peak.store(k.bytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
    for (auto& t : totals_) t.peak.store(t.bytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }

  memory_snapshot snapshot() const noexcept {
    memory_snapshot snap;
    for (std::size_t s = 0; s < space_kind_count; ++s)
      for (std::size_t c = 0; c < mem_category_count; ++c) {
        snap.bytes[s][c] = cells_[s][c].bytes.load(std::memory_order_relaxed);
        snap.peak[s][c] = cells_[s][c].peak.load(std::memory_order_relaxed);
      }
    return snap;
  }

  //! A table of the spaces in use (rows) by category (columns), in human units, with each
  //! space's total and peak. Spaces that never held anything are left out.
  std::string report() const {
    std::string out = "memory held by " + label_ + "\n";
    out += pad("space", 8);
    for (std::size_t c = 0; c < mem_category_count; ++c) out += pad(name_of(static_cast<mem_category>(c)), 17);
    out += pad("total", 12) + "peak\n";
    bool any = false;
    for (std::size_t s = 0; s < space_kind_count; ++s) {
      const auto kind = static_cast<space_kind>(s);
      if (peak(kind) == 0) continue;
      any = true;
      out += pad(name_of(kind), 8);
      for (std::size_t c = 0; c < mem_category_count; ++c) out += pad(human(bytes(kind, static_cast<mem_category>(c))), 17);
      out += pad(human(bytes(kind)), 12) + human(peak(kind)) + "\n";
    }
    if (!any) out += "(nothing)\n";
    return out;
  }

  //! Bytes in binary units with three significant decimals: "0 B", "12.000 KiB", "1.500 GiB".
  static std::string human(std::size_t bytes) {
    constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    if (bytes < 1024) return std::to_string(bytes) + " B";
    double value = static_cast<double>(bytes);
    std::size_t unit = 0;
    while (value >= 1024.0 && unit + 1 < std::size(units)) {
      value /= 1024.0;
      ++unit;
    }
    char text[32];
    std::snprintf(text, sizeof text, "%.3f %s", value, units[unit]);
    return text;
  }

 private:
  struct cell {
    std::atomic<std::size_t> bytes{0};
    std::atomic<std::size_t> peak{0};
    std::atomic<std::size_t> live{0};
  };
  struct total {
    std::atomic<std::size_t> bytes{0};
    std::atomic<std::size_t> peak{0};
    std::atomic<std::size_t> allocations{0};  // ever charged
  };

  cell& at(space_kind s, mem_category c) noexcept { return cells_[static_cast<std::size_t>(s)][static_cast<std::size_t>(c)]; }
  const cell& at(space_kind s, mem_category c) const noexcept {
    return cells_[static_cast<std::size_t>(s)][static_cast<std::size_t>(c)];
  }

  static void raise_peak(std::atomic<std::size_t>& peak, std::size_t candidate) noexcept {
    std::size_t seen = peak.load(std::memory_order_relaxed);
    while (candidate > seen && !peak.compare_exchange_weak(seen, candidate, std::memory_order_relaxed)) {
    }
  }

  static std::string pad(std::string_view text, std::size_t width) {
    std::string out{text};
    out.resize(std::max(width, out.size() + 1), ' ');
    return out;
  }

  std::string label_;
  std::array<std::array<cell, mem_category_count>, space_kind_count> cells_{};
  std::array<total, space_kind_count> totals_{};
};

//! The ledger of the whole process: current when no scoped_ledger is active on a thread.
inline const std::shared_ptr<memory_ledger>& process_ledger() {
  static const auto ledger = std::make_shared<memory_ledger>("process");
  return ledger;
}

namespace detail {
inline thread_local std::shared_ptr<memory_ledger> thread_ledger;
}  // namespace detail

//! The ledger new allocations on this thread are charged to.
inline std::shared_ptr<memory_ledger> current_ledger() {
  return detail::thread_ledger ? detail::thread_ledger : process_ledger();
}

//! Makes `ledger` current on this thread until the end of the scope (nests; restores the
//! previous one). A thread launcher installs one per rank.
//!
//!   auto mine = std::make_shared<trident::memory_ledger>("rank 2");
//!   { trident::scoped_ledger use{mine}; /* allocations here are charged to rank 2 */ }
class scoped_ledger {
 public:
  explicit scoped_ledger(std::shared_ptr<memory_ledger> ledger)
      : previous_(std::exchange(detail::thread_ledger, std::move(ledger))) {}
  ~scoped_ledger() { detail::thread_ledger = std::move(previous_); }
  scoped_ledger(const scoped_ledger&) = delete;
  scoped_ledger& operator=(const scoped_ledger&) = delete;

 private:
  std::shared_ptr<memory_ledger> previous_;
};

}  // namespace trident
