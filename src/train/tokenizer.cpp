#include "coremesh/train/tokenizer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "coremesh/core/error.hpp"
#include "coremesh/train/safetensors.hpp"

namespace coremesh::train {
namespace {

const char* kTrainHint = "train one with `coremesh tokenizer train --vocab 4096 --model bpe --data FILES --out tok.model`";

// The lines of the files' training shares, one sentence each (SentencePiece's unit).
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  LineIterator(const std::vector<std::string>& paths, double val_fraction) {
    for (const auto& path : paths) {
      std::error_code ec;
      CM_CHECK(!std::filesystem::is_directory(path, ec), "name the text files inside it (e.g. --data dir/*.txt)",
               "data file '{}' is a directory", path);
      CM_CHECK(!std::filesystem::exists(path, ec) || std::filesystem::is_regular_file(path, ec),
               "copy the text into a file first (training reads it again, split the same way)",
               "data file '{}' is not a regular file", path);  // opening a FIFO waited for a writer
      std::ifstream in(path, std::ios::binary);
      CM_CHECK(in.good(), "check the --data path", "cannot open data file '{}'", path);
      std::stringstream ss;
      ss << in.rdbuf();
      std::string text = ss.str();
      text.resize(text.size() - size_t(double(text.size()) * val_fraction));  // as TextDataset splits
      text_ += text;
      text_ += '\n';
    }
    Next();
  }
  bool done() const override { return at_ > text_.size(); }
  // The next non-empty line; one longer than SentencePiece takes
  // (kMaxLine, it skips longer ones silently) in pieces, each cut before a
  // space where there is one in its last quarter, else between characters.
  void Next() override {
    while (at_ <= text_.size()) {
      size_t end = text_.find('\n', at_);
      if (end == std::string::npos) end = text_.size();
      size_t next = end + 1;
      if (end - at_ > kMaxLine) {
        end = at_ + kMaxLine;
        const size_t space = text_.rfind(' ', end);
        if (space != std::string::npos && space > at_ + kMaxLine * 3 / 4) end = space;
        else
          while (end > at_ && (static_cast<unsigned char>(text_[end]) & 0xC0) == 0x80) --end;  // a UTF-8 start
        if (end == at_) end = at_ + kMaxLine;  // no character starts in it (not text): cut anyway
        next = end;
      }
      line_.assign(text_, at_, end - at_);
      at_ = next;
      if (!line_.empty()) return;
    }
  }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }
  bool empty() const { return text_.find_first_not_of('\n') == std::string::npos; }
  static constexpr size_t kMaxLine = 16384;  // --max_sentence_length below

 private:
  std::string text_, line_;
  size_t at_ = 0;
};

}  // namespace

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::bytes() {
  Tokenizer t;
  t.token_bytes_.assign(256, 1);
  return t;
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  CM_CHECK(in.good(), std::string("check the tokenizer path, or ") + kTrainHint, "cannot open tokenizer '{}'",
           path);
  std::stringstream ss;
  ss << in.rdbuf();
  return from_serialized(ss.str(), "tokenizer '" + path + "'");
}

Tokenizer Tokenizer::from_serialized(const std::string& model_proto, const std::string& where) {
  Tokenizer t;
  t.sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = t.sp_->LoadFromSerializedProto(model_proto);
  CM_CHECK(status.ok() && t.sp_->GetPieceSize() > 0, std::string("the file is damaged or not a SentencePiece model; ") + kTrainHint,
           "{} is not a valid SentencePiece model ({} bytes): {}", where, model_proto.size(),
           status.ok() ? "no pieces" : status.ToString());
  t.proto_ = model_proto;
  t.vocab_size_ = t.sp_->GetPieceSize();
  for (int b = 0; b < 256; ++b) {
    t.byte_ids_.push_back(t.sp_->PieceToId(fmt::format("<0x{:02X}>", b)));
    CM_CHECK(t.sp_->IsByte(t.byte_ids_.back()), std::string("use a model with byte fallback: ") + kTrainHint,
             "{} has no byte pieces (<0x00>..<0xFF>), so it cannot encode every text", where);
  }
  t.newline_id_ = t.byte_ids_['\n'];
  t.index_pieces();
  return t;
}

void Tokenizer::index_pieces() {
  static const std::string kSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's space
  token_bytes_.assign(size_t(vocab_size_), 0);
  for (int id = 0; id < vocab_size_; ++id) {
    if (sp_->IsByte(id)) token_bytes_[size_t(id)] = 1;
    if (sp_->IsByte(id) || sp_->IsControl(id) || sp_->IsUnknown(id) || sp_->IsUnused(id)) continue;
    const std::string& piece = sp_->IdToPiece(id);
    int n = 0;
    for (size_t i = 0; i < piece.size(); ++n) i += piece.compare(i, kSpace.size(), kSpace) == 0 ? kSpace.size() : 1;
    token_bytes_[size_t(id)] = n;
  }
}

void Tokenizer::encode_into(std::string_view text, std::vector<int32_t>& out) const {
  if (!sp_) {
    for (unsigned char c : text) out.push_back(c);
    return;
  }
  std::vector<int> ids;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    const bool newline = end != std::string_view::npos;
    if (!newline) end = text.size();
    for (std::string_view line = text.substr(at, end - at); !line.empty();) {
      const size_t valid = utf8_prefix(line);  // SentencePiece reads only UTF-8
      if (valid == 0) {                        // a byte outside it: its own piece
        out.push_back(byte_ids_[static_cast<unsigned char>(line[0])]);
        line.remove_prefix(1);
        continue;
      }
      const auto status = sp_->Encode(line.substr(0, valid), &ids);
      CM_CHECK(status.ok(), "check the text", "SentencePiece cannot encode a line: {}", status.ToString());
      out.insert(out.end(), ids.begin(), ids.end());
      line.remove_prefix(valid);
    }
    if (newline) out.push_back(newline_id_);
    at = end + 1;
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  encode_into(text, out);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  for (int32_t id : ids)
    CM_CHECK(id >= 0 && id < vocab_size_, "decode ids of this tokenizer", "token id {} is outside its {} tokens",
             id, vocab_size_);
  if (!sp_) return std::string(ids.begin(), ids.end());
  std::string text;
  const auto status = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  CM_CHECK(status.ok(), "decode ids of this tokenizer", "SentencePiece cannot decode: {}", status.ToString());
  return text;
}

int Tokenizer::token_bytes(int32_t id) const {
  CM_CHECK(id >= 0 && id < vocab_size_, "count ids of this tokenizer", "token id {} is outside its {} tokens", id,
           vocab_size_);
  return token_bytes_[size_t(id)];
}

int64_t Tokenizer::count_bytes(const int32_t* ids, int64_t n) const {
  int64_t sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += token_bytes(ids[i]);
  return sum;
}

size_t utf8_prefix(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    // lead byte: length and payload (0xC0, 0xC1 and 0xF5.. only start overlong or too large forms)
    const size_t n = c >= 0xC2 && c <= 0xDF ? 2 : (c & 0xF0) == 0xE0 ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (n == 0 || i + n > text.size()) break;
    uint32_t cp = c & (0x7F >> n);
    size_t k = 1;
    for (; k < n && (static_cast<unsigned char>(text[i + k]) >> 6) == 0x2; ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
    if (k < n || (n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
      break;
    i += n;
  }
  return i;
}

std::string Tokenizer::describe() const {
  if (!sp_) return "bytes (256 tokens)";
  return fmt::format("sentencepiece ({} pieces)", vocab_size_);
}

Tokenizer train_tokenizer(const TokenizerTrainOptions& o, const std::string& out_path) {
  CM_CHECK(!o.data.empty(), "pass at least one text file (--data data/bible-kjv.txt)", "no data files given");
  CM_CHECK(o.model == "bpe" || o.model == "unigram", "use --model bpe or --model unigram", "unknown model type '{}'",
           o.model);
  CM_CHECK(o.vocab_size >= 300, "use --vocab 300 or more (256 byte pieces come first)",
           "vocab {} is too small for a byte-fallback model", o.vocab_size);
  CM_CHECK(o.val_fraction >= 0 && o.val_fraction < 1, "use a fraction in [0, 1)", "val_fraction {} is out of range",
           o.val_fraction);
  CM_CHECK(o.threads >= 0, "use --threads 0 (every CPU) or a positive count", "--threads {} is negative", o.threads);
  {  // the output is checked before the training it would throw away
    namespace fs = std::filesystem;
    std::error_code ec;
    CM_CHECK(!out_path.empty() && !fs::is_directory(out_path, ec), "name the model file to write, e.g. --out tok.model",
             "the tokenizer output '{}' {}", out_path, out_path.empty() ? "is empty" : "is a directory");
    const fs::path dir = fs::path(out_path).parent_path().empty() ? fs::path(".") : fs::path(out_path).parent_path();
    CM_CHECK(!fs::exists(dir, ec) || fs::is_directory(dir, ec), "write the model into a directory",
             "the tokenizer output '{}': '{}' is not a directory", out_path, dir.string());
    if (fs::is_directory(dir, ec)) {  // writable: a file made and removed there (root passes access(2) anywhere)
      const std::string probe = (dir / fmt::format(".{}.probe.{}", fs::path(out_path).filename().string(), ::getpid())).string();
      const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      CM_CHECK(fd >= 0, "write the model where files can be made (check the directory's permissions and space)",
               "the tokenizer output '{}': cannot make a file in '{}': {}", out_path, dir.string(), std::strerror(errno));
      ::close(fd);
      ::unlink(probe.c_str());
    }
  }
  LineIterator lines(o.data, o.val_fraction);
  CM_CHECK(!lines.empty(), "give files with text in them", "the data files hold no text");
  // SentencePiece trains on at most 128 threads
  const int threads = std::min(128, o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency())));
  // Exact round trips: no normalization or whitespace changes, no dummy
  // prefix, every byte a piece; no BOS/EOS (training windows cut anywhere).
  const std::string args = fmt::format(
      "--model_type={} --vocab_size={} --byte_fallback=true --normalization_rule_name=identity "
      "--remove_extra_whitespaces=false --add_dummy_prefix=false --character_coverage=1.0 "
      "--unk_id=0 --bos_id=-1 --eos_id=-1 --pad_id=-1 --num_threads={} --minloglevel=1 "
      "--max_sentence_length=16384 --train_extremely_large_corpus=false",
      o.model, o.vocab_size, threads);
  // SentencePiece logs its command line to std::cerr before it reads
  // --minloglevel: what it says goes into the error, if there is one.
  std::ostringstream log;
  std::string proto;
  const auto status = [&] {
    struct Restore {
      std::streambuf* buf;
      ~Restore() { std::cerr.rdbuf(buf); }
    } restore{std::cerr.rdbuf(log.rdbuf())};
    return sentencepiece::SentencePieceTrainer::Train(args, &lines, &proto);
  }();
  const bool too_small = status.ToString().find("smaller than required_chars") != std::string::npos;
  CM_CHECK(status.ok(),
           too_small ? "use a larger --vocab: the 256 byte pieces, every distinct character of the text and one "
                       "more must fit (the first number above is the vocab, the second what it needs)"
                     : "use a smaller --vocab (300 at least), or give more text (each piece must occur in it)",
           "SentencePiece could not train a {} vocabulary of {}: {}{}", o.model, o.vocab_size, status.ToString(),
           log.str().empty() ? "" : "\n" + log.str());
  Tokenizer t = Tokenizer::from_serialized(proto, "the trained model");
  write_file_atomic(out_path, proto);
  return t;
}

}  // namespace coremesh::train
