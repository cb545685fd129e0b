#include "stop_signals.hpp"

#include <unistd.h>

#include <csignal>
#include <cstring>
#include <initializer_list>

namespace coremesh::cli {
namespace {

volatile std::sig_atomic_t g_first = 0;
volatile std::sig_atomic_t g_second_stops = 0;

void say(const char* text) { (void)!write(2, text, std::strlen(text)); }

// Async-signal-safe: flags, write() and _exit() only.
void on_stop_signal(int sig) {
  if (g_first == 0) {
    g_first = sig;
    if (g_second_stops) say("\ncoremesh: stopping after this step and saving a checkpoint (again: stop now)\n");
    return;
  }
  if (!g_second_stops) return;
  say("\ncoremesh: stopped at once; the last checkpoint written is the one to resume\n");
  _exit(128 + sig);
}

}  // namespace

void install_stop_signals(bool second_stops_at_once) {
  g_second_stops = second_stops_at_once ? 1 : 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // reads, writes and waits carry on after the handler
  for (int sig : {SIGINT, SIGTERM}) sigaction(sig, &sa, nullptr);
}

int stop_signal() { return g_first; }

const char* stop_signal_name(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal";
}

}  // namespace coremesh::cli
