#include "coremesh/train/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "coremesh/train/metrics.hpp"
#include "coremesh/train/safetensors.hpp"

namespace coremesh::train {
namespace {

std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

struct Series {
  std::string name, color;
  std::vector<std::pair<double, double>> points;  // (x, y)
};

// A line chart (W x H px) with axes, ticks and a legend.
std::string line_chart(const std::string& title, const std::string& ylabel,
                       const std::vector<Series>& series) {
  const double W = 540, H = 280, L = 64, R = 16, T = 28, B = 40;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const auto& s : series)
    for (auto [x, y] : s.points) {
      if (!std::isfinite(y)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  std::string o = fmt::format(
      "<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' class='chart'>"
      "<rect width='100%' height='100%' fill='#fff'/>"
      "<text x='{}' y='18' font-size='14' font-weight='bold'>{}</text>",
      W, H, L, escape(title));
  if (x0 > x1) return o + "<text x='200' y='150'>no data</text></svg>";
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) {
    const double d = std::max(std::fabs(y0) * 0.1, 1e-12);
    y1 = y0 + d, y0 = y0 - d;
  }
  const double pad = 0.05 * (y1 - y0);
  y0 -= pad, y1 += pad;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return T + (1 - (y - y0) / (y1 - y0)) * (H - T - B); };
  o += fmt::format("<rect x='{}' y='{}' width='{}' height='{}' fill='#fafafa' stroke='#999'/>", L,
                   T, W - L - R, H - T - B);
  for (int i = 0; i <= 4; ++i) {
    double y = y0 + (y1 - y0) * i / 4, x = x0 + (x1 - x0) * i / 4;
    o += fmt::format("<line x1='{}' x2='{}' y1='{:.1f}' y2='{:.1f}' stroke='#ddd'/>", L, W - R,
                     py(y), py(y));
    o += fmt::format("<text x='{}' y='{:.1f}' font-size='11' text-anchor='end'>{:.4g}</text>",
                     L - 4, py(y) + 4, y);
    o += fmt::format("<text x='{:.1f}' y='{}' font-size='11' text-anchor='middle'>{:.0f}</text>",
                     px(x), H - B + 16, x);
  }
  o += fmt::format("<text x='{}' y='{}' font-size='11' text-anchor='middle'>step</text>",
                   (L + W - R) / 2, H - 6);
  o += fmt::format(
      "<text x='14' y='{}' font-size='11' text-anchor='middle' transform='rotate(-90 14 {})'>{}</text>",
      (T + H - B) / 2, (T + H - B) / 2, escape(ylabel));
  int li = 0;
  for (const auto& s : series) {
    std::string pts;
    for (auto [x, y] : s.points)
      if (std::isfinite(y)) pts += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
    o += fmt::format("<polyline fill='none' stroke='{}' stroke-width='2' points='{}'/>", s.color, pts);
    if (s.points.size() == 1)
      o += fmt::format("<circle cx='{:.1f}' cy='{:.1f}' r='3' fill='{}'/>", px(s.points[0].first),
                       py(s.points[0].second), s.color);
    o += fmt::format("<rect x='{}' y='{}' width='12' height='3' fill='{}'/><text x='{}' y='{}' "
                     "font-size='11'>{}</text>",
                     W - R - 150, T + 10 + 14 * li, s.color, W - R - 134, T + 14 + 14 * li,
                     escape(s.name));
    ++li;
  }
  return o + "</svg>";
}

// Viridis-like ramp from dark blue (0) to yellow (1).
std::string ramp(double v) {
  v = std::clamp(v, 0.0, 1.0);
  const double stops[5][3] = {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
  double p = v * 4;
  int i = std::min(3, int(p));
  double f = p - i;
  int rgb[3];
  for (int c = 0; c < 3; ++c) rgb[c] = int(stops[i][c] + f * (stops[i + 1][c] - stops[i][c]));
  return fmt::format("#{:02x}{:02x}{:02x}", rgb[0], rgb[1], rgb[2]);
}

std::string heatmap(const std::vector<ExpertLoadRecord>& recs) {
  if (recs.empty() || recs[0].load.empty())
    return "<p>No MoE layers: no expert load to show.</p>";
  const size_t layers = recs[0].load.size(), experts = recs[0].load[0].size();
  const size_t rows = layers * experts, cols = recs.size();
  const double L = 90, T = 28, W = 1100, cellw = std::max(1.0, std::min(24.0, (W - L - 80) / double(cols)));
  const double cellh = std::clamp(360.0 / double(rows), 4.0, 18.0);
  const double H = T + rows * cellh + 40;
  // Colour scale: share relative to perfect balance (1/E); 2/E and above saturate.
  const double perfect = 1.0 / double(experts);
  std::string o = fmt::format(
      "<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{:.0f}' class='chart'>"
      "<rect width='100%' height='100%' fill='#fff'/>"
      "<text x='{}' y='18' font-size='14' font-weight='bold'>Expert load (share of tokens; "
      "yellow = 2x balanced, dark = idle)</text>",
      L + cols * cellw + 80, H, L);
  for (size_t c = 0; c < cols; ++c) {
    for (size_t l = 0; l < layers; ++l)
      for (size_t e = 0; e < experts; ++e) {
        double v = l < recs[c].load.size() && e < recs[c].load[l].size() ? recs[c].load[l][e] : 0;
        size_t r = l * experts + e;
        o += fmt::format("<rect x='{:.1f}' y='{:.1f}' width='{:.1f}' height='{:.1f}' fill='{}'/>",
                         L + c * cellw, T + r * cellh, cellw + 0.3, cellh + 0.3,
                         ramp(v / (2 * perfect)));
      }
  }
  for (size_t l = 0; l < layers; ++l)
    o += fmt::format("<text x='{}' y='{:.1f}' font-size='11' text-anchor='end'>MoE {} e0..{}</text>",
                     L - 4, T + (l * experts + experts / 2.0) * cellh + 4, l, experts - 1);
  o += fmt::format("<text x='{}' y='{:.1f}' font-size='11'>step {}</text>", L, T + rows * cellh + 16,
                   recs.front().step + 1);
  o += fmt::format("<text x='{:.1f}' y='{:.1f}' font-size='11' text-anchor='end'>step {}</text>",
                   L + cols * cellw, T + rows * cellh + 16, recs.back().step + 1);
  return o + "</svg>";
}

// A pipeline's last step as it ran: a row per rank, a box per action from
// its start to its end on the rank's stream, coloured by kind and labelled
// with its token (0F3) where the box is wide enough. The gaps are the bubble.
std::string executed_schedule(const std::string& title, const std::vector<ExecutedAction>& actions) {
  int ranks = 0;
  double end = 0;
  for (const auto& a : actions) ranks = std::max(ranks, a.rank + 1), end = std::max(end, a.end_ms);
  if (ranks == 0 || end <= 0) return "";
  const double L = 70, T = 44, W = 1100, rowh = 26, H = T + ranks * rowh + 50, scale = (W - L - 20) / end;
  auto colour = [](const std::string& cat) {
    return cat == "F"     ? "#4e79a7"
           : cat == "B"   ? "#e15759"
           : cat == "I"   ? "#f28e2b"
           : cat == "W"   ? "#59a14f"
           : cat == "F&B" ? "#b07aa1"
           : cat == "p2p" ? "#bab0ac"
                          : "#9c755f";
  };
  std::string o = fmt::format(
      "<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{:.0f}' class='chart'>"
      "<rect width='100%' height='100%' fill='#fff'/>"
      "<text x='{}' y='18' font-size='14' font-weight='bold'>Executed schedule, last step: {}</text>"
      "<text x='{}' y='32' font-size='11'>F blue, B red, I orange, W green, F&amp;B purple, P2P and waits "
      "grey, gradient sums brown; hover a box for its action and times</text>",
      W, H, L, escape(title), L);
  for (int r = 0; r < ranks; ++r)
    o += fmt::format("<text x='{}' y='{:.1f}' font-size='11' text-anchor='end'>rank {}</text>", L - 6,
                     T + r * rowh + rowh / 2 + 4, r);
  for (const auto& a : actions) {
    const double x = L + a.start_ms * scale, w = std::max(0.5, (a.end_ms - a.start_ms) * scale);
    const double y = T + a.rank * rowh + (a.cat == "p2p" ? rowh * 0.6 : 2), h = a.cat == "p2p" ? rowh * 0.35 : rowh * 0.55;
    o += fmt::format("<rect x='{:.1f}' y='{:.1f}' width='{:.1f}' height='{:.1f}' fill='{}'><title>{} {:.3f}-{:.3f} ms"
                     "</title></rect>",
                     x, y, w, h, colour(a.cat), escape(a.action), a.start_ms, a.end_ms);
    if (a.cat != "p2p" && w > 18)  // the micro-batch: the digits after the kind's letters
      o += fmt::format("<text x='{:.1f}' y='{:.1f}' font-size='10' fill='#fff'>{}</text>", x + 2, y + h - 4,
                       escape(a.action));
  }
  o += fmt::format("<text x='{}' y='{:.1f}' font-size='11'>0 ms</text>", L, T + ranks * rowh + 16);
  o += fmt::format("<text x='{:.1f}' y='{:.1f}' font-size='11' text-anchor='end'>{:.2f} ms</text>", W - 20,
                   T + ranks * rowh + 16, end);
  return o + "</svg>";
}

}  // namespace

std::string render_report_html(const ReportData& d) {
  std::vector<Series> loss{{"train", "#1f77b4", {}}, {"validation", "#d62728", {}}};
  std::vector<Series> speed{{"tokens/s", "#2ca02c", {}}};
  for (const auto& r : d.steps) {
    loss[0].points.emplace_back(double(r.step + 1), r.loss);
    speed[0].points.emplace_back(double(r.step + 1), r.tokens_per_s);
  }
  for (const auto& v : d.validation) loss[1].points.emplace_back(double(v.step + 1), v.loss);
  std::vector<Series> lr{{"learning rate", "#9467bd", {}}};
  std::vector<Series> gn{{"grad norm", "#ff7f0e", {}}};
  for (const auto& r : d.steps) {
    lr[0].points.emplace_back(double(r.step + 1), r.lr);
    gn[0].points.emplace_back(double(r.step + 1), r.grad_norm);
  }
  // one line per MoE layer, from the loads the heatmap draws
  static const char* const kColors[] = {"#8c564b", "#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#ff7f0e",
                                        "#17becf", "#7f7f7f"};
  std::vector<Series> balance;
  for (const auto& rec : d.expert_load)
    for (size_t l = 0; l < rec.load.size(); ++l) {
      if (balance.size() <= l)
        balance.push_back({fmt::format("MoE layer {}", l), kColors[l % std::size(kColors)], {}});
      balance[l].points.emplace_back(double(rec.step + 1), expert_balance(rec.load[l]));
    }
  std::string o =
      "<!DOCTYPE html><html><head><meta charset='utf-8'><title>" + escape(d.title) +
      "</title><style>body{font-family:sans-serif;margin:24px;color:#222;background:#fff}"
      "table{border-collapse:collapse;margin-bottom:16px}td{border:1px solid #ccc;padding:3px 8px;"
      "font-size:13px}.chart{margin:6px;border:1px solid #ddd}</style></head><body>";
  o += "<h1>" + escape(d.title) + "</h1><table>";
  for (const auto& [k, v] : d.summary) o += "<tr><td>" + escape(k) + "</td><td>" + escape(v) + "</td></tr>";
  o += "</table><div>";
  o += line_chart("Loss (cross entropy, nats/token)", "loss", loss);
  o += line_chart("Throughput", "tokens/s", speed);
  o += "</div><div>" + heatmap(d.expert_load) + "</div>";
  if (!d.executed.empty()) o += "<div>" + executed_schedule(d.schedule, d.executed) + "</div>";
  if (!balance.empty()) {
    o += "<div>" + line_chart("Expert balance per MoE layer", "max / mean", balance) + "</div>";
    o += "<p>Balance is the tokens routed to the busiest expert over the mean tokens per expert, per "
         "MoE layer and step: 1 means every expert gets the same share, E (the number of experts) that "
         "one expert gets every token.</p>";
  }
  if (!d.samples.empty()) {
    o += "<h2>Samples at each validation" + (d.sampling.empty() ? "" : " (" + escape(d.sampling) + ")") +
         "</h2><table>";
    for (const auto& sm : d.samples)
      o += fmt::format("<tr><td>step {}</td><td><b>{}</b>{}</td></tr>", sm.step + 1, escape(sm.prompt),
                       escape(sm.text));
    o += "</table>";
  }
  o += "<div>";
  o += line_chart("Learning rate", "lr", lr);
  o += line_chart("Gradient norm (before clipping)", "norm", gn);
  o += "</div></body></html>\n";
  return o;
}

std::string write_report(const std::string& path, const ReportData& data) {
  write_file_atomic(path, render_report_html(data));
  return path;
}

}  // namespace coremesh::train
