// Schedule placement, communication insertion and the text form (schedule.hpp).
#include "coremesh/parallel/schedule.hpp"

#include <fmt/format.h>

#include <cctype>
#include <fstream>
#include <sstream>

#include "coremesh/core/error.hpp"

namespace coremesh::parallel {

bool is_compute(ActionKind kind) { return kind <= ActionKind::FB; }
bool is_sum(ActionKind kind) { return kind == ActionKind::SendSum || kind == ActionKind::RecvSum; }

namespace {

// Names of the communication kinds in the text form, in ActionKind order.
constexpr std::string_view kCommNames[] = {"SEND_F", "RECV_F",   "SEND_B",
                                           "RECV_B", "SEND_SUM", "RECV_SUM"};
constexpr ActionKind kCommKinds[] = {ActionKind::SendF, ActionKind::RecvF,   ActionKind::SendB,
                                     ActionKind::RecvB, ActionKind::SendSum, ActionKind::RecvSum};

char compute_letter(ActionKind kind) { return "FBIW"[static_cast<int>(kind)]; }

}  // namespace

std::string to_string(const Action& a) {
  if (a.kind == ActionKind::FB)
    return fmt::format("{}F{}&{}{}{}", a.chunk, a.micro_batch, a.b_chunk, compute_letter(a.b_kind),
                       a.b_micro_batch);
  if (is_compute(a.kind))
    return fmt::format("{}{}{}", a.chunk, compute_letter(a.kind), a.micro_batch);
  const int comm = static_cast<int>(a.kind) - static_cast<int>(ActionKind::SendF);
  if (is_sum(a.kind)) return fmt::format("{}{}", a.chunk, kCommNames[comm]);
  return fmt::format("{}{}{}", a.chunk, kCommNames[comm], a.micro_batch);
}

std::string_view placement_name(Placement placement) {
  switch (placement) {
    case Placement::interleaved: return "interleaved";
    case Placement::v: return "v";
    case Placement::bidirectional: return "bidirectional";
  }
  return "?";
}

// ---- placement ---------------------------------------------------------------

int Schedule::num_stages() const {
  switch (placement) {
    case Placement::interleaved: return ranks * chunks;
    case Placement::v: return 2 * ranks;
    case Placement::bidirectional: return ranks;
  }
  return 0;
}

int Schedule::copy_of(int micro_batch) const {
  if (placement != Placement::bidirectional) return 0;
  return micro_batch < micro_batches / 2 ? 0 : 1;
}

int Schedule::stage_of(int rank, int chunk) const {
  switch (placement) {
    case Placement::interleaved: return rank + chunk * ranks;
    case Placement::v: return chunk == 0 ? rank : 2 * ranks - 1 - rank;
    case Placement::bidirectional: return chunk == 0 ? rank : ranks - 1 - rank;
  }
  return 0;
}

StageRef Schedule::locate(int micro_batch, int stage) const {
  switch (placement) {
    case Placement::interleaved: return {stage % ranks, stage / ranks};
    case Placement::v:
      return stage < ranks ? StageRef{stage, 0} : StageRef{2 * ranks - 1 - stage, 1};
    case Placement::bidirectional:
      return copy_of(micro_batch) == 0 ? StageRef{stage, 0} : StageRef{ranks - 1 - stage, 1};
  }
  return {};
}

bool Schedule::passes_through(int micro_batch, int chunk) const {
  return placement != Placement::bidirectional || chunk == copy_of(micro_batch);
}

StageRef Schedule::peer(int rank, const Action& message) const {
  CM_ASSERT(!is_compute(message.kind));
  if (is_sum(message.kind)) return {ranks - 1 - rank, 1 - message.chunk};
  const bool to_next = message.kind == ActionKind::SendF || message.kind == ActionKind::RecvB;
  const int stage = stage_of(rank, message.chunk) + (to_next ? 1 : -1);
  CM_ASSERT(stage >= 0 && stage < num_stages());
  return locate(message.micro_batch, stage);
}

void Schedule::check_sizes() const {
  CM_CHECK(ranks >= 1 && chunks >= 1 && micro_batches >= 1, "use pp, chunks and microbatches >= 1",
           "schedule '{}': pp={} chunks={} microbatches={}", name, ranks, chunks, micro_batches);
  const int64_t slots = int64_t(ranks) * chunks * micro_batches;
  CM_CHECK(slots <= kMaxScheduleSlots, "use fewer pipeline ranks, chunks or micro-batches",
           "schedule '{}': pp {} x {} chunk(s) x {} micro-batches = {} slots, more than {}", name, ranks, chunks,
           micro_batches, slots, kMaxScheduleSlots);
  CM_CHECK(placement == Placement::interleaved || chunks == 2,
           "the v and bidirectional placements hold exactly 2 chunks per rank",
           "schedule '{}': placement={} needs chunks=2, has {}", name, placement_name(placement),
           chunks);
  CM_CHECK(placement != Placement::bidirectional || (ranks % 2 == 0 && micro_batches % 2 == 0),
           "DualPipe's two directions need an even pp and an even number of micro-batches",
           "schedule '{}': bidirectional placement with pp={} and microbatches={}", name, ranks,
           micro_batches);
}

// ---- communication -------------------------------------------------------------

bool has_p2p(const Schedule& s) {
  for (const auto& rank : s.actions)
    for (const auto& a : rank)
      if (!is_compute(a.kind) && !is_sum(a.kind)) return true;
  return false;
}

bool has_sums(const Schedule& s) {
  for (const auto& rank : s.actions)
    for (const auto& a : rank)
      if (is_sum(a.kind)) return true;
  return false;
}

void add_p2p(Schedule& s) {
  s.check_sizes();
  CM_CHECK(static_cast<int>(s.actions.size()) == s.ranks, "give one action list per rank",
           "schedule '{}': {} action lists for pp={}", s.name, s.actions.size(), s.ranks);
  CM_CHECK(!has_p2p(s), "call add_p2p on a schedule without sends and receives",
           "schedule '{}' already has sends and receives", s.name);
  const int last = s.num_stages() - 1;
  for (int r = 0; r < s.ranks; ++r) {
    // The stage before / after (chunk, mb) of rank r lives on another rank.
    auto remote = [&](int chunk, int mb, int step) {
      const int stage = s.stage_of(r, chunk) + step;
      return stage >= 0 && stage <= last && s.locate(mb, stage).rank != r;
    };
    std::vector<Action> out;
    for (const Action& a : s.actions[r]) {
      if (is_sum(a.kind)) {
        out.push_back(a);
        continue;
      }
      const bool pair = a.kind == ActionKind::FB;
      const bool fwd = a.kind == ActionKind::F || pair;
      const bool bwd = a.kind == ActionKind::B || a.kind == ActionKind::I || pair;  // makes dx
      const int bc = pair ? a.b_chunk : a.chunk;  // the backward's (chunk, micro-batch)
      const int bmb = pair ? a.b_micro_batch : a.micro_batch;
      if (fwd && remote(a.chunk, a.micro_batch, -1))
        out.push_back({ActionKind::RecvF, a.chunk, a.micro_batch});
      if (bwd && remote(bc, bmb, +1)) out.push_back({ActionKind::RecvB, bc, bmb});
      out.push_back(a);
      if (fwd && remote(a.chunk, a.micro_batch, +1))
        out.push_back({ActionKind::SendF, a.chunk, a.micro_batch});
      if (bwd && remote(bc, bmb, -1)) out.push_back({ActionKind::SendB, bc, bmb});
    }
    s.actions[r] = std::move(out);
  }
}

// ---- text form -----------------------------------------------------------------

std::string to_text(const Schedule& s, bool with_p2p) {
  std::string text =
      fmt::format("schedule {} placement={} pp={} chunks={} microbatches={}\n", s.name,
                  placement_name(s.placement), s.ranks, s.chunks, s.micro_batches);
  for (const auto& rank : s.actions) {
    bool first = true;
    for (const Action& a : rank) {
      if (!with_p2p && !is_compute(a.kind) && !is_sum(a.kind)) continue;
      if (!first) text += ' ';
      text += to_string(a);
      first = false;
    }
    text += '\n';
  }
  return text;
}

namespace {

constexpr const char* kGrammarHint =
    "a token is <chunk><F|B|I|W><micro-batch> (0F3), a pair <chunk>F<mb>&<chunk><B|I><mb> "
    "(0F5&1B1), <chunk><SEND_F|RECV_F|SEND_B|RECV_B><micro-batch> (1RECV_B0) or "
    "<chunk><SEND_SUM|RECV_SUM> (0SEND_SUM); see include/coremesh/parallel/schedule.hpp";

struct TokenParser {
  std::string_view source;
  int line;
  int index;  // 1-based token number on the line
  std::string_view token;
  size_t pos = 0;

  [[noreturn]] void fail(const std::string& what, const char* hint = kGrammarHint) const {
    CM_THROW(InvalidArgument, hint, "{}, line {}, token {} `{}`: {}", source, line, index, token,
             what);
  }
  int number(const char* what) {
    const size_t begin = pos;
    long value = 0;
    while (pos < token.size() && std::isdigit(static_cast<unsigned char>(token[pos]))) {
      value = value * 10 + (token[pos++] - '0');
      if (value > 1'000'000) fail(fmt::format("{} is too large", what));
    }
    if (pos == begin) fail(fmt::format("expected a {} at character {}", what, begin + 1));
    return static_cast<int>(value);
  }
  bool eat(std::string_view word) {
    if (token.substr(pos, word.size()) != word) return false;
    pos += word.size();
    return true;
  }
  ActionKind kind() {
    for (size_t k = 0; k < std::size(kCommNames); ++k)
      if (eat(kCommNames[k])) return kCommKinds[k];
    for (ActionKind k : {ActionKind::F, ActionKind::B, ActionKind::I, ActionKind::W})
      if (eat(std::string_view(&"FBIW"[static_cast<int>(k)], 1))) return k;
    fail(
        fmt::format("unknown action at character {} (expected F, B, I, W, SEND_F, RECV_F, "
                    "SEND_B, RECV_B, SEND_SUM or RECV_SUM)",
                    pos + 1));
  }
  Action action() {
    Action a;
    a.chunk = number("chunk");
    a.kind = kind();
    if (!is_sum(a.kind)) a.micro_batch = number("micro-batch");  // a stage's sums: no micro-batch
    if (pos < token.size() && token[pos] == '&') {
      if (a.kind != ActionKind::F) fail("only a forward can start an overlapped pair (0F5&1B1)");
      ++pos;
      a.kind = ActionKind::FB;
      a.b_chunk = number("chunk");
      if (eat("I"))
        a.b_kind = ActionKind::I;
      else if (!eat("B"))
        fail("the second half of an overlapped pair must be a backward B or its input half I");
      a.b_micro_batch = number("micro-batch");
    }
    if (pos != token.size())
      fail(fmt::format("unexpected text after the action at character {}", pos + 1));
    return a;
  }
};

std::vector<std::string_view> split_blanks(std::string_view line) {
  std::vector<std::string_view> words;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    const size_t begin = i;
    while (i < line.size() && !std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    if (i > begin) words.push_back(line.substr(begin, i - begin));
  }
  return words;
}

void parse_header(Schedule& s, const std::vector<std::string_view>& words, std::string_view source,
                  int line) {
  const char* hint =
      "the first line is: schedule NAME placement=interleaved|v|bidirectional pp=P "
      "chunks=V microbatches=M";
  CM_CHECK(
      words.size() >= 2 && words[0] == "schedule" && words[1].find('=') == std::string_view::npos,
      hint, "{}, line {}: expected the header 'schedule NAME key=value ...'", source, line);
  s.name = std::string(words[1]);
  bool seen[4] = {false, false, false, false};
  for (size_t i = 2; i < words.size(); ++i) {
    const auto eq = words[i].find('=');
    const std::string_view key = words[i].substr(0, eq);
    const std::string_view value = eq == std::string_view::npos ? "" : words[i].substr(eq + 1);
    auto integer = [&]() {
      int v = 0;
      for (char c : value) {
        CM_CHECK(std::isdigit(static_cast<unsigned char>(c)) && v < 1'000'000, hint,
                 "{}, line {}, token {} `{}`: {} must be a positive integer", source, line, i + 1,
                 words[i], key);
        v = v * 10 + (c - '0');
      }
      CM_CHECK(!value.empty() && v > 0, hint,
               "{}, line {}, token {} `{}`: {} must be a positive integer", source, line, i + 1,
               words[i], key);
      return v;
    };
    if (key == "placement") {
      seen[0] = true;
      if (value == "interleaved")
        s.placement = Placement::interleaved;
      else if (value == "v")
        s.placement = Placement::v;
      else if (value == "bidirectional")
        s.placement = Placement::bidirectional;
      else
        CM_THROW(InvalidArgument, hint, "{}, line {}, token {} `{}`: unknown placement '{}'",
                 source, line, i + 1, words[i], value);
    } else if (key == "pp") {
      seen[1] = true;
      s.ranks = integer();
    } else if (key == "chunks") {
      seen[2] = true;
      s.chunks = integer();
    } else if (key == "microbatches") {
      seen[3] = true;
      s.micro_batches = integer();
    } else {
      CM_THROW(InvalidArgument, hint, "{}, line {}, token {} `{}`: unknown key '{}'", source, line,
               i + 1, words[i], key);
    }
  }
  const char* names[4] = {"placement", "pp", "chunks", "microbatches"};
  for (int k = 0; k < 4; ++k)
    CM_CHECK(seen[k], hint, "{}, line {}: the header lacks {}=", source, line, names[k]);
  s.check_sizes();
}

}  // namespace

Schedule parse_schedule(std::string_view text, std::string_view source) {
  Schedule s;
  bool header = false;
  int line_number = 0;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(begin, end - begin);
    begin = end + 1;
    ++line_number;
    if (const auto hash = line.find('#'); hash != std::string_view::npos)
      line = line.substr(0, hash);
    const auto words = split_blanks(line);
    if (words.empty()) continue;
    if (!header) {
      parse_header(s, words, source, line_number);
      header = true;
      continue;
    }
    CM_CHECK(static_cast<int>(s.actions.size()) < s.ranks,
             "give exactly one line of actions per rank after the header",
             "{}, line {}: more rank lines than pp={}", source, line_number, s.ranks);
    auto& rank = s.actions.emplace_back();
    for (size_t i = 0; i < words.size(); ++i) {
      TokenParser p{source, line_number, static_cast<int>(i + 1), words[i]};
      const Action a = p.action();
      const char* range_hint =
          "chunks count from 0 on each rank, micro-batches from 0; the header "
          "gives their numbers";
      for (auto [chunk, mb] :
           {std::pair{a.chunk, a.micro_batch}, std::pair{a.b_chunk, a.b_micro_batch}}) {
        if (chunk >= s.chunks)
          p.fail(fmt::format("chunk {} is out of range: chunks={}", chunk, s.chunks), range_hint);
        if (mb >= s.micro_batches)
          p.fail(
              fmt::format("micro-batch {} is out of range: microbatches={}", mb, s.micro_batches),
              range_hint);
      }
      rank.push_back(a);
    }
  }
  CM_CHECK(header, "start the text with: schedule NAME placement=... pp=P chunks=V microbatches=M",
           "{}: no header line", source);
  CM_CHECK(static_cast<int>(s.actions.size()) == s.ranks,
           "give exactly one line of actions per rank after the header",
           "{}: {} rank lines for pp={}", source, s.actions.size(), s.ranks);
  if (!has_p2p(s)) add_p2p(s);
  return s;
}

Schedule load_schedule(const std::string& path) {
  std::ifstream in(path);
  CM_CHECK(in.good(), "check the path of the schedule file", "cannot open schedule file '{}'",
           path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_schedule(text.str(), path);
}

}  // namespace coremesh::parallel
