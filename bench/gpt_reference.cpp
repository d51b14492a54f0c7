// gpt_reference: the flagship GPT (examples/01_flagship) from the command line, for the
// comparison with the same model written plainly in PyTorch (bench/gpt_torch.py, run by
// bench/gpt_vs_torch.sh; issue 13's "against PyTorch" acceptance).
//
//   gpt_reference [options] --write-shard FILE     a synthetic shard (tests/gpt/gpt_suite.hpp's rule)
//   gpt_reference [options] --dump-init FILE       every initial weight, whole, as safetensors
//   gpt_reference [options] --data SHARD           trains; one line per step, then tokens/s
//
// Options (defaults in brackets):
//   model      --vocab [256] --seq [64] --hidden [64] --heads [4] --layers [4] --ffn [0: 4 hidden]
//   batches    --micro-batch [4] --accumulation [1] --steps [20]
//   optimizer  --lr [1e-3] --warmup [0] --beta1 [0.9] --beta2 [0.95] --eps [1e-8]
//              --weight-decay [0.1] --max-grad-norm [1.0]; the lr of optimizer step k (1-based) is
//              lr x min(1, k / warmup), lr throughout when warmup is 0 (gpt_torch.py's rule)
//   grid       --ranks [1] thread ranks = d x t x p, --tensor [1] --pipeline [1] --zero [0]
//              --schedule [1f1b]
//   other      --seed [1234] the weights' seed; --timing-warmup [2] steps left out of tokens/s;
//              --shard-tokens [20000] --shard-seed [7] for --write-shard (vocab from --vocab)
//
// Data: with d = ranks / (t p) data-parallel ranks, a step reads d x accumulation micro-batches
// of micro-batch x seq tokens in llm.c's order (data::shard_loader); one rank with
// accumulation d x accumulation reads the same tokens, which is what gpt_torch.py is given.
//
// The initial weights are written as safetensors (an 8-byte little-endian header length, a
// JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, the raw float32
// values), which numpy reads by hand: the reference needs neither the safetensors package nor
// anything of ours. The QKV rows keep trident's order, (head, q/k/v, head_dim).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "01_flagship/trainer.hpp"
#include "trident/comm/local.hpp"
#include "trident/data/token_shards.hpp"

namespace {

struct arguments {
  std::map<std::string, std::string> values;

  bool has(const std::string& k) const { return values.count(k) != 0; }
  std::string text(const std::string& k, const std::string& fallback = "") const {
    const auto it = values.find(k);
    return it == values.end() ? fallback : it->second;
  }
  double number(const std::string& k, double fallback) const {
    if (!has(k)) return fallback;
    char* end = nullptr;
    const std::string& s = values.at(k);
    const double v = std::strtod(s.c_str(), &end);
    TRIDENT_EXPECT(end != s.c_str() && *end == '\0', "gpt_reference: --", k, " ", s, "; expected a number");
    return v;
  }
  std::size_t count(const std::string& k, std::size_t fallback) const {
    const double v = number(k, static_cast<double>(fallback));
    TRIDENT_EXPECT(v >= 0 && v == std::floor(v), "gpt_reference: --", k, " ", v, "; expected a non-negative integer");
    return static_cast<std::size_t>(v);
  }
};

arguments parse(int argc, char** argv) {
  static const char* const known[] = {"vocab", "seq", "hidden", "heads", "layers", "ffn", "micro-batch", "accumulation", "steps",
                                      "lr", "warmup", "beta1", "beta2", "eps", "weight-decay", "max-grad-norm", "ranks",
                                      "tensor", "pipeline", "zero", "schedule", "seed", "timing-warmup", "shard-tokens",
                                      "shard-seed", "write-shard", "dump-init", "data"};
  arguments a;
  for (int i = 1; i < argc; i += 2) {
    const std::string key = argv[i];
    TRIDENT_EXPECT(key.rfind("--", 0) == 0 && i + 1 < argc, "gpt_reference: '", key,
                   "'; expected --option value pairs (see the comment at the top of bench/gpt_reference.cpp)");
    const std::string name = key.substr(2);
    TRIDENT_EXPECT(std::find(std::begin(known), std::end(known), name) != std::end(known), "gpt_reference: unknown option --",
                   name, "; expected one of those at the top of bench/gpt_reference.cpp");
    a.values[name] = argv[i + 1];
  }
  return a;
}

flagship::train_options options_of(const arguments& a) {
  flagship::train_options o;
  o.model = {.vocab = a.count("vocab", 256), .seq = a.count("seq", 64), .hidden = a.count("hidden", 64),
             .heads = a.count("heads", 4), .layers = a.count("layers", 4), .ffn = a.count("ffn", 0)};
  o.micro_batch = a.count("micro-batch", 4);
  o.accumulation = static_cast<int>(a.count("accumulation", 1));
  o.steps = static_cast<long>(a.count("steps", 20));
  o.adamw = {.lr = static_cast<float>(a.number("lr", 1e-3)), .beta1 = static_cast<float>(a.number("beta1", 0.9)),
             .beta2 = static_cast<float>(a.number("beta2", 0.95)), .eps = static_cast<float>(a.number("eps", 1e-8)),
             .weight_decay = static_cast<float>(a.number("weight-decay", 0.1))};
  // The lr as a double from the command line's text, as Python reads it: rounding it through
  // adamw.lr's float first would change the schedule's values.
  const double lr = a.number("lr", 1e-3), warmup = static_cast<double>(a.count("warmup", 0));
  o.lr = [lr, warmup](std::int64_t step) { return warmup > 0 ? lr * std::min(1.0, static_cast<double>(step) / warmup) : lr; };
  o.max_grad_norm = static_cast<float>(a.number("max-grad-norm", 1.0));
  o.tensor = static_cast<int>(a.count("tensor", 1));
  o.pipeline = static_cast<int>(a.count("pipeline", 1));
  o.zero_stage = static_cast<int>(a.count("zero", 0));
  o.schedule = a.text("schedule", "1f1b");
  o.seed = a.count("seed", 1234);
  if (a.has("data")) o.train_files = {a.text("data")};
  return o;
}

// tests/gpt/gpt_suite.hpp's synthetic_shard, to a path of our choosing: nine tokens in ten
// follow from the one before, so the loss falls within a few steps.
void write_synthetic_shard(const std::string& path, std::size_t count, std::uint32_t vocab, std::uint64_t seed) {
  std::vector<std::uint32_t> tokens(count);
  std::uint64_t z = seed;
  for (std::size_t i = 0; i < count; ++i) {
    z = trident::detail::splitmix64(z);
    const auto noise = static_cast<std::uint32_t>(z % vocab);
    tokens[i] = i == 0 || z % 10 == 0 ? noise : (tokens[i - 1] * 5 + 3) % vocab;
  }
  trident::data::write_shard(path, tokens);
}

std::string json_shape(const std::vector<std::size_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

// Every parameter whole (a tensor group of one), in forward order.
void dump_init(const std::string& path, const flagship::train_options& o) {
  std::vector<flagship::gpt_parameter> params;
  trident::local_world::run(1, [&](trident::local_comm& c) { params = flagship::gpt_parameters(c, o.model, o.seed); });
  std::string header = "{\"__metadata__\":{\"format\":\"pt\",\"qkv_rows\":\"head,qkv,head_dim\",\"seed\":\"" +
                       std::to_string(o.seed) + "\"}";
  std::vector<std::vector<float>> values;
  std::size_t offset = 0;
  for (const auto& p : params) {
    values.push_back(p.part(0));
    const std::size_t bytes = values.back().size() * sizeof(float);
    header += ",\"" + p.name + "\":{\"dtype\":\"F32\",\"shape\":" + json_shape(p.split.local_shape()) +
              ",\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + bytes) + "]}";
    offset += bytes;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');  // safetensors aligns the data to 8 bytes
  std::ofstream out(path, std::ios::binary);
  TRIDENT_EXPECT(static_cast<bool>(out), "gpt_reference: cannot write '", path, "'");
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(header.size()) >> (8 * i));
  out.write(reinterpret_cast<const char*>(length), 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  // float32 on a little-endian host is safetensors' F32 already.
  for (const auto& v : values) out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  TRIDENT_EXPECT(static_cast<bool>(out), "gpt_reference: writing '", path, "' failed");
  std::printf("wrote %zu parameters (%zu floats) to %s\n", params.size(), offset / sizeof(float), path.c_str());
}

int train(const arguments& a, const flagship::train_options& o) {
  const int ranks = static_cast<int>(a.count("ranks", 1));
  const long skip = static_cast<long>(a.count("timing-warmup", 2));
  TRIDENT_EXPECT(ranks >= 1 && ranks % (o.tensor * o.pipeline) == 0, "gpt_reference: --ranks ", ranks,
                 "; expected a positive multiple of tensor x pipeline = ", o.tensor * o.pipeline);
  const int d = ranks / (o.tensor * o.pipeline);
  std::printf("trident gpt: vocab %zu seq %zu hidden %zu heads %zu layers %zu ffn %zu; %d thread ranks (d, t, p) = (%d, %d, %d), "
              "ZeRO-%d; %d x %d micro-batches of %zu x %zu tokens per step\n",
              o.model.vocab, o.model.seq, o.model.hidden, o.model.heads, o.model.layers, o.model.ffn_size(), ranks, d, o.tensor,
              o.pipeline, o.zero_stage, d, o.accumulation, o.micro_batch, o.model.seq);
  std::fflush(stdout);
  const auto reports = trident::local_world::run(ranks, [&](trident::local_comm& world) {
    return flagship::train(world, o, [&](const flagship::step_report& r) {
      if (world.rank() != 0) return;
      std::printf("step %ld loss %.9g grad_norm %.9g lr %.17g seconds %.6f\n", r.step, r.loss, r.grad_norm, r.lr, r.seconds);
      std::fflush(stdout);
    });
  });
  double seconds = 0, tokens = 0;
  for (const auto& r : reports[0])
    if (r.step > skip) {
      seconds += r.seconds;
      tokens += r.tokens;
    }
  if (seconds > 0)
    std::printf("tokens_per_second %.1f over steps %ld..%ld (%d thread ranks)\n", tokens / seconds, skip + 1, o.steps, ranks);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const arguments a = parse(argc, argv);
    const auto o = options_of(a);
    if (a.has("write-shard")) {
      write_synthetic_shard(a.text("write-shard"), a.count("shard-tokens", 20000), static_cast<std::uint32_t>(o.model.vocab),
                            a.count("shard-seed", 7));
      std::printf("wrote %zu tokens to %s\n", a.count("shard-tokens", 20000), a.text("write-shard").c_str());
    }
    if (a.has("dump-init")) dump_init(a.text("dump-init"), o);
    if (a.has("data")) return train(a, o);
    TRIDENT_EXPECT(a.has("write-shard") || a.has("dump-init"), "gpt_reference: nothing to do; expected --data SHARD (train), "
                   "--dump-init FILE or --write-shard FILE");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_reference: %s\n", e.what());
    return 1;
  }
}
