// Token sources and the language-model datasets over them.
//
// A sample index is found by binary search in the prefix sums of the segments' window counts, so
// get() is O(log segments) plus the copy of T (+1) tokens; every source is immutable after
// construction, which makes get() thread-safe for the loader's workers.
//
// MLM masking draws, for position t of global sample i, one Philox4x32 block at key
// philox_key(seed, stable_hash("mlm")), counter {t, 0, i low, i high}: lane 0 selects (u < 0.15),
// lane 1 picks the action (u < 0.8 mask, < 0.9 random, else keep), lanes 2-3 (64 bits) give the
// random token by reduction modulo V, whose bias (V / 2^64) is far below anything measurable. The
// draws depend on nothing else, so the masks are reproducible across workers, ranks and epochs.
// Synthetic token p is lanes 0-1 of the block at key (seed, stable_hash(source name)), counter
// {p low, p high, 0, 0}, modulo V.
#include "io/text_datasets.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "engine/check.h"
#include "engine/philox.h"
#include "io/token_shard.h"

namespace strata::io {
namespace {

void check_range(const TokenSource& s, int64_t segment, int64_t offset, int64_t count) {
  STRATA_CHECK(segment >= 0 && segment < s.num_segments())
      << s.name() << ": segment " << segment << " out of range (" << s.num_segments() << ")";
  STRATA_CHECK(offset >= 0 && count >= 0 && offset + count <= s.segment_size(segment))
      << s.name() << ": tokens [" << offset << ", " << offset + count << ") are outside "
      << s.segment_name(segment) << ", which has " << s.segment_size(segment) << " tokens";
}

class ShardSource final : public TokenSource {
 public:
  ShardSource(std::string name, const std::vector<std::string>& paths) : name_(std::move(name)) {
    STRATA_CHECK(!paths.empty()) << name_ << ": no token shards given";
    for (const std::string& p : paths) shards_.emplace_back(p);
  }
  std::string name() const override { return name_; }
  int64_t num_segments() const override { return static_cast<int64_t>(shards_.size()); }
  int64_t segment_size(int64_t s) const override { return shards_[s].size(); }
  std::string segment_name(int64_t s) const override { return shards_[s].path(); }
  void read(int64_t s, int64_t offset, int64_t count, int32_t* out) const override {
    check_range(*this, s, offset, count);
    const uint16_t* tokens = shards_[s].tokens() + offset;
    for (int64_t i = 0; i < count; ++i) out[i] = tokens[i];
  }

 private:
  std::string name_;
  std::vector<TokenShard> shards_;
};

class MemorySource final : public TokenSource {
 public:
  MemorySource(std::string name, std::vector<std::vector<int32_t>> segments)
      : name_(std::move(name)), segments_(std::move(segments)) {}
  std::string name() const override { return name_; }
  int64_t num_segments() const override { return static_cast<int64_t>(segments_.size()); }
  int64_t segment_size(int64_t s) const override {
    return static_cast<int64_t>(segments_[s].size());
  }
  std::string segment_name(int64_t s) const override {
    return name_ + " (segment " + std::to_string(s) + " in memory)";
  }
  void read(int64_t s, int64_t offset, int64_t count, int32_t* out) const override {
    check_range(*this, s, offset, count);
    std::copy_n(segments_[s].data() + offset, count, out);
  }

 private:
  std::string name_;
  std::vector<std::vector<int32_t>> segments_;
};

class SyntheticSource final : public TokenSource {
 public:
  SyntheticSource(std::string name, int64_t num_tokens, int64_t vocab_size, uint64_t seed)
      : name_(std::move(name)),
        num_tokens_(num_tokens),
        vocab_size_(vocab_size),
        key_(philox_key(seed, stable_hash(name_))) {
    STRATA_CHECK(num_tokens >= 0) << name_ << ": token count must be >= 0, got " << num_tokens;
    STRATA_CHECK(vocab_size > 0) << name_ << ": vocabulary size must be > 0, got " << vocab_size;
  }
  std::string name() const override { return name_; }
  int64_t num_segments() const override { return 1; }
  int64_t segment_size(int64_t) const override { return num_tokens_; }
  std::string segment_name(int64_t) const override { return name_ + " (synthetic)"; }
  void read(int64_t s, int64_t offset, int64_t count, int32_t* out) const override {
    check_range(*this, s, offset, count);
    for (int64_t i = 0; i < count; ++i) {
      const auto pos = static_cast<uint64_t>(offset + i);
      const PhiloxCounter r = philox4x32_10(
          PhiloxCounter{{static_cast<uint32_t>(pos), static_cast<uint32_t>(pos >> 32), 0, 0}},
          key_);
      const uint64_t bits = (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
      out[i] = static_cast<int32_t>(bits % static_cast<uint64_t>(vocab_size_));
    }
  }

 private:
  std::string name_;
  int64_t num_tokens_;
  int64_t vocab_size_;
  PhiloxKey key_;
};

// Prefix sums of the windows per segment: `need` tokens per window, `stride` between windows.
std::vector<int64_t> window_starts(const TokenSource& source, int64_t stride, int64_t need) {
  std::vector<int64_t> starts{0};
  for (int64_t s = 0; s < source.num_segments(); ++s) {
    const int64_t n = source.segment_size(s);
    const int64_t windows = n >= need ? (n - need) / stride + 1 : 0;
    starts.push_back(starts.back() + windows);
  }
  return starts;
}

// (segment, window within it) of sample `index`.
std::pair<int64_t, int64_t> locate(const std::vector<int64_t>& starts, int64_t index) {
  const auto it = std::upper_bound(starts.begin(), starts.end(), index);
  const int64_t segment = (it - starts.begin()) - 1;
  return {segment, index - starts[segment]};
}

void check_tokens(const TokenSource& source, int64_t segment, int64_t offset, const int32_t* ids,
                  int64_t count, int64_t vocab_size) {
  for (int64_t i = 0; i < count; ++i) {
    if (ids[i] >= 0 && ids[i] < vocab_size) continue;
    STRATA_THROW() << source.name() << ": token " << offset + i << " of "
                   << source.segment_name(segment) << " is " << ids[i]
                   << ", outside the vocabulary [0, " << vocab_size
                   << ") (shards of another tokenizer?)";
  }
}

void check_seq_len(const std::string& name, int64_t seq_len) {
  STRATA_CHECK(seq_len > 0) << name << ": sequence length (--seq-len) must be > 0, got " << seq_len;
}

}  // namespace

int64_t TokenSource::total_tokens() const {
  int64_t n = 0;
  for (int64_t s = 0; s < num_segments(); ++s) n += segment_size(s);
  return n;
}

std::shared_ptr<const TokenSource> open_token_shards(const std::string& name,
                                                     const std::vector<std::string>& paths) {
  return std::make_shared<ShardSource>(name, paths);
}

std::shared_ptr<const TokenSource> open_token_shard_dir(const std::string& name,
                                                        const std::string& dir,
                                                        const std::string& split) {
  STRATA_CHECK(split == "train" || split == "val" || split == "test")
      << name << ": unknown split '" << split << "' (valid: train, val; test means val)";
  const std::string prefix = split == "train" ? "train" : "val";
  std::vector<std::string> paths;
  try {
    paths = find_token_shards(dir, prefix);
  } catch (const Error& e) {
    STRATA_THROW() << name << ": " << e.message()
                   << ". Pass --data-dir with a directory of llm.c token shards, e.g. one made by "
                   << "`strata prepare-text --output-dir DIR`";
  }
  STRATA_CHECK(!paths.empty()) << name << ": no " << prefix << " shards in '" << dir
                               << "' (looked for *.bin files named " << prefix << "_*.bin or *_"
                               << prefix << "_*.bin). Make them with `strata prepare-text "
                               << "--output-dir " << dir << "`"
                               << (prefix == "val" ? " and a --val-fraction above 0" : "");
  return open_token_shards(name, paths);
}

std::shared_ptr<const TokenSource> make_memory_token_source(
    const std::string& name, std::vector<std::vector<int32_t>> segments) {
  return std::make_shared<MemorySource>(name, std::move(segments));
}

std::shared_ptr<const TokenSource> make_synthetic_token_source(const std::string& name,
                                                               int64_t num_tokens,
                                                               int64_t vocab_size, uint64_t seed) {
  return std::make_shared<SyntheticSource>(name, num_tokens, vocab_size, seed);
}

TextTask parse_text_task(const std::string& text) {
  if (text == "lm") return TextTask::kLanguageModel;
  if (text == "mlm") return TextTask::kMaskedLanguageModel;
  STRATA_THROW() << "unknown text task '" << text
                 << "' (valid: lm (next token, GPT-2), mlm (masked tokens, BERT))";
}

const char* text_task_name(TextTask task) {
  return task == TextTask::kLanguageModel ? "lm" : "mlm";
}

LanguageModelDataset::LanguageModelDataset(std::shared_ptr<const TokenSource> source,
                                           int64_t seq_len, int64_t vocab_size)
    : source_(std::move(source)), seq_len_(seq_len), vocab_size_(vocab_size) {
  STRATA_CHECK(source_ != nullptr) << "LanguageModelDataset: no token source";
  check_seq_len(source_->name(), seq_len);
  STRATA_CHECK(vocab_size > 0) << source_->name() << ": vocabulary size must be > 0";
  window_start_ = window_starts(*source_, seq_len, seq_len + 1);
}

void LanguageModelDataset::get(int64_t index, void* input, void* target) const {
  STRATA_CHECK(index >= 0 && index < size())
      << name() << ": sample " << index << " out of range (size " << size() << ")";
  const auto [segment, window] = locate(window_start_, index);
  const int64_t offset = window * seq_len_;
  auto* in = static_cast<int32_t*>(input);
  auto* out = static_cast<int64_t*>(target);
  // Tokens [offset, offset + T] with the last one kept aside for the final target.
  source_->read(segment, offset, seq_len_, in);
  int32_t last = 0;
  source_->read(segment, offset + seq_len_, 1, &last);
  check_tokens(*source_, segment, offset, in, seq_len_, vocab_size_);
  check_tokens(*source_, segment, offset + seq_len_, &last, 1, vocab_size_);
  for (int64_t t = 0; t + 1 < seq_len_; ++t) out[t] = in[t + 1];
  out[seq_len_ - 1] = last;
}

MaskedLanguageModelDataset::MaskedLanguageModelDataset(std::shared_ptr<const TokenSource> source,
                                                       int64_t seq_len, const MlmOptions& options)
    : source_(std::move(source)), seq_len_(seq_len), options_(options) {
  STRATA_CHECK(source_ != nullptr) << "MaskedLanguageModelDataset: no token source";
  const std::string& n = source_->name();
  check_seq_len(n, seq_len);
  STRATA_CHECK(options.vocab_size > 0) << n << ": vocabulary size must be > 0";
  STRATA_CHECK(options.mask_id >= 0) << n << ": mask id must be >= 0, got " << options.mask_id;
  const double probs[] = {options.select_prob, options.mask_prob, options.random_prob};
  for (double p : probs) {
    STRATA_CHECK(p >= 0.0 && p <= 1.0)
        << n << ": masking probabilities must be in [0, 1], got " << p;
  }
  STRATA_CHECK(options.mask_prob + options.random_prob <= 1.0)
      << n << ": mask and random-token probabilities add up to more than 1";
  window_start_ = window_starts(*source_, seq_len, seq_len);
}

int64_t MaskedLanguageModelDataset::num_classes() const {
  return std::max(options_.vocab_size, options_.mask_id + 1);
}

void MaskedLanguageModelDataset::get(int64_t index, void* input, void* target) const {
  STRATA_CHECK(index >= 0 && index < size())
      << name() << ": sample " << index << " out of range (size " << size() << ")";
  const auto [segment, window] = locate(window_start_, index);
  const int64_t offset = window * seq_len_;
  const int64_t T = seq_len_;
  auto* ids = static_cast<int32_t*>(input);   // (3, T)
  auto* out = static_cast<int64_t*>(target);  // (T,)
  source_->read(segment, offset, T, ids);
  check_tokens(*source_, segment, offset, ids, T, options_.vocab_size);
  std::fill(ids + T, ids + 2 * T, 0);      // token types
  std::fill(ids + 2 * T, ids + 3 * T, 1);  // attention mask

  const PhiloxKey key = philox_key(options_.seed, stable_hash("mlm"));
  const auto sample = static_cast<uint64_t>(index);
  const auto select = static_cast<float>(options_.select_prob);
  const auto mask = static_cast<float>(options_.mask_prob);
  const auto random = static_cast<float>(options_.mask_prob + options_.random_prob);
  const auto vocab = static_cast<uint64_t>(options_.vocab_size);
  for (int64_t t = 0; t < T; ++t) {
    const PhiloxCounter r =
        philox4x32_10(PhiloxCounter{{static_cast<uint32_t>(t), 0, static_cast<uint32_t>(sample),
                                     static_cast<uint32_t>(sample >> 32)}},
                      key);
    if (philox_uniform(r.v[0]) >= select) {
      out[t] = -100;
      continue;
    }
    out[t] = ids[t];
    const float action = philox_uniform(r.v[1]);
    if (action < mask) {
      ids[t] = static_cast<int32_t>(options_.mask_id);
    } else if (action < random) {
      const uint64_t bits = (static_cast<uint64_t>(r.v[2]) << 32) | r.v[3];
      ids[t] = static_cast<int32_t>(bits % vocab);
    }
  }
}

std::shared_ptr<const Dataset> make_text_dataset(std::shared_ptr<const TokenSource> source,
                                                 TextTask task, int64_t seq_len, int64_t vocab_size,
                                                 uint64_t seed) {
  if (task == TextTask::kLanguageModel) {
    return std::make_shared<LanguageModelDataset>(std::move(source), seq_len, vocab_size);
  }
  MlmOptions options;
  options.vocab_size = vocab_size;
  options.mask_id = vocab_size;
  options.seed = seed;
  return std::make_shared<MaskedLanguageModelDataset>(std::move(source), seq_len, options);
}

bool is_validation_document(int64_t index, double val_fraction) {
  // A tiny slack so that f = 0.1 puts document 9 (10 x 0.1 = 1 up to rounding) in validation.
  constexpr double kSlack = 1e-9;
  const double before = std::floor(static_cast<double>(index) * val_fraction + kSlack);
  const double after = std::floor(static_cast<double>(index + 1) * val_fraction + kSlack);
  return after > before;
}

TokenizedCorpus tokenize_corpus(const std::vector<std::string>& documents,
                                const BpeTokenizer& tokenizer, double val_fraction) {
  STRATA_CHECK(val_fraction >= 0.0 && val_fraction < 1.0)
      << "validation fraction (--val-fraction) must be in [0, 1), got " << val_fraction;
  const int32_t eot = tokenizer.end_of_text();
  STRATA_CHECK(eot >= 0) << "tokenize_corpus: the vocabulary of " << tokenizer.encoder_path()
                         << " has no <|endoftext|> token to separate documents with";
  TokenizedCorpus corpus;
  for (size_t d = 0; d < documents.size(); ++d) {
    const bool val = is_validation_document(static_cast<int64_t>(d), val_fraction);
    std::vector<int32_t>& out = val ? corpus.val : corpus.train;
    out.push_back(eot);
    tokenizer.encode_append(documents[d], &out);
    ++(val ? corpus.val_documents : corpus.train_documents);
  }
  if (corpus.val_documents == 0 && val_fraction > 0.0 && !corpus.train.empty()) {
    const auto n = static_cast<int64_t>(corpus.train.size());
    const auto take = static_cast<int64_t>(std::ceil(static_cast<double>(n) * val_fraction));
    corpus.val.assign(corpus.train.end() - take, corpus.train.end());
    corpus.train.resize(static_cast<size_t>(n - take));
    corpus.split_by_tokens = true;
  }
  return corpus;
}

}  // namespace strata::io
