// Text datasets for GPT-2 (next-token prediction) and BERT (masked language model) over a corpus
// of token ids.
//
// A TokenSource is the corpus: token ids in segments (one llm.c shard file each, or one split of a
// corpus tokenized in memory, or random tokens for benchmarks). Samples are windows of a segment
// and never cross into the next.
//
// LanguageModelDataset, sample k of a segment (windows of T inputs that do not overlap; each also
// reads the one token after it):
//   input  i32 (T,)  tokens [kT, kT + T)
//   target i64 (T,)  tokens [kT + 1, kT + T + 1): the next token at every position
// A segment of n tokens holds floor((n - 1) / T) samples.
//
// MaskedLanguageModelDataset, sample k of a segment (windows of T tokens [kT, kT + T), n / T of
// them), BERT's masking (Devlin et al. 2019, Sec. 3.1): each position is selected with
// probability 0.15; a selected position's input becomes the mask id with probability 0.8, a
// uniformly random token of the vocabulary with 0.1, and stays itself with 0.1:
//   input  i32 (3, T)  row 0 the ids so masked, row 1 token types (all 0: one segment), row 2
//                      the attention mask (all 1: no padding)
//   target i64 (T,)    the original id at selected positions, -100 (ignored by the loss) elsewhere
// The draws are Philox values keyed by (seed, global sample index, position): the same sample
// gets the same mask on every read, in any epoch, on any worker or rank (static masking, like
// BERT's create_pretraining_data.py). GPT-2's vocabulary has no [MASK]: the default mask id is
// 50257, one past it, so a model trained this way has a vocabulary of 50258 (num_classes()).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/bpe.h"
#include "io/dataset.h"

namespace strata::io {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual std::string name() const = 0;  // "tokens/train"
  virtual int64_t num_segments() const = 0;
  virtual int64_t segment_size(int64_t segment) const = 0;      // tokens
  virtual std::string segment_name(int64_t segment) const = 0;  // a file path, for errors
  // Copies tokens [offset, offset + count) of `segment` (checked to be inside it) to `out`.
  // Thread-safe.
  virtual void read(int64_t segment, int64_t offset, int64_t count, int32_t* out) const = 0;
  int64_t total_tokens() const;
};

// The llm.c shards at `paths`, one segment each, mapped at construction (errors name the file).
std::shared_ptr<const TokenSource> open_token_shards(const std::string& name,
                                                     const std::vector<std::string>& paths);
// The train_*.bin (split "train") or val_*.bin (split "val" or "test") shards of `dir`; none is
// an error naming the directory, the file names looked for and `strata prepare-text`.
std::shared_ptr<const TokenSource> open_token_shard_dir(const std::string& name,
                                                        const std::string& dir,
                                                        const std::string& split);
// Token ids held in memory, one segment per vector.
std::shared_ptr<const TokenSource> make_memory_token_source(
    const std::string& name, std::vector<std::vector<int32_t>> segments);
// `num_tokens` ids uniform in [0, vocab_size), a pure function of (seed, name, position): one
// segment, computed on read (nothing is stored).
std::shared_ptr<const TokenSource> make_synthetic_token_source(const std::string& name,
                                                               int64_t num_tokens,
                                                               int64_t vocab_size, uint64_t seed);

enum class TextTask { kLanguageModel, kMaskedLanguageModel };
TextTask parse_text_task(const std::string& text);  // "lm" or "mlm"
const char* text_task_name(TextTask task);

class LanguageModelDataset final : public Dataset {
 public:
  // Every token read is checked to be < vocab_size (an error names the file and position).
  LanguageModelDataset(std::shared_ptr<const TokenSource> source, int64_t seq_len,
                       int64_t vocab_size = kGpt2VocabSize);

  std::string name() const override { return source_->name(); }
  int64_t size() const override { return window_start_.back(); }
  SampleSpec input_spec() const override { return {{seq_len_}, DType::kI32}; }
  SampleSpec target_spec() const override { return {{seq_len_}, DType::kI64}; }
  int64_t num_classes() const override { return vocab_size_; }
  void get(int64_t index, void* input, void* target) const override;

  int64_t seq_len() const { return seq_len_; }
  const TokenSource& source() const { return *source_; }

 private:
  std::shared_ptr<const TokenSource> source_;
  int64_t seq_len_;
  int64_t vocab_size_;
  std::vector<int64_t> window_start_;  // first sample of each segment, then the total
};

struct MlmOptions {
  int64_t vocab_size = kGpt2VocabSize;  // tokens are < this; random replacements drawn from it
  int64_t mask_id = kGpt2VocabSize;     // the [MASK] input id (BERT's own vocabulary: 103)
  double select_prob = 0.15;            // positions predicted
  double mask_prob = 0.8;               // of those: input replaced by mask_id
  double random_prob = 0.1;             // of those: input replaced by a random token
  uint64_t seed = 0;
};

class MaskedLanguageModelDataset final : public Dataset {
 public:
  MaskedLanguageModelDataset(std::shared_ptr<const TokenSource> source, int64_t seq_len,
                             const MlmOptions& options);

  std::string name() const override { return source_->name() + "/mlm"; }
  int64_t size() const override { return window_start_.back(); }
  SampleSpec input_spec() const override { return {{3, seq_len_}, DType::kI32}; }
  SampleSpec target_spec() const override { return {{seq_len_}, DType::kI64}; }
  // The model's vocabulary: vocab_size, or mask_id + 1 when the mask id is past it.
  int64_t num_classes() const override;
  void get(int64_t index, void* input, void* target) const override;

  const MlmOptions& options() const { return options_; }

 private:
  std::shared_ptr<const TokenSource> source_;
  int64_t seq_len_;
  MlmOptions options_;
  std::vector<int64_t> window_start_;
};

// The dataset of `task` over `source`: LanguageModelDataset(source, seq_len, vocab_size) or
// MaskedLanguageModelDataset(source, seq_len, {vocab_size, mask id past it, seed}).
std::shared_ptr<const Dataset> make_text_dataset(std::shared_ptr<const TokenSource> source,
                                                 TextTask task, int64_t seq_len, int64_t vocab_size,
                                                 uint64_t seed);

// A corpus of documents tokenized and split for training. Each document is preceded by
// <|endoftext|> (as llm.c's data scripts do) and goes whole to one split: document d (from 0) of
// D is a validation document when floor((d + 1) f) > floor(d f), which spreads round(D f) of them
// evenly over the corpus. When that selects none although f > 0 (fewer than 1 / f documents),
// the last ceil(N f) tokens of the N are the validation split instead.
struct TokenizedCorpus {
  std::vector<int32_t> train;
  std::vector<int32_t> val;
  int64_t train_documents = 0;
  int64_t val_documents = 0;
  bool split_by_tokens = false;  // the fallback above was taken
};
bool is_validation_document(int64_t index, double val_fraction);
TokenizedCorpus tokenize_corpus(const std::vector<std::string>& documents,
                                const BpeTokenizer& tokenizer, double val_fraction);

}  // namespace strata::io
