// Tokenizers: text <-> token ids, in two kinds.
//
//   bytes          every byte is a token (ids 0-255); what a run without a
//                  tokenizer file uses
//   sentencepiece  a SentencePiece model (BPE or unigram; libsentencepiece)
//                  loaded from a `.model` file that `coremesh tokenizer train`
//                  writes
//
// Text is encoded line by line (SentencePiece's sentences are lines; a long
// corpus never goes to it as one string) and each newline becomes its byte
// token. train_tokenizer() makes models whose decode(encode(text)) is UTF-8
// text byte for byte: no normalization, no dummy prefix, byte fallback for
// every character outside the pieces; the one exception is U+2581 (the
// piece's space mark) in the text, which SentencePiece reads as a space. A byte that is not part of well-formed
// UTF-8 becomes its own byte piece (SentencePiece would read it as U+FFFD:
// three byte pieces, two such bytes alike), which decode() shows as U+FFFD.
// token_bytes() counts the bytes a token stands for, so a loss per token
// converts to bits per byte.
//
// A checkpoint carries its run's tokenizer as serialized() (the model proto);
// from_serialized() restores it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace coremesh::train {

class Tokenizer {
 public:
  static Tokenizer bytes();
  // Throws InvalidArgument naming the file when it is missing or not a
  // SentencePiece model.
  static Tokenizer from_file(const std::string& path);
  // `where` names the source in messages (a checkpoint's path).
  static Tokenizer from_serialized(const std::string& model_proto, const std::string& where);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  bool byte_level() const { return sp_ == nullptr; }
  int vocab_size() const { return vocab_size_; }
  std::vector<int32_t> encode(std::string_view text) const;
  // Appends text's tokens to `out` (what encode() returns).
  void encode_into(std::string_view text, std::vector<int32_t>& out) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  // Bytes of the text token `id` stands for (0 for control pieces).
  int token_bytes(int32_t id) const;
  int64_t count_bytes(const int32_t* ids, int64_t n) const;
  // The model proto ("" for bytes).
  const std::string& serialized() const { return proto_; }
  // "bytes (256 tokens)", "sentencepiece (4096 pieces)".
  std::string describe() const;

 private:
  Tokenizer() = default;
  void index_pieces();

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string proto_;
  int vocab_size_ = 256;
  int newline_id_ = '\n';
  std::vector<int> token_bytes_;
  std::vector<int32_t> byte_ids_;  // the piece of each byte value (SentencePiece)
};

// Bytes of the longest well-formed UTF-8 prefix of `text` (RFC 3629: no
// overlong forms, surrogates or code points past U+10FFFF).
size_t utf8_prefix(std::string_view text);

struct TokenizerTrainOptions {
  std::vector<std::string> data;  // text files
  int vocab_size = 4096;
  std::string model = "bpe";      // bpe | unigram
  double val_fraction = 0.0;      // leave each file's last share out (a training run's held-out text)
  int threads = 0;                // 0: every CPU
};
// Trains a SentencePiece model on the files' lines and writes it to
// `out_path` (atomically). Returns the tokenizer.
Tokenizer train_tokenizer(const TokenizerTrainOptions& options, const std::string& out_path);

}  // namespace coremesh::train
