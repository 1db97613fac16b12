#include "kareus/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>

namespace kareus {

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto total = static_cast<long long>(std::llround(s));
  if (total >= 3600) return fmt::format("{}h{:02}m", total / 3600, (total % 3600) / 60);
  if (total >= 60) return fmt::format("{}m{:02}s", total / 60, total % 60);
  if (s < 10) return fmt::format("{:.1f}s", s);
  return fmt::format("{}s", total);
}

Progress::Progress(std::string label, std::size_t total, bool enabled)
    : label_(std::move(label)),
      total_(total),
      enabled_(enabled),
      tty_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

Progress::~Progress() { finish(); }

void Progress::update(std::size_t done) {
  done_ = done;
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (tty_) {
    if (now - last_draw_ > std::chrono::milliseconds(100) || done_ == total_) draw(false);
  } else {
    const int decile = total_ ? static_cast<int>(10 * done_ / total_) : 10;
    if (decile != last_decile_) {
      last_decile_ = decile;
      draw(false);
    }
  }
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  // Off a terminal the last decile line already said 100%.
  if (enabled_ && (tty_ || last_decile_ != 10)) draw(true);
}

void Progress::draw(bool final) {
  last_draw_ = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(last_draw_ - start_).count();
  const double frac = total_ ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
  const int width = 30;
  const int fill = static_cast<int>(frac * width);
  const double eta =
      done_ ? elapsed / static_cast<double>(done_) * static_cast<double>(total_ - done_) : NAN;
  const std::string bar = std::string(static_cast<std::size_t>(fill), '#') +
                          std::string(static_cast<std::size_t>(width - fill), '-');
  const std::string line =
      fmt::format("{} [{}] {}/{} {:3.0f}% elapsed {} ETA {}", label_, bar, done_, total_,
                  100 * frac, format_duration(elapsed), final ? "0s" : format_duration(eta));
  if (tty_) {
    std::fprintf(stderr, "\r%s\033[K%s", line.c_str(), final ? "\n" : "");
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

}  // namespace kareus
