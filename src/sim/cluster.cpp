#include "coremesh/sim/cluster.hpp"

#include <set>
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <nlohmann/json.hpp>

#include "coremesh/core/error.hpp"
#include "coremesh/core/file.hpp"
#include "coremesh/core/json.hpp"

namespace coremesh::sim {

namespace {

const std::vector<std::pair<OpKind, std::string>> kOpKinds = {
    {OpKind::gemm, "gemm"},
    {OpKind::grouped_gemm, "grouped_gemm"},
    {OpKind::grouped_gemm_dw, "grouped_gemm_dw"},
    {OpKind::attention, "attention"},
    {OpKind::attention_backward, "attention_backward"},
    {OpKind::elementwise, "elementwise"}};

const std::vector<std::pair<Collective, std::string>> kCollectives = {
    {Collective::put, "put"},
    {Collective::all_reduce, "all_reduce"},
    {Collective::all_gather, "all_gather"},
    {Collective::reduce_scatter, "reduce_scatter"},
    {Collective::all_to_all, "all_to_all"}};

template <class E>
E parse_name(const std::vector<std::pair<E, std::string>>& names, const std::string& text, const char* what) {
  std::string known;
  for (const auto& [value, name] : names) {
    if (name == text) return value;
    known += (known.empty() ? "" : ", ") + name;
  }
  CM_THROW(InvalidArgument, fmt::format("use one of {}", known), "cluster file: unknown {} '{}'", what, text);
}

// The log-log interpolation of a measured (work, seconds) curve; beyond its
// ends, time proportional to work from the nearest point.
double interpolate(const std::vector<std::pair<double, double>>& curve, double work) {
  if (work <= 0) return 0;
  if (work <= curve.front().first) return curve.front().second * work / curve.front().first;
  if (work >= curve.back().first) return curve.back().second * work / curve.back().first;
  const auto hi = std::lower_bound(curve.begin(), curve.end(), std::make_pair(work, 0.0));
  const auto lo = hi - 1;
  const double t = std::log(work / lo->first) / std::log(hi->first / lo->first);
  return std::exp(std::log(lo->second) + t * (std::log(hi->second) - std::log(lo->second)));
}

// A section of the file holds only the fields docs/simulator.md lists: a
// misspelt one would leave its value at the default, silently.
void only_fields(const nlohmann::json& j, const std::string& where, std::initializer_list<const char*> fields) {
  CM_CHECK(j.is_object(), "see docs/simulator.md for the cluster file's fields", "cluster file: {} is not an object but {}",
           where, j.type_name());
  for (const auto& [key, value] : j.items())
    CM_CHECK(std::find_if(fields.begin(), fields.end(), [&](const char* f) { return key == f; }) != fields.end(),
             fmt::format("{}'s fields are {} (docs/simulator.md)", where, fmt::join(fields, ", ")),
             "cluster file: unknown field '{}' in {}", key, where);
}

Link link_from_json(const nlohmann::json& j, const std::string& where) {
  only_fields(j, where, {"name", "latency_seconds", "bandwidth", "collectives", "seams"});
  Link l;
  l.name = j.value("name", "");
  l.latency = j.at("latency_seconds").get<double>();
  l.bandwidth = j.at("bandwidth").get<double>();
  for (const auto& [field, fits] : {std::pair{"collectives", &l.fitted}, std::pair{"seams", &l.seams}})
    if (j.contains(field))
      for (const auto& [name, f] : j.at(field).items())
        only_fields(f, fmt::format("{}.{}.{}", where, field, name), {"latency_seconds", "bandwidth"}),
        (*fits)[parse_name(kCollectives, name, "collective")] = {f.at("latency_seconds").get<double>(),
                                                                  f.at("bandwidth").get<double>()};
  return l;
}

nlohmann::json link_to_json(const Link& l) {
  nlohmann::json j = {{"name", l.name}, {"latency_seconds", l.latency}, {"bandwidth", l.bandwidth}};
  for (const auto& [field, fits] : {std::pair{"collectives", &l.fitted}, std::pair{"seams", &l.seams}})
    for (const auto& [c, f] : *fits)
      j[field][collective_name(c)] = {{"latency_seconds", f.latency}, {"bandwidth", f.bandwidth}};
  return j;
}

}  // namespace

std::string op_kind_name(OpKind kind) {
  for (const auto& [k, name] : kOpKinds)
    if (k == kind) return name;
  return "?";
}

std::string collective_name(Collective c) {
  for (const auto& [k, name] : kCollectives)
    if (k == c) return name;
  return "?";
}

const std::vector<Collective>& all_collectives() {
  static const std::vector<Collective> all = [] {
    std::vector<Collective> v;
    for (const auto& [c, name] : kCollectives) v.push_back(c);
    return v;
  }();
  return all;
}

std::string Op::key() const {
  switch (kind) {
    case OpKind::gemm:
      return fmt::format("gemm {} {}x{}x{}{}{}", dtype, m, n, k, trans_a ? " ta" : "", trans_b ? " tb" : "");
    case OpKind::grouped_gemm:
    case OpKind::grouped_gemm_dw:
      return fmt::format("{} {} {}x{}x{} groups {}", op_kind_name(kind), dtype, m, n, k, groups);
    case OpKind::attention:
    case OpKind::attention_backward:
      return fmt::format("{} b{} h{} kv{} q{} k{} d{}{}", op_kind_name(kind), batch, heads, kv_heads, q_rows,
                         kv_rows, head_dim, causal ? " causal" : "");
    case OpKind::elementwise: return fmt::format("elementwise {}", bytes);
  }
  return {};
}

// Ring algorithms: an all-reduce is a reduce-scatter and an all-gather.
double collective_steps(Collective c, int pes) {
  if (pes <= 1) return 0;
  switch (c) {
    case Collective::put: return 1;
    case Collective::all_reduce: return 2.0 * (pes - 1);
    default: return pes - 1;
  }
}

double collective_volume(Collective c, int pes, double bytes) {
  if (pes <= 1) return 0;
  const double share = double(pes - 1) / pes;
  switch (c) {
    case Collective::put: return bytes;
    case Collective::all_reduce: return 2 * share * bytes;
    default: return share * bytes;
  }
}

Fit Link::fit(Collective c, bool seam) const {
  if (const auto it = seams.find(c); seam && it != seams.end()) return it->second;
  const auto it = fitted.find(c);
  return it != fitted.end() ? it->second : Fit{latency, bandwidth};
}

double Cluster::peak(const std::string& dtype) const {
  const auto it = device.peak_flops.find(dtype);
  if (it != device.peak_flops.end()) return it->second;
  return device.peak_flops.at("f32");  // a dtype without its own peak runs at f32's (validated present)
}

double Cluster::op_seconds(const Op& op) const {
  if (op.kind == OpKind::elementwise && !elementwise_curve.empty()) return interpolate(elementwise_curve, op.bytes);
  const std::string key = op.key();
  if (const auto it = measured.find(key); it != measured.end()) return it->second.seconds;
  if (op.dtype != "f32" && !measured.empty()) {  // a calibrated CPU times low precision as its f32 twin
    Op twin = op;
    twin.dtype = "f32";
    if (const auto it = measured.find(twin.key()); it != measured.end()) return it->second.seconds;
  }
  // the measured shape of the same kind and dtype nearest in work, scaled (within 4x)
  if (op.flops > 0) {
    const std::string prefix = key.substr(0, key.find(' ', key.find(' ') + 1) + 1);
    const Measurement* best = nullptr;
    double best_distance = std::log(4.0);
    for (const auto& [other, m] : measured)
      if (other.compare(0, prefix.size(), prefix) == 0 && m.flops > 0) {
        const double d = std::abs(std::log(m.flops / op.flops));
        if (d < best_distance) best_distance = d, best = &m;
      }
    if (best) return best->seconds * op.flops / best->flops;
  }
  const auto eff = [&](OpKind k) {
    const auto it = device.efficiency.find(k);
    return it != device.efficiency.end() ? it->second : 1.0;
  };
  if (op.kind == OpKind::elementwise)
    return device.launch_seconds + op.bytes / (device.memory_bandwidth * eff(OpKind::elementwise));
  return device.launch_seconds +
         std::max(op.flops / (peak(op.dtype) * eff(op.kind)), op.bytes / device.memory_bandwidth);
}

double Cluster::exchange_seconds(Collective c, int pes, double bytes, bool spans_hosts, bool seam) const {
  if (pes <= 1 || bytes <= 0) return 0;
  const Link& link = spans_hosts ? inter_host : intra_host;
  const Fit f = link.fit(c, seam);
  return collective_steps(c, pes) * f.latency + collective_volume(c, pes, bytes) / f.bandwidth;
}

double Cluster::sharing(int pes_on_host, int threads_per_pe, OpKind kind) const {
  if (cpu_cores <= 0) return 1;
  const double busy_cores = double(pes_on_host) * std::max(1, threads_per_pe);
  // the busy slowdown grows from none with one core busy to all of it with every core busy
  const double busy = cpu_cores > 1 ? std::min(1.0, (busy_cores - 1) / (cpu_cores - 1)) : 0.0;
  const double slowdown = kind == OpKind::elementwise ? busy_memory_slowdown : busy_gemm_slowdown;
  return std::max(1.0, busy_cores / cpu_cores) * (1 + busy * (slowdown - 1));
}

namespace {
// A whole count of `j` (1 when absent): one past int's range is refused, not truncated.
int count_field(const nlohmann::json& j, const char* key, int absent = 1) {
  if (!j.contains(key)) return absent;
  const nlohmann::json& v = j.at(key);
  CM_CHECK(v.is_number_integer() && v.get<int64_t>() >= INT_MIN && v.get<int64_t>() <= INT_MAX,
           "give a whole number of a reasonable size", "cluster file: {} is {}, not a count", key, v.dump());
  return int(v.get<int64_t>());
}
}  // namespace

std::vector<std::string> Cluster::problems() const {
  std::vector<std::string> out;
  // rates (FLOP/s, B/s) below 1 are unit mistakes, and their costs overflow
  auto positive = [&](double v, const char* field) {
    if (!(v >= 1) || !std::isfinite(v))
      out.push_back(fmt::format("{} is {}: give a rate of at least 1 (FLOP/s or B/s)", field, v));
  };
  if (devices < 1) out.push_back(fmt::format("devices is {}: give the cluster's device count (>= 1)", devices));
  if (host_devices < 1)
    out.push_back(fmt::format("host.devices is {}: give the devices per host (>= 1)", host_devices));
  else if (devices >= 1 && devices % host_devices != 0)
    out.push_back(fmt::format("host.devices is {} but devices is {}: give whole hosts (devices a multiple of "
                              "host.devices)", host_devices, devices));
  if (!(device.memory_bytes >= 0) || !std::isfinite(device.memory_bytes))
    out.push_back(fmt::format("device.memory_bytes is {}: give the device's memory in bytes (0: unknown)",
                              device.memory_bytes));
  if (cpu_cores < 0) out.push_back("host.cpu_cores is negative: give 0 (devices do not share) or the host's cores");
  if (!(busy_gemm_slowdown >= 1 && busy_memory_slowdown >= 1 && busy_gemm_slowdown <= 100 && busy_memory_slowdown <= 100))
    out.push_back("host.busy_gemm_slowdown and busy_memory_slowdown are factors from 1 to 100 (1: a busy host is not "
                  "slower)");
  if (threads < 0) out.push_back("measured.threads is negative: give the threads per PE it was measured with (0: unknown)");
  if (!(partner_wait >= 0 && crowded_partner_wait >= 0 && partner_wait <= 100 && crowded_partner_wait <= 100))
    out.push_back("host.partner_wait and crowded_partner_wait are fractions >= 0 (0: partners never wait)");
  if (!device.peak_flops.count("f32"))
    out.push_back("device.peak_flops has no \"f32\": give at least the f32 peak (FLOP/s)");
  for (const auto& [dtype, v] : device.peak_flops) positive(v, fmt::format("device.peak_flops.{}", dtype).c_str());
  positive(device.memory_bandwidth, "device.memory_bandwidth");
  for (const auto& [k, v] : device.efficiency)
    if (!(v > 0 && v <= 1))
      out.push_back(fmt::format("device.efficiency.{} is {}: give a fraction in (0, 1]", op_kind_name(k), v));
  // times: seconds, at most an hour (a unit mistake otherwise: its costs overflow)
  auto time = [&](double v, const std::string& field) {
    if (!(v >= 0 && v <= 3600)) out.push_back(fmt::format("{} is {}: give a time in seconds from 0 to 3600", field, v));
  };
  time(device.launch_seconds, "device.launch_seconds");
  for (const auto* l : {&intra_host, &inter_host}) {
    const char* name = l == &intra_host ? "links.intra_host" : "links.inter_host";
    positive(l->bandwidth, fmt::format("{}.bandwidth", name).c_str());
    time(l->latency, fmt::format("{}.latency_seconds", name));
    for (const auto& [field, fits] : {std::pair{"collectives", &l->fitted}, std::pair{"seams", &l->seams}})
      for (const auto& [c, f] : *fits) {
        positive(f.bandwidth, fmt::format("{}.{}.{}.bandwidth", name, field, collective_name(c)).c_str());
        time(f.latency, fmt::format("{}.{}.{}.latency_seconds", name, field, collective_name(c)));
      }
  }
  for (size_t i = 1; i < elementwise_curve.size(); ++i)
    if (!(elementwise_curve[i].first > elementwise_curve[i - 1].first))
      out.push_back("measured.elementwise: give the (bytes, seconds) points in ascending bytes");
  for (const auto& [bytes, seconds] : elementwise_curve)
    if (!(bytes > 0 && seconds > 0)) out.push_back("measured.elementwise: bytes and seconds must be > 0");
  for (const auto& [key, m] : measured)
    if (!(m.seconds > 0 && m.flops >= 0))
      out.push_back(fmt::format("measured op '{}' takes {} s for {} FLOPs: give a time > 0", key, m.seconds, m.flops));
  return out;
}

Cluster cluster_from_json(const nlohmann::json& j) {
  Cluster c;
  CM_CHECK(j.is_object(), "write the cluster file as a JSON object (docs/simulator.md)",
           "cluster file: not a JSON object but {}", j.type_name());
  static const std::set<std::string> kKeys{"schema", "name", "sources", "devices", "device", "host", "links", "measured"};
  for (const auto& [key, value] : j.items())
    CM_CHECK(kKeys.count(key), "its fields are schema, name, sources, devices, device, host, links and measured "
             "(docs/simulator.md)", "cluster file: unknown field '{}'", key);
  try {
    const std::string schema = j.value("schema", "");
    CM_CHECK(schema == kClusterSchema, fmt::format("start the file with \"schema\": \"{}\"", kClusterSchema),
             "cluster file: schema '{}' is not {}", schema, kClusterSchema);
    c.name = j.value("name", "");
    c.sources = j.value("sources", std::vector<std::string>{});
    c.devices = count_field(j, "devices");
    const auto& d = j.at("device");
    only_fields(d, "device", {"name", "peak_flops", "memory_bytes", "memory_bandwidth", "cube_cores", "vector_cores",
                              "efficiency", "launch_seconds"});
    c.device.name = d.value("name", "");
    c.device.peak_flops = d.at("peak_flops").get<std::map<std::string, double>>();
    c.device.memory_bytes = d.value("memory_bytes", 0.0);
    c.device.memory_bandwidth = d.at("memory_bandwidth").get<double>();
    c.device.cube_cores = d.value("cube_cores", 0);
    c.device.vector_cores = d.value("vector_cores", 0);
    if (d.contains("efficiency"))
      for (const auto& [name, v] : d.at("efficiency").items())
        c.device.efficiency[parse_name(kOpKinds, name, "op kind")] = v.get<double>();
    c.device.launch_seconds = d.value("launch_seconds", 0.0);
    if (j.contains("host")) {
      only_fields(j.at("host"), "host", {"devices", "cpu_cores", "busy_gemm_slowdown", "busy_memory_slowdown",
                                         "partner_wait", "crowded_partner_wait"});
      c.host_devices = count_field(j.at("host"), "devices");
      c.cpu_cores = count_field(j.at("host"), "cpu_cores", 0);
      c.busy_gemm_slowdown = j.at("host").value("busy_gemm_slowdown", 1.0);
      c.busy_memory_slowdown = j.at("host").value("busy_memory_slowdown", 1.0);
      c.partner_wait = j.at("host").value("partner_wait", 0.0);
      c.crowded_partner_wait = j.at("host").value("crowded_partner_wait", c.partner_wait);
    }
    only_fields(j.at("links"), "links", {"intra_host", "inter_host"});
    c.intra_host = link_from_json(j.at("links").at("intra_host"), "links.intra_host");
    c.inter_host = link_from_json(j.at("links").at("inter_host"), "links.inter_host");
    if (j.contains("measured")) {
      const auto& m = j.at("measured");
      only_fields(m, "measured", {"threads", "ops", "elementwise"});
      c.threads = m.value("threads", 0);
      if (m.contains("ops"))
        for (const auto& op : m.at("ops"))
          only_fields(op, "a measured op", {"key", "flops", "seconds"}),
          c.measured[op.at("key").get<std::string>()] = {op.value("flops", 0.0), op.at("seconds").get<double>()};
      if (m.contains("elementwise"))
        for (const auto& p : m.at("elementwise")) c.elementwise_curve.emplace_back(p.at(0).get<double>(), p.at(1).get<double>());
    }
  } catch (const nlohmann::json::exception& e) {
    CM_THROW(InvalidArgument, "see docs/simulator.md for the cluster file's fields", "cluster file: {}", e.what());
  }
  const auto problems = c.problems();
  if (!problems.empty()) {
    std::string all;
    for (const auto& p : problems) all += "\n  " + p;
    CM_THROW(InvalidArgument, "fix these fields (docs/simulator.md)", "cluster file '{}':{}", c.name, all);
  }
  return c;
}

nlohmann::json to_json(const Cluster& c) {
  nlohmann::json eff = nlohmann::json::object();
  for (const auto& [k, v] : c.device.efficiency) eff[op_kind_name(k)] = v;
  nlohmann::json j = {
      {"schema", kClusterSchema},
      {"name", c.name},
      {"sources", c.sources},
      {"devices", c.devices},
      {"device",
       {{"name", c.device.name},
        {"peak_flops", c.device.peak_flops},
        {"memory_bytes", c.device.memory_bytes},
        {"memory_bandwidth", c.device.memory_bandwidth},
        {"cube_cores", c.device.cube_cores},
        {"vector_cores", c.device.vector_cores},
        {"efficiency", eff},
        {"launch_seconds", c.device.launch_seconds}}},
      {"host",
       {{"devices", c.host_devices},
        {"cpu_cores", c.cpu_cores},
        {"busy_gemm_slowdown", c.busy_gemm_slowdown},
        {"busy_memory_slowdown", c.busy_memory_slowdown},
        {"partner_wait", c.partner_wait},
        {"crowded_partner_wait", c.crowded_partner_wait}}},
      {"links", {{"intra_host", link_to_json(c.intra_host)}, {"inter_host", link_to_json(c.inter_host)}}}};
  if (c.threads > 0 || !c.measured.empty() || !c.elementwise_curve.empty()) {
    nlohmann::json curve = nlohmann::json::array();
    for (const auto& [bytes, seconds] : c.elementwise_curve) curve.push_back({bytes, seconds});
    nlohmann::json ops = nlohmann::json::array();
    for (const auto& [key, m] : c.measured) ops.push_back({{"key", key}, {"flops", m.flops}, {"seconds", m.seconds}});
    j["measured"] = {{"threads", c.threads}, {"ops", ops}, {"elementwise", curve}};
  }
  return j;
}

Cluster load_cluster(const std::string& path) {
  return cluster_from_json(load_user_json(
      path, "cluster file", "check the path (clusters/ holds examples; `coremesh calibrate` writes one)"));
}

void save_cluster(const Cluster& c, const std::string& path) { write_file_atomic(path, to_json(c).dump(2) + "\n"); }

}  // namespace coremesh::sim
