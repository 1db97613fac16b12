// Progress display for long work: a bar with rate and ETA on stderr, redrawn in place on a
// terminal and printed as occasional lines otherwise (logs, CI).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace kareus {

class Progress {
 public:
  Progress(std::string label, std::size_t total, bool enabled = true);
  ~Progress();
  void update(std::size_t done);
  void finish();

 private:
  void draw(bool final);
  std::string label_;
  std::size_t total_;
  std::size_t done_ = 0;
  bool enabled_;
  bool tty_;
  bool finished_ = false;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

/// "1h02m", "3m05s", "12s".
std::string format_duration(double seconds);

}  // namespace kareus
