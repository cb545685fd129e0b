// `coremesh tokenizer train`: a SentencePiece subword model for `coremesh train --tokenizer`.
//
//   coremesh tokenizer train --vocab 4096 --model bpe --data data/bible-kjv.txt --out tok.model
//
// --val-fraction leaves each file's last share out, as `train.val_fraction`
// holds it out of training, so the validation text stays unseen.
#include <fmt/format.h>

#include <chrono>

#include "commands.hpp"
#include "coremesh/train/data.hpp"
#include "coremesh/train/tokenizer.hpp"

namespace coremesh::cli {

void register_tokenizer_command(CLI::App& app) {
  auto* tok = app.add_subcommand("tokenizer", "Subword tokenizers (SentencePiece) for training");
  tok->require_subcommand(1);
  struct Flags {
    train::TokenizerTrainOptions o;
    std::string out;
  };
  auto f = std::make_shared<Flags>();
  auto* cmd = tok->add_subcommand("train", "Train a BPE or unigram SentencePiece model on text files");
  cmd->add_option("--vocab", f->o.vocab_size, "pieces (the model's vocab_size); 256 of them are bytes")
      ->capture_default_str();
  cmd->add_option("--model", f->o.model, "bpe or unigram")->capture_default_str()->check(CLI::IsMember({"bpe", "unigram"}));
  cmd->add_option("--data", f->o.data, "text files")->required();
  cmd->add_option("--out", f->out, "the model file to write (e.g. tok.model)")->required();
  cmd->add_option("--val-fraction", f->o.val_fraction, "share of each file's end left out (the run's val_fraction)")
      ->capture_default_str();
  cmd->add_option("--threads", f->o.threads, "threads (0: every CPU)")->capture_default_str();
  cmd->callback([f] {
    const auto start = std::chrono::steady_clock::now();
    const train::Tokenizer t = train::train_tokenizer(f->o, f->out);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    train::TextDataset data(f->o.data, f->o.val_fraction, &t);
    fmt::print("tokenizer: {} of {} pieces trained in {:.1f} s, written to {}\n", f->o.model, t.vocab_size(), seconds, f->out);
    fmt::print("training text: {} bytes -> {} tokens ({:.2f} bytes per token)\n", data.split_bytes(train::Split::train),
               data.split_tokens(train::Split::train),
               double(data.split_bytes(train::Split::train)) / double(std::max<int64_t>(1, data.split_tokens(train::Split::train))));
  });
}

}  // namespace coremesh::cli
