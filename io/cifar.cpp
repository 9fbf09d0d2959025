// CIFAR-10 binary batches.
//
// The files are small (150 MB for the training split), so they are read whole at construction
// into one buffer of records laid out as on disk, checked once (length first, from stat, so a
// wrong file is rejected before it is read; then every label), and never written again: get()
// touches only immutable state and any number of loader threads may call it at once.
//
// Normalization is a table of the 256 possible values per channel, (v / 255 - mean) / stddev in
// f32, so a sample costs 3072 look-ups. Augmentation draws three values from a Philox stream keyed
// by (seed, stable_hash("cifar10/augment") + epoch) at subsequence `index`: dy and dx uniform in
// [0, 8] (next_below, no modulo bias) and the flip bit. The crop reads the padded image without
// materializing it: rows and columns that fall in the padding take the value of a black pixel.
#include "io/cifar.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <utility>

#include "engine/check.h"
#include "engine/philox.h"

namespace strata::io {
namespace {

constexpr int64_t kPlane = kCifarSide * kCifarSide;

bool is_regular_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string join(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

// The length of `path` in bytes; throws naming the file when it cannot be examined.
int64_t file_length(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    STRATA_THROW() << "cifar10: cannot open '" << path << "': " << std::strerror(err);
  }
  return static_cast<int64_t>(st.st_size);
}

// Reads exactly `length` bytes of `path` into `out`.
void read_exactly(const std::string& path, int64_t length, uint8_t* out) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    STRATA_THROW() << "cifar10: cannot open '" << path << "': " << std::strerror(err);
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> closer(f, &std::fclose);
  const size_t got = std::fread(out, 1, static_cast<size_t>(length), f);
  if (got != static_cast<size_t>(length)) {
    const int err = std::ferror(f) ? errno : 0;
    STRATA_THROW() << "cifar10: error reading '" << path << "' at byte " << got << " of " << length
                   << ": " << (err != 0 ? std::strerror(err) : "the file became shorter");
  }
}

// Records in a file of `length` bytes; throws naming the file when it is not whole records.
int64_t whole_records(const std::string& path, int64_t length) {
  const int64_t records = length / kCifarRecordBytes;
  const int64_t partial = length % kCifarRecordBytes;
  if (records > 0 && partial == 0) return records;
  std::ostringstream why;
  why << "cifar10: " << path << ": expected a whole number of " << kCifarRecordBytes
      << "-byte records (1 label byte + " << kCifarPixelBytes << " pixel bytes; "
      << kCifarPublishedRecords * kCifarRecordBytes << " bytes for the published "
      << kCifarPublishedRecords << " records), found " << length << " bytes";
  if (length == 0) {
    why << " (an empty file)";
  } else {
    why << ": " << records << " records and " << partial << " bytes of a partial record at byte "
        << "offset " << records * kCifarRecordBytes;
  }
  why << ". The file is truncated or not a CIFAR-10 binary batch: re-download "
      << "cifar-10-binary.tar.gz and extract it again";
  STRATA_THROW() << why.str();
}

std::string trim(const std::string& s) {
  const char* kSpace = " \t\r\n";
  const size_t first = s.find_first_not_of(kSpace);
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(kSpace) - first + 1);
}

}  // namespace

const std::vector<std::string>& cifar10_default_class_names() {
  static const std::vector<std::string> kNames{"airplane", "automobile", "bird",  "cat",  "deer",
                                               "dog",      "frog",       "horse", "ship", "truck"};
  return kNames;
}

std::vector<std::string> read_cifar10_class_names(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    const int err = errno;
    STRATA_THROW() << "cifar10: cannot open '" << path << "': " << std::strerror(err);
  }
  std::vector<std::string> names;
  std::string line;
  while (std::getline(in, line)) {
    line = trim(line);
    if (!line.empty()) names.push_back(line);
  }
  if (static_cast<int64_t>(names.size()) != kCifar10Classes) {
    STRATA_THROW() << "cifar10: " << path << ": expected " << kCifar10Classes
                   << " class names, one a line, found " << names.size()
                   << " non-blank lines; restore the file from cifar-10-binary.tar.gz or remove it "
                   << "(the default names are the published ones)";
  }
  return names;
}

Cifar10Dataset::Cifar10Dataset(std::string name, const std::vector<std::string>& files,
                               std::vector<std::string> class_names, CifarOptions options)
    : name_(std::move(name)), options_(options), class_names_(std::move(class_names)) {
  STRATA_CHECK(!files.empty()) << name_ << ": no files";
  STRATA_CHECK_EQ(static_cast<int64_t>(class_names_.size()), kCifar10Classes)
      << name_ << ": expected " << kCifar10Classes << " class names";

  // Lengths first: every file whole records, and the same count in each.
  std::vector<int64_t> lengths;
  std::vector<int64_t> records;
  for (const std::string& path : files) {
    lengths.push_back(file_length(path));
    records.push_back(whole_records(path, lengths.back()));
  }
  for (size_t i = 1; i < files.size(); ++i) {
    if (records[i] == records[0]) continue;
    std::ostringstream why;
    why << name_ << ": the batch files differ in length: expected the same number of records in "
        << "each (" << kCifarPublishedRecords << ", " << kCifarPublishedRecords * kCifarRecordBytes
        << " bytes, as published), found";
    for (size_t j = 0; j < files.size(); ++j) {
      why << (j ? "," : "") << " " << files[j] << " " << lengths[j] << " bytes (" << records[j]
          << " records)";
    }
    why << ". A file is truncated or from another dataset: re-download cifar-10-binary.tar.gz";
    STRATA_THROW() << why.str();
  }

  count_ = records[0] * static_cast<int64_t>(files.size());
  records_.resize(static_cast<size_t>(count_ * kCifarRecordBytes));
  int64_t first = 0;  // record index of the file's first record
  for (size_t i = 0; i < files.size(); ++i) {
    uint8_t* dst = records_.data() + first * kCifarRecordBytes;
    read_exactly(files[i], lengths[i], dst);
    for (int64_t r = 0; r < records[i]; ++r) {
      const uint8_t label = dst[r * kCifarRecordBytes];
      if (label >= kCifar10Classes) {
        STRATA_THROW() << "cifar10: " << files[i] << ": record " << r << " (byte offset "
                       << r * kCifarRecordBytes << "): label " << static_cast<int>(label)
                       << ", expected a class in 0.." << kCifar10Classes - 1
                       << " (not a CIFAR-10 file? CIFAR-100 records have 2 label bytes)";
      }
    }
    first += records[i];
  }
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      lut_[c][v] = (static_cast<float>(v) / 255.0f - kCifar10Mean[c]) / kCifar10Std[c];
    }
  }
}

void Cifar10Dataset::check_index(int64_t index) const {
  STRATA_CHECK(index >= 0 && index < count_)
      << name_ << ": sample " << index << " out of range (size " << count_ << ")";
}

int64_t Cifar10Dataset::label(int64_t index) const {
  check_index(index);
  return records_[static_cast<size_t>(index * kCifarRecordBytes)];
}

const uint8_t* Cifar10Dataset::pixels(int64_t index) const {
  check_index(index);
  return records_.data() + index * kCifarRecordBytes + 1;
}

CifarAugmentation Cifar10Dataset::augmentation(int64_t epoch, int64_t index) const {
  CifarAugmentation a;
  if (!options_.augment) return a;
  PhiloxStream rng(options_.seed, stable_hash("cifar10/augment") + static_cast<uint64_t>(epoch),
                   static_cast<uint64_t>(index));
  a.dy = static_cast<int>(rng.next_below(2 * kCifarPadding + 1));
  a.dx = static_cast<int>(rng.next_below(2 * kCifarPadding + 1));
  a.flip = rng.next_below(2) == 1;
  return a;
}

void Cifar10Dataset::get(int64_t index, void* input, void* target) const {
  get_in_epoch(0, index, input, target);
}

void Cifar10Dataset::get_in_epoch(int64_t epoch, int64_t index, void* input, void* target) const {
  const uint8_t* src = pixels(index);  // (3, 32, 32)
  float* dst = static_cast<float*>(input);
  *static_cast<int64_t*>(target) = label(index);
  if (!options_.augment) {
    for (int64_t c = 0; c < 3; ++c) {
      const float* lut = lut_[c];
      for (int64_t i = 0; i < kPlane; ++i) dst[c * kPlane + i] = lut[src[c * kPlane + i]];
    }
    return;
  }
  const CifarAugmentation a = augmentation(epoch, index);
  for (int64_t c = 0; c < 3; ++c) {
    const float* lut = lut_[c];
    const float black = lut[0];
    for (int64_t y = 0; y < kCifarSide; ++y) {
      float* row = dst + c * kPlane + y * kCifarSide;
      const int64_t sy = y + a.dy - kCifarPadding;
      if (sy < 0 || sy >= kCifarSide) {
        for (int64_t x = 0; x < kCifarSide; ++x) row[x] = black;
        continue;
      }
      const uint8_t* src_row = src + c * kPlane + sy * kCifarSide;
      for (int64_t x = 0; x < kCifarSide; ++x) {
        const int64_t sx = (a.flip ? kCifarSide - 1 - x : x) + a.dx - kCifarPadding;
        row[x] = sx >= 0 && sx < kCifarSide ? lut[src_row[sx]] : black;
      }
    }
  }
}

std::shared_ptr<const Cifar10Dataset> open_cifar10(const std::string& dir, Split split,
                                                   const CifarOptions& options) {
  const std::string name = std::string("cifar10/") + split_name(split);
  // The directory of the .bin files: `dir`, or the archive's folder inside it.
  std::string data_dir = dir;
  const std::string nested = join(dir, "cifar-10-batches-bin");
  if (!is_regular_file(join(dir, "data_batch_1.bin")) &&
      !is_regular_file(join(dir, "test_batch.bin")) && is_directory(nested)) {
    data_dir = nested;
  }
  std::vector<std::string> stems;
  if (split == Split::kTrain) {
    for (int i = 1; i <= 5; ++i) stems.push_back("data_batch_" + std::to_string(i) + ".bin");
  } else {
    stems.push_back("test_batch.bin");
  }
  std::vector<std::string> files;
  std::string missing;
  for (const std::string& stem : stems) {
    files.push_back(join(data_dir, stem));
    if (!is_regular_file(files.back())) missing += (missing.empty() ? "" : ", ") + stem;
  }
  if (!missing.empty()) {
    std::ostringstream why;
    why << name << ": dataset not found: ";
    if (!is_directory(dir)) {
      why << "directory '" << dir << "' does not exist";
    } else {
      why << "'" << data_dir << "' has no " << missing;
    }
    why << " (expected data_batch_1.bin .. data_batch_5.bin for train and test_batch.bin for "
        << "test, the binary version of CIFAR-10, in '" << dir << "' or '" << nested << "'). ";
    if (is_regular_file(join(data_dir, "data_batch_1")) ||
        is_regular_file(join(join(dir, "cifar-10-batches-py"), "data_batch_1"))) {
      why << "Found data_batch_1 without .bin: that is the Python (pickle) version, which Strata "
          << "does not read. ";
    }
    why << "No Debian package ships CIFAR-10: download cifar-10-binary.tar.gz from "
        << "www.cs.toronto.edu/~kriz/cifar.html, extract it and pass --data-dir with the directory";
    STRATA_THROW() << why.str();
  }
  const std::string meta = join(data_dir, "batches.meta.txt");
  std::vector<std::string> classes =
      is_regular_file(meta) ? read_cifar10_class_names(meta) : cifar10_default_class_names();
  return std::make_shared<Cifar10Dataset>(name, files, std::move(classes), options);
}

}  // namespace strata::io
