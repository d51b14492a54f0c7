// Communication-efficient training across a slow link (issue 16): the flagship GPT trained
// data-parallel on thread ranks in two clusters joined by one slow link (comm/slow_link.hpp's
// simulated network: every byte across counted, a simulated clock per rank that adds each rank's
// own CPU time to what its messages wait for), with one method per run:
//
//   dp              ZeRO-0, the plain (ring) all-reduce of the gradients
//   hierarchical    the same, all-reduced by comm/hierarchical.hpp (reduce-scatter inside each
//                   cluster, all-reduce across, all-gather inside)
//   bf16            compress::cast<bf16>
//   powersgd        compress::powersgd, rank --rank (with --no-error-feedback: without)
//   onebit          compress::onebit on the gradients after --warmup plain steps (with
//                   --no-error-feedback: without), AdamW as the others
//   onebit-adam     1-bit Adam: compress::onebit on the momentum with compress::onebit_adam
//                   (variance frozen after --warmup steps)
//   diloco          each cluster a worker (ZeRO-0 inside it), DiLoCo across every --inner steps,
//                   each rank of a worker syncing its quarter of the model
//
// Every method sees the same samples per step (8 ranks x micro-batch rows). Prints a line per
// step (step, simulated seconds, loss) to --out/<method>.csv and a RESULT line with the
// validation loss at the end (8 batches of each rank's slice of kjv_val.bin; after DiLoCo's last
// sync), the mean training loss of the last 20 steps, the simulated time and the bytes across:
//
//   comm_efficient --method dp --steps 200 [--ranks 8 --per-cluster 4 --latency 0.1 --bandwidth 1e6]
//                  [--rank 4 --warmup 20 --inner 50 --outer-lr 0.7 --outer-momentum 0.9 --no-error-feedback]
//                  [--data build/data --out DIR --tag NAME (appended to the method's name)]
// bench/comm_efficient.sh runs them all and checks the lines (bench/RESULTS.md).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "01_flagship/trainer.hpp"
#include "trident/comm/hierarchical.hpp"
#include "trident/comm/local.hpp"
#include "trident/comm/slow_link.hpp"
#include "trident/compress/cast.hpp"
#include "trident/compress/onebit.hpp"
#include "trident/compress/powersgd.hpp"
#include "trident/parallel/local_sgd/diloco.hpp"

namespace {

using net_type = trident::slow_link_comm<trident::local_comm>;
using rank_type = flagship::gpt_rank<0, net_type, flagship::optimizer_type, trident::full_precision>;
using onebit_optimizer = trident::optim::scheduled<trident::compress::onebit_adam, flagship::lr_function>;
using onebit_rank_type = flagship::gpt_rank<0, net_type, onebit_optimizer, trident::full_precision>;

struct args {
  std::string method = "dp", data = "build/data", out = "build/comm-efficient", tag;
  int ranks = 8, per_cluster = 4, steps = 200;
  double latency = 0.1, bandwidth = 1e6;
  std::size_t rank = 4;
  int warmup = 20, inner = 50;
  float outer_lr = 0.7f, outer_momentum = 0.9f;
  bool error_feedback = true;
};

args parse(int argc, char** argv) {
  args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw trident::usage_error("comm_efficient: " + k + " needs a value");
      return argv[++i];
    };
    if (k == "--method") a.method = value();
    else if (k == "--data") a.data = value();
    else if (k == "--out") a.out = value();
    else if (k == "--ranks") a.ranks = std::stoi(value());
    else if (k == "--per-cluster") a.per_cluster = std::stoi(value());
    else if (k == "--steps") a.steps = std::stoi(value());
    else if (k == "--latency") a.latency = std::stod(value());
    else if (k == "--bandwidth") a.bandwidth = std::stod(value());
    else if (k == "--rank") a.rank = static_cast<std::size_t>(std::stoul(value()));
    else if (k == "--warmup") a.warmup = std::stoi(value());
    else if (k == "--inner") a.inner = std::stoi(value());
    else if (k == "--outer-lr") a.outer_lr = std::stof(value());
    else if (k == "--outer-momentum") a.outer_momentum = std::stof(value());
    else if (k == "--no-error-feedback") a.error_feedback = false;
    else if (k == "--tag") a.tag = value();
    else throw trident::usage_error("comm_efficient: unknown argument " + k);
  }
  const std::vector<std::string> known{"dp", "hierarchical", "bf16", "powersgd", "onebit", "onebit-adam", "diloco"};
  if (std::find(known.begin(), known.end(), a.method) == known.end())
    throw trident::usage_error("comm_efficient: unknown method '" + a.method + "'");
  return a;
}

// The hierarchical all-reduce as a gradient reducer.
struct hierarchical_reducer {
  std::shared_ptr<trident::hierarchical_all_reduce<net_type>> h;
  template <class Comm, class T>
  void all_reduce(Comm&, const trident::compress::bucket_view<T, typename Comm::space>& b) {
    auto data = b.data;
    (*h)(data, b.op);
  }
};

struct point {
  double seconds, loss;
};

// The validation loss of this rank's model on `batches` batches of its slice of kjv_val.bin
// (forward only, one stage).
double validate(flagship::chunk_runner& rank, const std::string& data, const flagship::train_options& o, int slice, int slices,
                int batches) {
  trident::data::shard_loader val({data + "/kjv_val.bin"}, o.micro_batch, o.model.seq, slice, slices);
  trident::data::token_batch scratch;
  double sum = 0;
  for (int i = 0; i < batches; ++i) {
    flagship::step_batches one;
    flagship::append_batch(val, scratch, one);
    rank.set_batches(&one);
    const std::vector<float> x(1, 0.0f);
    sum += rank.evaluate(0, x, 0)[0];
  }
  return sum / batches;
}

}  // namespace

int main(int argc, char** argv) try {
  const args a = parse(argc, argv);
  flagship::train_options o;
  o.model = {.vocab = 256, .seq = 64, .hidden = 128, .heads = 4, .layers = 4, .ffn = 0};
  o.micro_batch = 8;
  o.steps = a.steps;
  o.adamw = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  o.max_grad_norm = 1.0f;
  o.train_files = {a.data + "/kjv_train.bin"};
  const double lr = o.adamw.lr;
  const long warmup = 10, total = a.steps;
  o.lr = [=](std::int64_t s) {
    if (s <= warmup) return lr * static_cast<double>(s) / warmup;
    const double t = static_cast<double>(s - warmup) / static_cast<double>(std::max<long>(1, total - warmup));
    return 0.1 * lr + 0.9 * lr * 0.5 * (1.0 + std::cos(3.14159265358979323846 * std::min(1.0, t)));
  };
  flagship::optimizer_type opt;
  opt.opt = o.adamw;
  opt.schedule.f = o.lr;
  trident::zero::zero_options zo;
  zo.bucket_bytes = o.bucket_elements * sizeof(float);
  zo.first_bucket_bytes = o.first_bucket_elements * sizeof(float);
  zo.max_grad_norm = o.max_grad_norm;
  const auto map = trident::cluster_map::blocks(a.ranks, a.per_cluster, {.latency = 1e-5, .bandwidth = 1e10},
                                                {.latency = a.latency, .bandwidth = a.bandwidth});

  std::vector<point> curve;
  std::uint64_t across_bytes = 0;
  double val_loss = 0;
  trident::local_world::run(a.ranks, [&](trident::local_comm& c) {
    net_type net(c.split(0, c.rank()), map);
    std::vector<point> mine;
    double val = 0;  // this rank's validation loss after the last step (and DiLoCo's last sync)
    auto record = [&](double loss) {
      // The loss over every worker's tokens, at the time the slowest rank got there.
      std::vector<double> v{loss, net.now()};
      c.all_reduce(std::span<double>(v.data(), 1), trident::reduce_op::avg);
      c.all_reduce(std::span<double>(v.data() + 1, 1), trident::reduce_op::max);
      mine.push_back({v[1], v[0]});
    };
    if (a.method == "diloco") {
      auto inner = net.split(net.cluster(), net.rank());
      auto across = net.split(inner.rank(), net.cluster());
      trident::process_grid<net_type> grid(inner, 1, 1);
      auto worker = o;  // this rank's slice of the 8-rank batch, though its grid has 4 ranks
      worker.data_slice = std::pair<int, int>{net.rank(), a.ranks};
      rank_type rank(grid, o.model, 1, 1, o.micro_batch, opt, zo, o.seed);
      trident::local_sgd::diloco_options d;
      d.inner_steps = a.inner;
      d.outer.opt.lr = a.outer_lr;
      d.outer.opt.momentum = a.outer_momentum;
      d.outer.opt.nesterov = a.outer_momentum > 0;
      trident::local_sgd::diloco<net_type> outer(across, inner, trident::local_sgd::parameters_of(rank.optimizer()), d);
      net.reset_wire();
      flagship::detail::loop<1>(inner, grid, worker, [&](const flagship::step_report& r) {
        outer.step();
        record(r.loss);
      }, rank, opt);
      val = validate(rank, a.data, o, net.rank(), a.ranks, 8);
    } else if (a.method == "onebit-adam") {
      trident::process_grid<net_type> grid(net, 1, 1);
      onebit_optimizer adam;
      adam.opt = {.lr = o.adamw.lr, .beta1 = o.adamw.beta1, .beta2 = o.adamw.beta2, .eps = o.adamw.eps,
                  .weight_decay = o.adamw.weight_decay, .freeze_step = a.warmup};
      adam.schedule.f = o.lr;
      onebit_rank_type rank(grid, o.model, 1, 1, o.micro_batch, adam, zo, o.seed);
      trident::compress::onebit_options b;
      b.warmup = a.warmup;
      b.momentum = o.adamw.beta1;
      b.error_feedback = a.error_feedback;
      rank.optimizer().reduce_gradients_with(std::make_shared<trident::compress::onebit>(b));
      net.reset_wire();
      // The loop runs the model through chunk_runner; its optimizer type is only for the lr.
      flagship::detail::loop<1>(net, grid, o, [&](const flagship::step_report& r) { record(r.loss); }, rank, opt);
      val = validate(rank, a.data, o, net.rank(), a.ranks, 8);
    } else {
      trident::process_grid<net_type> grid(net, 1, 1);
      rank_type rank(grid, o.model, 1, 1, o.micro_batch, opt, zo, o.seed);
      if (a.method == "hierarchical") {
        auto h = std::make_shared<trident::hierarchical_all_reduce<net_type>>(net, map.cluster_of);
        rank.optimizer().reduce_gradients_with(std::make_shared<hierarchical_reducer>(hierarchical_reducer{h}));
      } else if (a.method == "bf16") {
        rank.optimizer().reduce_gradients_with(std::make_shared<trident::compress::cast<trident::bf16>>());
      } else if (a.method == "powersgd") {
        trident::compress::powersgd_options p;
        p.rank = a.rank;
        p.start_iter = a.warmup;
        p.error_feedback = a.error_feedback;
        rank.optimizer().reduce_gradients_with(std::make_shared<trident::compress::powersgd>(p));
      } else if (a.method == "onebit") {
        trident::compress::onebit_options b;
        b.warmup = a.warmup;
        b.error_feedback = a.error_feedback;
        rank.optimizer().reduce_gradients_with(std::make_shared<trident::compress::onebit>(b));
      }
      net.reset_wire();
      flagship::detail::loop<1>(net, grid, o, [&](const flagship::step_report& r) { record(r.loss); }, rank, opt);
      val = validate(rank, a.data, o, net.rank(), a.ranks, 8);
    }
    std::vector<std::uint64_t> bytes{net.wire().across.bytes};
    c.all_reduce(bytes);
    std::vector<double> v{val};
    c.all_reduce(v, trident::reduce_op::avg);
    if (c.rank() == 0) {
      curve = mine;
      across_bytes = bytes[0];
      val_loss = v[0];
    }
  });

  // DiLoCo's outer optimizer in the name when it is not the paper's (lr 1 without momentum:
  // model averaging, local SGD).
  std::string outer;
  if (a.outer_lr == 1.0f && a.outer_momentum == 0.0f) outer = "-averaging";
  else if (a.outer_lr != 0.7f || a.outer_momentum != 0.9f) {
    std::ostringstream f;
    f << "-lr" << a.outer_lr << "-m" << a.outer_momentum;
    outer = f.str();
  }
  const std::string name = a.method + (a.method == "diloco" ? "-h" + std::to_string(a.inner) + outer : "") +
                           (a.method == "powersgd" ? "-r" + std::to_string(a.rank) : "") + (a.error_feedback ? "" : "-noef") +
                           (a.tag.empty() ? "" : "-" + a.tag);
  std::filesystem::create_directories(a.out);
  std::ofstream csv(a.out + "/" + name + ".csv");
  csv << "step,seconds,loss\n";
  for (std::size_t i = 0; i < curve.size(); ++i) csv << i + 1 << ',' << curve[i].seconds << ',' << curve[i].loss << '\n';
  double tail = 0;
  const std::size_t last = std::min<std::size_t>(20, curve.size());
  for (std::size_t i = curve.size() - last; i < curve.size(); ++i) tail += curve[i].loss / static_cast<double>(last);
  std::printf("RESULT method=%s val_loss=%.5f final_loss=%.5f sim_seconds=%.2f across_bytes=%llu steps=%zu\n", name.c_str(), val_loss,
              tail, curve.empty() ? 0.0 : curve.back().seconds, static_cast<unsigned long long>(across_bytes), curve.size());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "comm_efficient: %s\n", e.what());
  return 1;
}
