// A progress bar for work of known size that may take more than a couple of
// seconds: bytes scored by `coremesh eval`, bytes generated, a validation
// pass's batches. (The trainer's per-step line is train::Progress.)
//
//   terminal   one line on `out`, redrawn in place at most every redraw_s:
//                eval [#########               ]  41% 36.00K/87.42K bytes 5.02K bytes/s ETA 00:00:10
//              drawn only once the work has run show_after_s (short work
//              shows nothing) and erased by finish(), so the lines printed
//              after it, and the trainer's step bar, are left as they were.
//   lines      not a terminal (a log file, a pipe): the same text without the
//              bar, as a plain line every line_every_s; work shorter than that
//              prints nothing.
//   off        `--no-progress`: nothing.
// The ETA divides what is left by the rate so far (units per second since
// the bar was made). Not thread-safe: one thread updates a bar.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace coremesh::train {

class ProgressBar {
 public:
  enum class Mode { automatic, terminal, lines, off };  // automatic: terminal iff isatty(out)
  struct Options {
    std::string label;          // "eval", "validation", "generate"
    std::string unit;           // "bytes", "batches"
    Mode mode = Mode::automatic;
    std::FILE* out = stderr;
    double show_after_s = 0.5;  // terminal: nothing before
    double redraw_s = 0.1;      // terminal: at most one redraw per
    double line_every_s = 10;   // lines: one line per
    std::function<double()> clock;  // seconds; default now_seconds() (tests pass a fake one)
  };

  ProgressBar(int64_t total, Options options);
  ~ProgressBar();  // finish()
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void advance(int64_t units = 1) { set(done_ + units); }
  void set(int64_t done);  // draws when the mode and the throttle say so
  void finish();           // erases a drawn bar; later set() calls draw nothing
  Mode mode() const { return mode_; }

  // The text of one update (no bar, no escape codes), e.g.
  // "eval  41% 36.00K/87.42K bytes 5.02K bytes/s ETA 00:00:10".
  static std::string describe(const std::string& label, const std::string& unit, int64_t done, int64_t total,
                              double elapsed_s);

 private:
  double now() const;
  void draw(double elapsed_s);

  int64_t total_, done_ = 0;
  Options o_;
  Mode mode_;
  double start_s_, last_draw_s_;
  bool drawn_ = false, finished_ = false;
};

}  // namespace coremesh::train
