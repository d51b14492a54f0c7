// trident/nn/loss.hpp — losses on the host: mean squared error and softmax cross-entropy.
//
// Synopsis
//   struct mse_loss
//     static float forward(std::span<const float> pred, std::span<const float> target)
//         mean((pred - target)^2) over all elements: torch.nn.MSELoss(reduction='mean')
//     static void backward(pred, target, std::span<float> dpred, float dloss = 1)
//         dpred = dloss * 2 (pred - target) / N                        (overwritten)
//   struct softmax_cross_entropy
//     static float forward(std::size_t batch, std::size_t classes, std::span<const float> logits,
//                          std::span<const std::int32_t> targets)
//         mean over rows of logsumexp(row) - row[target]: torch.nn.CrossEntropyLoss(reduction='mean')
//     static void backward(batch, classes, logits, targets, std::span<float> dlogits, float dloss = 1)
//         dlogits = dloss * (softmax(row) - onehot(target)) / batch    (overwritten)
//
// `dloss` is the gradient flowing into the loss (1 for a plain backward; a loss scale, or a
// rank's share of a global mean, otherwise). The losses are stateless: backward recomputes what
// it needs from forward's inputs. Sums run in double in index order, so results are
// deterministic; an empty batch, a size mismatch or a target outside [0, classes) is a
// usage_error (PyTorch returns NaN for the first and fails for the others).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "trident/core/config.hpp"
#include "trident/core/error.hpp"

namespace trident::nn {

namespace detail {

inline void check_mse(const char* who, std::size_t pred, std::size_t target) {
  TRIDENT_EXPECT(pred == target, who, ": pred has ", pred, " elements, target ", target,
                 "; expected the same shape");
  TRIDENT_EXPECT(pred > 0, who, ": the mean over zero elements is undefined");
}

inline void check_cross_entropy(const char* who, std::size_t batch, std::size_t classes, std::size_t logits,
                                std::size_t targets) {
  TRIDENT_EXPECT(batch > 0 && classes > 0, who, ": expected a non-empty [batch, classes], got [", batch, ", ",
                 classes, "]");
  TRIDENT_EXPECT(logits == batch * classes, who, ": logits have ", logits, " elements, expected [batch=", batch,
                 ", classes=", classes, "] = ", batch * classes);
  TRIDENT_EXPECT(targets == batch, who, ": targets have ", targets, " elements, expected [batch=", batch, "]");
}

inline void check_target(const char* who, std::size_t row, std::int32_t target, std::size_t classes) {
  TRIDENT_EXPECT(target >= 0 && static_cast<std::size_t>(target) < classes, who, ": target ", target, " of row ",
                 row, " is outside [0, ", classes, ")");
}

// The row's maximum and sum of exp(x - max): log-sum-exp = max + log(sum), stable for any logits.
struct row_stats {
  float max;
  double sum;
};

inline row_stats softmax_row_stats(const float* row, std::size_t classes) {
  float max = row[0];
  for (std::size_t c = 1; c < classes; ++c) max = row[c] > max ? row[c] : max;
  double sum = 0;
  for (std::size_t c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(row[c]) - max);
  return {max, sum};
}

}  // namespace detail

//! Mean squared error, torch.nn.MSELoss() (reduction 'mean': over every element).
//!
//!   const float loss = trident::nn::mse_loss::forward(pred, target);
//!   trident::nn::mse_loss::backward(pred, target, dpred);
struct mse_loss {
  static float forward(std::span<const float> pred, std::span<const float> target) {
    detail::check_mse("mse_loss::forward", pred.size(), target.size());
    double sum = 0;
    for (std::size_t i = 0; i < pred.size(); ++i) {
      const double e = static_cast<double>(pred[i]) - target[i];
      sum += e * e;
    }
    return static_cast<float>(sum / static_cast<double>(pred.size()));
  }

  static void backward(std::span<const float> pred, std::span<const float> target, std::span<float> dpred,
                       float dloss = 1.0f) {
    detail::check_mse("mse_loss::backward", pred.size(), target.size());
    detail::check_mse("mse_loss::backward", pred.size(), dpred.size());
    const float factor = 2.0f * dloss / static_cast<float>(pred.size());
    for (std::size_t i = 0; i < pred.size(); ++i) dpred[i] = factor * (pred[i] - target[i]);
  }
};

//! Softmax followed by negative log-likelihood of integer class targets, averaged over the batch:
//! torch.nn.CrossEntropyLoss() on logits [batch, classes] (no weights, no ignore_index, no
//! label smoothing). Checked against torch's own output, tests/fixtures/torch_layers.txt: the
//! loss and dlogits within 1e-7 of torch's float32 results (normwise).
//!
//!   const float loss = trident::nn::softmax_cross_entropy::forward(batch, classes, logits, labels);
//!   trident::nn::softmax_cross_entropy::backward(batch, classes, logits, labels, dlogits);
struct softmax_cross_entropy {
  static float forward(std::size_t batch, std::size_t classes, std::span<const float> logits,
                       std::span<const std::int32_t> targets) {
    const char* who = "softmax_cross_entropy::forward";
    detail::check_cross_entropy(who, batch, classes, logits.size(), targets.size());
    double total = 0;
    for (std::size_t r = 0; r < batch; ++r) {
      detail::check_target(who, r, targets[r], classes);
      const float* row = logits.data() + r * classes;
      const auto s = detail::softmax_row_stats(row, classes);
      total += (static_cast<double>(s.max) + std::log(s.sum)) - row[targets[r]];
    }
    return static_cast<float>(total / static_cast<double>(batch));
  }

  static void backward(std::size_t batch, std::size_t classes, std::span<const float> logits,
                       std::span<const std::int32_t> targets, std::span<float> dlogits, float dloss = 1.0f) {
    const char* who = "softmax_cross_entropy::backward";
    detail::check_cross_entropy(who, batch, classes, logits.size(), targets.size());
    TRIDENT_EXPECT(dlogits.size() == logits.size(), who, ": dlogits have ", dlogits.size(),
                   " elements, expected [batch=", batch, ", classes=", classes, "] = ", batch * classes);
    for (std::size_t r = 0; r < batch; ++r) detail::check_target(who, r, targets[r], classes);
    const double scale = static_cast<double>(dloss) / static_cast<double>(batch);
    for (std::size_t r = 0; r < batch; ++r) {
      const float* row = logits.data() + r * classes;
      float* grad = dlogits.data() + r * classes;
      const auto s = detail::softmax_row_stats(row, classes);
      for (std::size_t c = 0; c < classes; ++c) {
        const double p = std::exp(static_cast<double>(row[c]) - s.max) / s.sum;
        const double onehot = static_cast<std::int32_t>(c) == targets[r] ? 1.0 : 0.0;
        grad[c] = static_cast<float>(scale * (p - onehot));
      }
    }
  }
};

}  // namespace trident::nn
