// A cluster file: what the simulator knows of the hardware (docs/simulator.md).
//
// Hand-written files describe hardware we do not have: peak FLOP/s per dtype,
// memory bandwidth, achieved efficiencies, links within and across hosts.
// `coremesh calibrate` writes the same file for this machine and adds what it
// measured: the times of the shapes a model runs (GEMM, grouped GEMM,
// attention forward and backward), element-wise time by bytes, and per
// collective the latency and bandwidth fitted to timed exchanges.
//
// An op's time is its measured time when the file holds its shape, else the
// nearest measured shape of its kind scaled by work, else the roofline
// launch + max(FLOPs / (peak x efficiency), bytes / bandwidth).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace coremesh::sim {

inline constexpr const char* kClusterSchema = "coremesh-cluster/1";

enum class OpKind { gemm, grouped_gemm, grouped_gemm_dw, attention, attention_backward, elementwise };
std::string op_kind_name(OpKind kind);

// One kernel of a step: a GEMM (m x k) (k x n) (operands transposed as
// flagged), grouped GEMM (m rows over `groups` matrices k x n; _dw: the
// weight gradients of that forward), attention (batch, heads, kv_heads, q rows,
// kv rows, head dim), or element-wise work of `bytes`.
struct Op {
  OpKind kind = OpKind::elementwise;
  std::string dtype = "f32";  // of the GEMM inputs
  int64_t m = 0, n = 0, k = 0, groups = 0;  // gemm, grouped_gemm
  bool trans_a = false, trans_b = false;    // gemm
  int64_t batch = 0, heads = 0, kv_heads = 0, q_rows = 0, kv_rows = 0, head_dim = 0;  // attention
  bool causal = true;
  double flops = 0, bytes = 0;
  std::string key() const;  // the shape as the calibrated table names it
};

// Collectives as the simulator costs them: `steps` latencies and `volume`
// bytes on the link per PE (ring algorithms; n = the whole tensor's bytes).
enum class Collective { put, all_reduce, all_gather, reduce_scatter, all_to_all };
std::string collective_name(Collective c);
const std::vector<Collective>& all_collectives();
double collective_steps(Collective c, int pes);
double collective_volume(Collective c, int pes, double bytes);

struct Fit {  // seconds = steps x latency + volume / bandwidth
  double latency = 0, bandwidth = 0;
};
struct Link {
  std::string name;
  double latency = 0, bandwidth = 0;  // seconds; bytes/s per device, one direction
  std::map<Collective, Fit> fitted;   // calibrated: per collective
  // the TP and EP seams' exchanges where they run otherwise than the library's
  // collectives (a CPU host's: copies into symmetric memory, sums in member
  // order; the EP dispatch's counts, puts and regroups)
  std::map<Collective, Fit> seams;
  Fit fit(Collective c, bool seam = false) const;
};

struct Cluster {
  std::string name;
  std::vector<std::string> sources;  // where the numbers come from
  int devices = 1;                   // in the whole cluster
  struct Device {
    std::string name;
    std::map<std::string, double> peak_flops;  // dense FLOP/s per dtype: f32, bf16, fp8
    double memory_bytes = 0, memory_bandwidth = 0;
    int cube_cores = 0, vector_cores = 0;
    std::map<OpKind, double> efficiency;  // of peak (compute) or of bandwidth (element-wise)
    double launch_seconds = 0;
  } device;
  int host_devices = 1;  // devices per host (links within a host are intra_host)
  int cpu_cores = 0;     // > 0: the devices of a host share these cores (a CPU host)
  // A CPU host: how much slower a PE's GEMMs and its element-wise work run
  // when every core of the host computes (shared caches and memory bus);
  // measured by calibrate, 1 when not
  double busy_gemm_slowdown = 1, busy_memory_slowdown = 1;
  // A PE that exchanges with partners waits for the slowest of them: its
  // compute takes this fraction longer (calibrated: a GEMM between
  // all-reduces on 2 PEs against the GEMM and the all-reduce alone), with a
  // core per PE and with two PEs per core (PEs taking turns on a core)
  double partner_wait = 0, crowded_partner_wait = 0;
  Link intra_host, inter_host;
  // calibrated
  int threads = 0;  // cores per PE the measurements ran with (0: not calibrated)
  struct Measurement {
    double flops = 0, seconds = 0;
  };
  std::map<std::string, Measurement> measured;               // by Op::key()
  std::vector<std::pair<double, double>> elementwise_curve;  // (bytes, seconds), ascending

  double op_seconds(const Op& op) const;
  // One collective over `pes` PEs of `bytes` (see collective_volume),
  // over the link between hosts when the group spans hosts.
  double exchange_seconds(Collective c, int pes, double bytes, bool spans_hosts, bool seam = false) const;
  // How much slower compute and copies run when `pes_on_host` PEs of
  // `threads` cores each share the host's cpu_cores (1 without sharing):
  // time-sharing the cores, and the busy host's slowdown for `kind`.
  double sharing(int pes_on_host, int threads, OpKind kind = OpKind::gemm) const;
  double peak(const std::string& dtype) const;  // FLOP/s per device

  std::vector<std::string> problems() const;  // each says what to change
};

Cluster cluster_from_json(const nlohmann::json& j);  // validated
nlohmann::json to_json(const Cluster& c);
Cluster load_cluster(const std::string& path);
void save_cluster(const Cluster& c, const std::string& path);

}  // namespace coremesh::sim
