#include "coremesh/train/progress_bar.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>

#include "coremesh/train/metrics.hpp"

namespace coremesh::train {
namespace {

constexpr int kBarWidth = 24;

ProgressBar::Mode resolve(ProgressBar::Mode mode, std::FILE* out) {
  if (mode != ProgressBar::Mode::automatic) return mode;
  return ::isatty(::fileno(out)) == 1 ? ProgressBar::Mode::terminal : ProgressBar::Mode::lines;
}

}  // namespace

ProgressBar::ProgressBar(int64_t total, Options options)
    : total_(std::max<int64_t>(0, total)), o_(std::move(options)), mode_(resolve(o_.mode, o_.out)) {
  start_s_ = now();
  last_draw_s_ = start_s_;
}

ProgressBar::~ProgressBar() { finish(); }

double ProgressBar::now() const { return o_.clock ? o_.clock() : now_seconds(); }

std::string ProgressBar::describe(const std::string& label, const std::string& unit, int64_t done, int64_t total,
                                  double elapsed_s) {
  const double frac = total > 0 ? std::clamp(double(done) / double(total), 0.0, 1.0) : 1.0;
  const double rate = elapsed_s > 0 ? double(done) / elapsed_s : 0;
  const double eta = rate > 0 ? double(std::max<int64_t>(0, total - done)) / rate : -1;
  return fmt::format("{} {:3.0f}% {}/{} {} {} {}/s ETA {}", label, 100 * frac, format_count(double(done)),
                     format_count(double(total)), unit, format_count(rate), unit, format_duration(eta));
}

void ProgressBar::set(int64_t done) {
  done_ = std::clamp<int64_t>(done, 0, total_);
  if (finished_ || mode_ == Mode::off) return;
  const double t = now(), elapsed = t - start_s_;
  if (mode_ == Mode::terminal) {
    if (elapsed < o_.show_after_s || (drawn_ && t - last_draw_s_ < o_.redraw_s)) return;
  } else if (t - last_draw_s_ < o_.line_every_s) {
    return;
  }
  last_draw_s_ = t;
  draw(elapsed);
}

void ProgressBar::draw(double elapsed_s) {
  const std::string text = describe(o_.label, o_.unit, done_, total_, elapsed_s);
  if (mode_ == Mode::lines) {
    fmt::print(o_.out, "{}\n", text);
  } else {
    const int fill = total_ > 0 ? int(double(kBarWidth) * double(done_) / double(total_)) : kBarWidth;
    std::string bar(size_t(fill), '#');
    bar.append(size_t(kBarWidth - fill), ' ');
    // The label first, then the bar in place of the space after it.
    const size_t label_end = o_.label.size();
    fmt::print(o_.out, "\r\x1b[2K{} [{}]{}", o_.label, bar, text.substr(label_end));
    drawn_ = true;
  }
  std::fflush(o_.out);
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (drawn_) {
    fmt::print(o_.out, "\r\x1b[2K");
    std::fflush(o_.out);
  }
  drawn_ = false;
}

}  // namespace coremesh::train
