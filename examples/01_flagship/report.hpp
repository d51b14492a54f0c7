#pragma once
// What the flagship shows its user: the progress line, the loss curve as CSV and as an SVG
// picture, and the machine's GEMM rate that MFU is measured against on the host.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "trainer.hpp"
#include "trident/core/error.hpp"
#include "trident/nn/gemm.hpp"

namespace flagship {

//! FLOP/s of trident's host GEMM on one core (a 256-cube, repeated for about 0.2 s): the
//! peak that the host path's MFU is measured against, times the ranks that compute at once
//! (at most the cores). A GPU run would use the device's datasheet peak instead.
inline double measured_gemm_flops() {
  const std::size_t n = 256;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  namespace nn = trident::nn;
  nn::gemm(nn::op::n, nn::op::t, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);  // warm
  const auto start = std::chrono::steady_clock::now();
  int reps = 0;
  double seconds = 0;
  do {
    nn::gemm(nn::op::n, nn::op::t, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    ++reps;
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (seconds < 0.2);
  return 2.0 * static_cast<double>(n * n * n) * reps / seconds;
}

inline std::string human_duration(double s) {
  char buf[32];
  if (s < 60) std::snprintf(buf, sizeof buf, "%.0fs", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s / 60), static_cast<int>(s) % 60);
  else std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s / 3600), static_cast<int>(s / 60) % 60);
  return buf;
}

//! One line per step: step, loss, learning rate, tokens/s, MFU, loss scale, gradient norm,
//! time per step and time left. `seconds_so_far` excludes the first step (it allocates).
struct progress {
  long steps = 0;
  double flops_per_token = 0;
  double peak_flops = 0;  // 0: MFU not shown
  std::string loss_scale = "-";  // fp32 and bf16 train unscaled
  double elapsed = 0;
  long timed = 0;
  double tokens = 0;

  std::string line(const step_report& r) {
    if (r.step > 1) {  // the first step allocates and warms up: not counted in the rates
      elapsed += r.seconds;
      tokens += r.tokens;
      ++timed;
    }
    const double per_step = timed > 0 ? elapsed / static_cast<double>(timed) : r.seconds;
    const double tps = timed > 0 ? tokens / elapsed : r.tokens / r.seconds;
    char mfu[32] = "-";
    if (peak_flops > 0) {  // two significant digits below 1% (a small model on a GPU: 0.06%, not 0.0%)
      const double percent = 100.0 * tps * flops_per_token / peak_flops;
      std::snprintf(mfu, sizeof mfu, percent < 1.0 ? "%.2g%%" : "%.1f%%", percent);
    }
    char buf[320];
    std::snprintf(buf, sizeof buf, "step %*ld/%ld | loss %.4f | lr %.2e | %.0f tok/s | MFU %s | scale %s | norm %.3f%s | %.0f ms/step | left %s",
                  static_cast<int>(std::to_string(steps).size()), r.step, steps, r.loss, r.lr, tps, mfu, loss_scale.c_str(),
                  r.grad_norm, r.applied ? "" : " (skipped)", 1000.0 * per_step,
                  human_duration(per_step * static_cast<double>(steps - r.step)).c_str());
    std::string out = buf;
    if (r.validated) {  // a NaN validation loss shows as such
      std::snprintf(buf, sizeof buf, " | val %.4f", r.val_loss);
      out += buf;
    }
    return out;
  }
};

//! step, loss, val_loss (empty when not validated; nan when it was NaN), lr, grad_norm, seconds, tokens
inline void write_loss_csv(const std::string& path, const std::vector<step_report>& reports) {
  std::ofstream f(path);
  TRIDENT_EXPECT(f.good(), "flagship: cannot write the loss curve to '", path, "'");
  f << "step,loss,val_loss,lr,grad_norm,seconds,tokens\n";
  for (const auto& r : reports) {
    f << r.step << ',' << r.loss << ',';
    if (r.validated) f << r.val_loss;
    f << ',' << r.lr << ',' << r.grad_norm << ',' << r.seconds << ',' << r.tokens << '\n';
  }
  TRIDENT_EXPECT(f.good(), "flagship: writing '", path, "' failed");
}

//! The loss curve (training per step, validation where measured) as an SVG line chart.
inline void write_loss_svg(const std::string& path, const std::vector<step_report>& reports, const std::string& title) {
  TRIDENT_EXPECT(!reports.empty(), "flagship: no steps to draw");
  const double w = 720, h = 420, left = 70, right = 20, top = 40, bottom = 50;
  double lo = reports.front().loss, hi = lo;
  for (const auto& r : reports) {
    for (double v : {r.loss, r.val_loss})
      if (std::isfinite(v)) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
  }
  if (hi - lo < 1e-9) hi = lo + 1;
  const double pad = 0.05 * (hi - lo);
  lo -= pad;
  hi += pad;
  const double last = static_cast<double>(std::max<long>(2, reports.back().step));
  auto x = [&](double step) { return left + (step - 1) / (last - 1) * (w - left - right); };
  auto y = [&](double v) { return top + (hi - v) / (hi - lo) * (h - top - bottom); };
  std::ofstream f(path);
  TRIDENT_EXPECT(f.good(), "flagship: cannot write the loss picture to '", path, "'");
  char buf[256];
  f << "<svg xmlns='http://www.w3.org/2000/svg' width='" << w << "' height='" << h << "' font-family='sans-serif' font-size='12'>\n";
  f << "<rect width='100%' height='100%' fill='white'/>\n";
  f << "<text x='" << w / 2 << "' y='22' text-anchor='middle' font-size='14'>" << title << "</text>\n";
  // Axes and ticks.
  f << "<line x1='" << left << "' y1='" << h - bottom << "' x2='" << w - right << "' y2='" << h - bottom << "' stroke='black'/>\n";
  f << "<line x1='" << left << "' y1='" << top << "' x2='" << left << "' y2='" << h - bottom << "' stroke='black'/>\n";
  for (int i = 0; i <= 5; ++i) {
    const double v = lo + (hi - lo) * i / 5.0, s = 1 + (last - 1) * i / 5.0;
    std::snprintf(buf, sizeof buf, "<text x='%.1f' y='%.1f' text-anchor='end'>%.2f</text>\n", left - 6, y(v) + 4, v);
    f << buf;
    std::snprintf(buf, sizeof buf, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#ddd'/>\n", left, y(v), w - right, y(v));
    f << buf;
    std::snprintf(buf, sizeof buf, "<text x='%.1f' y='%.1f' text-anchor='middle'>%.0f</text>\n", x(s), h - bottom + 18, s);
    f << buf;
  }
  std::snprintf(buf, sizeof buf, "<text x='%.1f' y='%.1f' text-anchor='middle'>step</text>\n", (left + w - right) / 2, h - 12);
  f << buf;
  std::snprintf(buf, sizeof buf, "<text x='16' y='%.1f' transform='rotate(-90 16 %.1f)' text-anchor='middle'>loss</text>\n",
                (top + h - bottom) / 2, (top + h - bottom) / 2);
  f << buf;
  // Training loss, then validation points joined.
  f << "<polyline fill='none' stroke='#1f77b4' stroke-width='1.5' points='";
  for (const auto& r : reports) {
    std::snprintf(buf, sizeof buf, "%.1f,%.1f ", x(static_cast<double>(r.step)), y(r.loss));
    f << buf;
  }
  f << "'/>\n";
  std::string val;
  for (const auto& r : reports)
    if (std::isfinite(r.val_loss)) {
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", x(static_cast<double>(r.step)), y(r.val_loss));
      val += buf;
      std::snprintf(buf, sizeof buf, "<circle cx='%.1f' cy='%.1f' r='3' fill='#d62728'/>\n", x(static_cast<double>(r.step)), y(r.val_loss));
      f << buf;
    }
  if (!val.empty()) f << "<polyline fill='none' stroke='#d62728' stroke-width='1.5' points='" << val << "'/>\n";
  f << "<text x='" << w - right - 150 << "' y='" << top + 16 << "' fill='#1f77b4'>training loss</text>\n";
  if (!val.empty()) f << "<text x='" << w - right - 150 << "' y='" << top + 32 << "' fill='#d62728'>validation loss</text>\n";
  f << "</svg>\n";
  TRIDENT_EXPECT(f.good(), "flagship: writing '", path, "' failed");
}

}  // namespace flagship
