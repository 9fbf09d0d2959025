// Checkpoint files: raw per-layer tensor files, the framed manifest, and the write-to-temporary,
// fsync, rename protocol (graph/checkpoint.h).
//
// Durability follows the usual POSIX recipe: a file's data reaches the disk with fsync(fd), and
// its name with an fsync of the directory holding it; rename() within one file system is atomic.
// So every file is fsynced before the directory that names it, and the directory before the
// rename that publishes it.
#include "graph/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>

#include "engine/allocator.h"
#include "engine/crc32c.h"
#include "engine/log.h"
#include "engine/philox.h"

namespace strata::graph {
namespace fs = std::filesystem;
namespace {

constexpr char kManifestMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'M', 'F'};
constexpr char kTensorMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'T', 'N'};
constexpr size_t kManifestHeader = 24;  // magic, version, crc32c, payload bytes
constexpr uint64_t kHeaderBytes = 64;   // of a tensor file
constexpr uint64_t kAlign = 64;
constexpr const char* kManifestFile = "manifest.pb";

[[noreturn]] void fail(const std::string& message) { throw CheckpointError(message); }

std::string errno_text() { return std::strerror(errno); }

// An open file descriptor, closed on destruction.
class Fd {
 public:
  Fd(const std::string& path, int flags, mode_t mode = 0644) : path_(path) {
    fd_ = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    if (fd_ < 0) fail("cannot open " + path + ": " + errno_text());
  }
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  void write_all(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) fail("cannot write " + path_ + ": " + errno_text());
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  void read_at(void* data, size_t n, uint64_t offset) const {
    char* p = static_cast<char*>(data);
    while (n > 0) {
      const ssize_t r = ::pread(fd_, p, n, static_cast<off_t>(offset));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) fail("cannot read " + path_ + ": " + errno_text());
      if (r == 0) fail(path_ + " ends early (truncated?)");
      p += r;
      n -= static_cast<size_t>(r);
      offset += static_cast<uint64_t>(r);
    }
  }
  uint64_t size() const {
    struct stat st;
    if (::fstat(fd_, &st) != 0) fail("cannot stat " + path_ + ": " + errno_text());
    return static_cast<uint64_t>(st.st_size);
  }
  // fsync, then close (reporting a failure of either: close can report a delayed write error).
  void sync_and_close() {
    if (::fsync(fd_) != 0) fail("cannot fsync " + path_ + ": " + errno_text());
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("cannot close " + path_ + ": " + errno_text());
  }

 private:
  std::string path_;
  int fd_ = -1;
};

void fsync_dir(const std::string& dir) {
  Fd fd(dir, O_RDONLY | O_DIRECTORY);
  fd.sync_and_close();
}

void rename_or_fail(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    fail("cannot rename " + from + " to " + to + ": " + errno_text());
  }
}

template <typename T>
void put(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(T));
}
template <typename T>
T get(const char* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

uint64_t align_up(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// A file name for a layer: its name where it is safe, else a sanitized name plus a hash.
std::string file_for_layer(const std::string& layer) {
  std::string safe;
  for (char c : layer)
    safe +=
        (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') ? c : '_';
  if (safe != layer || safe.empty() || safe[0] == '.') {
    char hash[20];
    std::snprintf(hash, sizeof(hash), "-%08x", static_cast<unsigned>(stable_hash(layer)));
    safe = "layer_" + safe + hash;
  }
  return "tensors/" + safe + ".bin";
}

std::string tensor_header(uint64_t file_bytes, uint32_t count) {
  std::string h(kTensorMagic, 8);
  put<uint32_t>(&h, kCheckpointFormatVersion);
  put<uint32_t>(&h, static_cast<uint32_t>(kHeaderBytes));
  put<uint64_t>(&h, file_bytes);
  put<uint32_t>(&h, count);
  put<uint32_t>(&h, crc32c(h.data(), h.size()));
  h.resize(kHeaderBytes, '\0');
  return h;
}

// Checks a tensor file's header against the manifest's record of the file.
void check_tensor_header(const Fd& fd, const std::string& path, uint64_t expect_bytes) {
  const uint64_t size = fd.size();
  if (size != expect_bytes) {
    fail(path + " is " + std::to_string(size) + " bytes, the manifest says " +
         std::to_string(expect_bytes) + " (truncated or replaced)");
  }
  if (size < kHeaderBytes) fail(path + " is too short for a tensor file header");
  char h[kHeaderBytes];
  fd.read_at(h, kHeaderBytes, 0);
  if (std::memcmp(h, kTensorMagic, 8) != 0) {
    fail(path + " is not a Strata tensor file (bad magic; expected \"STRATATN\")");
  }
  const uint32_t version = get<uint32_t>(h + 8);
  if (version != kCheckpointFormatVersion) {
    fail(path + " has tensor file format version " + std::to_string(version) +
         "; this build reads version " + std::to_string(kCheckpointFormatVersion));
  }
  if (get<uint32_t>(h + 28) != crc32c(h, 28)) fail(path + ": header checksum mismatch");
  if (get<uint64_t>(h + 16) != size) {
    fail(path + ": the header records " + std::to_string(get<uint64_t>(h + 16)) +
         " bytes, the file has " + std::to_string(size));
  }
}

std::string describe(const proto::CheckpointTensor& t) {
  std::string s = t.kind() + " " + t.layer() + "." + t.name();
  if (!t.slot().empty()) s += " (" + t.slot() + ")";
  return s;
}

std::string key_of(const std::string& kind, const std::string& slot, const std::string& full) {
  return kind + "|" + slot + "|" + full;
}

Shape shape_of(const proto::CheckpointTensor& t) {
  return Shape(t.shape().begin(), t.shape().end());
}

// A host copy of a view (itself when it is already on the CPU).
Tensor on_host(const Tensor& t) {
  return t.device().is_cpu() ? t.contiguous() : to_allocator(t, default_cpu_allocator());
}

std::optional<int64_t> step_of_name(const std::string& name) {
  constexpr size_t kPrefix = 5;  // "step-"
  if (name.size() <= kPrefix || name.compare(0, kPrefix, "step-") != 0) return std::nullopt;
  int64_t step = 0;
  for (size_t i = kPrefix; i < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

// Committed checkpoints under root, newest first.
std::vector<CheckpointRef> committed(const std::string& root) {
  std::vector<CheckpointRef> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& entry : fs::directory_iterator(root)) {
    const auto step = step_of_name(entry.path().filename().string());
    if (step && entry.is_directory()) out.push_back({entry.path().string(), *step});
  }
  std::sort(out.begin(), out.end(),
            [](const CheckpointRef& a, const CheckpointRef& b) { return a.step > b.step; });
  return out;
}

}  // namespace

std::string checkpoint_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%06lld", static_cast<long long>(step));
  return name;
}

StoreTensors write_store_tensors(const ParamStore& store, const std::vector<std::string>& slots,
                                 const std::string& dir) {
  STRATA_CHECK_LE(slots.size(), store.state_slots())
      << "checkpoint: " << slots.size() << " state slots named, the store has "
      << store.state_slots();
  StoreTensors out;
  const auto& params = store.param_entries();
  const auto& buffers = store.buffer_entries();
  for (size_t layer = store.begin(); layer < store.end(); ++layer) {
    // The layer's tensors, in file order: parameters, buffers, optimizer state.
    struct Pending {
      proto::CheckpointTensor record;
      Tensor values;
    };
    std::vector<Pending> pending;
    std::string layer_name;
    auto add = [&](const ParamStore::Entry& e, const char* kind, const std::string& slot,
                   const Tensor& view) {
      Pending p;
      p.record.set_layer(e.layer);
      p.record.set_name(e.name);
      p.record.set_kind(kind);
      if (!slot.empty()) p.record.set_slot(slot);
      p.record.set_dtype(dtype_name(view.dtype()));
      for (int64_t d : e.shape) p.record.add_shape(d);
      p.values = view;
      pending.push_back(std::move(p));
      layer_name = e.layer;
    };
    std::vector<size_t> saved;  // parameters this layer owns (tied ones live with their owner)
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].layer_index != layer || !params[i].tied_to.empty()) continue;
      saved.push_back(i);
      add(params[i], "param", "", store.param(i));
    }
    for (size_t i = 0; i < buffers.size(); ++i) {
      if (buffers[i].layer_index == layer) add(buffers[i], "buffer", "", store.buffer(i));
    }
    for (size_t s = 0; s < slots.size(); ++s) {
      for (size_t i : saved) add(params[i], "optimizer", slots[s], store.state_view(s, i));
    }
    if (pending.empty()) continue;

    const std::string file = file_for_layer(layer_name);
    uint64_t offset = kHeaderBytes;
    for (Pending& p : pending) {
      offset = align_up(offset);
      p.record.set_file(file);
      p.record.set_offset(offset);
      p.record.set_bytes(p.values.nbytes());
      offset += p.values.nbytes();
    }
    const uint64_t file_bytes = offset;
    const std::string path = dir + "/" + file;
    Fd fd(path, O_WRONLY | O_CREAT | O_TRUNC);
    fd.write_all(tensor_header(file_bytes, static_cast<uint32_t>(pending.size())).data(),
                 kHeaderBytes);
    uint64_t at = kHeaderBytes;
    const std::string zeros(kAlign, '\0');
    for (Pending& p : pending) {
      fd.write_all(zeros.data(), p.record.offset() - at);
      const Tensor host = on_host(p.values);
      p.record.set_crc32c(crc32c(host.raw_data(), host.nbytes()));
      fd.write_all(host.raw_data(), host.nbytes());
      at = p.record.offset() + host.nbytes();
      out.tensors.push_back(std::move(p.record));
    }
    fd.sync_and_close();
    proto::CheckpointFile f;
    f.set_file(file);
    f.set_layer(layer_name);
    f.set_bytes(file_bytes);
    out.files.push_back(std::move(f));
    out.bytes += file_bytes;
  }
  return out;
}

void write_manifest(const std::string& dir, const proto::CheckpointManifest& manifest) {
  std::string payload;
  STRATA_CHECK(manifest.SerializeToString(&payload)) << "cannot serialize the manifest";
  std::string frame(kManifestMagic, 8);
  put<uint32_t>(&frame, kCheckpointFormatVersion);
  put<uint32_t>(&frame, crc32c(payload.data(), payload.size()));
  put<uint64_t>(&frame, payload.size());
  Fd fd(dir + "/" + kManifestFile, O_WRONLY | O_CREAT | O_TRUNC);
  fd.write_all(frame.data(), frame.size());
  fd.write_all(payload.data(), payload.size());
  fd.sync_and_close();
}

proto::CheckpointManifest read_manifest(const std::string& dir) {
  const std::string path = dir + "/" + kManifestFile;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    fail("no checkpoint manifest at " + path +
         " (not a checkpoint directory, or an incomplete one)");
  }
  Fd fd(path, O_RDONLY);
  const uint64_t size = fd.size();
  if (size < kManifestHeader)
    fail(path + " is too short for a manifest (" + std::to_string(size) + " bytes)");
  std::string data(size, '\0');
  fd.read_at(data.data(), size, 0);
  if (std::memcmp(data.data(), kManifestMagic, 8) != 0) {
    fail(path + " is not a Strata checkpoint manifest (bad magic; expected \"STRATAMF\")");
  }
  const uint32_t version = get<uint32_t>(data.data() + 8);
  if (version != kCheckpointFormatVersion) {
    fail(path + " has checkpoint format version " + std::to_string(version) +
         "; this build reads version " + std::to_string(kCheckpointFormatVersion));
  }
  const uint64_t length = get<uint64_t>(data.data() + 16);
  if (length != size - kManifestHeader) {
    fail(path + ": the header records a " + std::to_string(length) +
         "-byte manifest, the file holds " + std::to_string(size - kManifestHeader) +
         " (truncated?)");
  }
  const char* payload = data.data() + kManifestHeader;
  if (crc32c(payload, length) != get<uint32_t>(data.data() + 12)) {
    fail(path + ": checksum mismatch (the manifest is corrupt)");
  }
  proto::CheckpointManifest m;
  if (!m.ParseFromArray(payload, static_cast<int>(length)))
    fail(path + ": cannot parse the manifest");
  if (m.format_version() != kCheckpointFormatVersion) {
    fail(path + " records format version " + std::to_string(m.format_version()) +
         "; this build reads version " + std::to_string(kCheckpointFormatVersion));
  }
  std::map<std::string, uint64_t> files;
  for (const proto::CheckpointFile& f : m.file()) {
    // Writers name files tensors/<name>.bin (file_for_layer); anything else, "../" above all,
    // would make readers open files outside the checkpoint.
    const std::string& name = f.file();
    const std::string leaf = name.rfind("tensors/", 0) == 0 ? name.substr(8) : std::string();
    if (leaf.empty() || leaf == "." || leaf == ".." || leaf.find('/') != std::string::npos ||
        leaf.find('\0') != std::string::npos) {
      fail(path + ": the file name '" + name + "' is not of the form tensors/<name>.bin");
    }
    files[name] = f.bytes();
  }
  for (const proto::CheckpointTensor& t : m.tensor()) {
    const auto it = files.find(t.file());
    if (it == files.end()) fail(path + ": " + describe(t) + " names the unlisted file " + t.file());
    DType dtype;
    try {
      dtype = parse_dtype(t.dtype());
    } catch (const Error&) {
      fail(path + ": " + describe(t) + " has the unknown dtype '" + t.dtype() + "'");
    }
    // The shape and range come from the file: sizes are checked for sign and overflow, and the
    // range without computing offset + bytes, which a hostile offset could wrap around.
    uint64_t expect = dtype_size(dtype);
    bool shape_ok = true;
    for (int64_t d : t.shape()) {
      if (d < 0 || __builtin_mul_overflow(expect, static_cast<uint64_t>(d), &expect))
        shape_ok = false;
    }
    if (!shape_ok) {
      fail(path + ": " + describe(t) + " has the shape " + shape_str(shape_of(t)) +
           ", which has a negative size or more bytes than 2^64");
    }
    const uint64_t file_bytes = it->second;
    if (t.bytes() != expect || t.offset() < kHeaderBytes || t.offset() > file_bytes ||
        t.bytes() > file_bytes - t.offset()) {
      fail(path + ": " + describe(t) + " (" + std::to_string(t.bytes()) + " bytes at offset " +
           std::to_string(t.offset()) + ") does not fit its shape " + shape_str(shape_of(t)) +
           " or its file " + t.file() + " of " + std::to_string(file_bytes) + " bytes");
    }
  }
  return m;
}

proto::CheckpointManifest check_checkpoint(const std::string& dir) {
  proto::CheckpointManifest m = read_manifest(dir);
  for (const proto::CheckpointFile& f : m.file()) {
    const std::string path = dir + "/" + f.file();
    std::error_code ec;
    if (!fs::exists(path, ec)) fail("the manifest of " + dir + " names the missing file " + path);
    Fd fd(path, O_RDONLY);
    check_tensor_header(fd, path, f.bytes());
  }
  return m;
}

StoreLoad::StoreLoad(const std::string& dir, const proto::CheckpointManifest& manifest,
                     const ParamStore& store, const std::vector<std::string>& slots) {
  std::map<std::string, const proto::CheckpointTensor*> index;
  for (const proto::CheckpointTensor& t : manifest.tensor()) {
    const std::string key = key_of(t.kind(), t.slot(), t.layer() + "." + t.name());
    if (!index.emplace(key, &t).second)
      fail(dir + ": the manifest lists " + describe(t) + " twice");
  }
  std::map<std::string, uint64_t> file_bytes;
  for (const proto::CheckpointFile& f : manifest.file()) file_bytes[f.file()] = f.bytes();
  std::map<std::string, std::unique_ptr<Fd>> files;  // opened and header-checked once

  auto read = [&](Item::Kind kind, size_t entry, size_t slot, const ParamStore::Entry& e,
                  const std::string& key_name, const Tensor& target) {
    const char* kind_name = kind == Item::kParam    ? "param"
                            : kind == Item::kBuffer ? "buffer"
                                                    : "optimizer";
    const std::string slot_name = kind == Item::kState ? slots[slot] : "";
    const auto it = index.find(key_of(kind_name, slot_name, key_name));
    if (it == index.end()) {
      fail("checkpoint " + dir + " has no " + kind_name + " " + key_name +
           (slot_name.empty() ? "" : " (" + slot_name + ")") + " that the model needs for layer " +
           e.layer + " (shape " + shape_str(e.shape) + "): a checkpoint of another model" +
           (kind == Item::kState ? " or another optimizer" : ""));
    }
    const proto::CheckpointTensor& t = *it->second;
    const std::string path = dir + "/" + t.file();
    if (shape_of(t) != e.shape) {
      fail(path + ": " + describe(t) + " has shape " + shape_str(shape_of(t)) + ", the model's " +
           e.layer + "." + e.name + " has " + shape_str(e.shape));
    }
    if (t.dtype() != dtype_name(target.dtype())) {
      fail(path + ": " + describe(t) + " is " + t.dtype() + ", the model keeps " +
           dtype_name(target.dtype()));
    }
    auto& fd = files[t.file()];
    if (fd == nullptr) {
      std::error_code ec;
      if (!fs::exists(path, ec))
        fail("checkpoint " + dir + ": " + describe(t) + " is in the missing file " + path);
      fd = std::make_unique<Fd>(path, O_RDONLY);
      check_tensor_header(*fd, path, file_bytes.at(t.file()));
    }
    Item item{kind, entry, slot, Tensor::empty(e.shape, target.dtype(), &default_cpu_allocator())};
    fd->read_at(item.values.raw_data(), t.bytes(), t.offset());
    const uint32_t crc = crc32c(item.values.raw_data(), t.bytes());
    if (crc != t.crc32c()) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), " (crc32c %08x, expected %08x)", crc, t.crc32c());
      fail(path + ": checksum mismatch in " + describe(t) + buf + ": the file is corrupt");
    }
    bytes_ += t.bytes();
    items_.push_back(std::move(item));
  };

  const auto& params = store.param_entries();
  const auto& buffers = store.buffer_entries();
  STRATA_CHECK_LE(slots.size(), store.state_slots()) << "checkpoint: optimizer slots";
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].alias) continue;  // its owner's storage
    read(Item::kParam, i, 0, params[i], params[i].init_key(), store.param(i));
    for (size_t s = 0; s < slots.size(); ++s) {
      read(Item::kState, i, s, params[i], params[i].init_key(), store.state_view(s, i));
    }
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    read(Item::kBuffer, i, 0, buffers[i], buffers[i].full_name(), store.buffer(i));
  }
}

void StoreLoad::apply(ParamStore& store) const {
  for (const Item& item : items_) {
    const Tensor target = item.kind == Item::kParam    ? store.param(item.entry)
                          : item.kind == Item::kBuffer ? store.buffer(item.entry)
                                                       : store.state_view(item.slot, item.entry);
    if (target.device().is_cpu()) {
      target.copy_from(item.values);
    } else {
      copy_across_devices(target, item.values);
    }
  }
}

std::vector<std::string> unknown_layers(const proto::CheckpointManifest& manifest,
                                        const Model& model) {
  std::map<std::string, bool> known;
  for (size_t i = 0; i < model.size(); ++i) known[model.layer(i).name()] = true;
  std::vector<std::string> out;
  for (const proto::CheckpointTensor& t : manifest.tensor()) {
    if (!known.count(t.layer()) && std::find(out.begin(), out.end(), t.layer()) == out.end()) {
      out.push_back(t.layer());
    }
  }
  return out;
}

std::string begin_checkpoint(const std::string& root, int64_t step) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) fail("cannot create the checkpoint directory " + root + ": " + ec.message());
  const std::string tmp = root + "/" + checkpoint_name(step) + ".tmp";
  fs::remove_all(tmp, ec);
  if (ec) fail("cannot remove the leftover " + tmp + ": " + ec.message());
  fs::create_directories(tmp + "/tensors", ec);
  if (ec) fail("cannot create " + tmp + "/tensors: " + ec.message());
  return tmp;
}

std::string commit_checkpoint(const std::string& root, int64_t step) {
  const std::string name = checkpoint_name(step);
  const std::string final_path = root + "/" + name;
  const std::string tmp = final_path + ".tmp";
  fsync_dir(tmp + "/tensors");
  fsync_dir(tmp);
  std::error_code ec;
  if (fs::exists(final_path, ec)) {  // an older checkpoint of the same step
    const std::string old = final_path + ".old";
    fs::remove_all(old, ec);
    rename_or_fail(final_path, old);
    rename_or_fail(tmp, final_path);
    fsync_dir(root);
    fs::remove_all(old, ec);
  } else {
    rename_or_fail(tmp, final_path);
    fsync_dir(root);
  }
  const std::string latest_tmp = root + "/latest.tmp";
  {
    Fd fd(latest_tmp, O_WRONLY | O_CREAT | O_TRUNC);
    const std::string line = name + "\n";
    fd.write_all(line.data(), line.size());
    fd.sync_and_close();
  }
  rename_or_fail(latest_tmp, root + "/latest");
  fsync_dir(root);
  return final_path;
}

std::vector<std::string> prune_checkpoints(const std::string& root, int keep_last) {
  std::vector<std::string> removed;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return removed;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    const bool leftover = name.size() > 4 && (name.compare(name.size() - 4, 4, ".tmp") == 0 ||
                                              name.compare(name.size() - 4, 4, ".old") == 0);
    if (leftover && step_of_name(name.substr(0, name.size() - 4))) {
      fs::remove_all(entry.path(), ec);
      removed.push_back(name);
    }
  }
  if (keep_last <= 0) return removed;
  const std::vector<CheckpointRef> all = committed(root);
  for (size_t i = static_cast<size_t>(keep_last); i < all.size(); ++i) {
    // Renamed first, so that a kill during the removal never leaves a half-deleted step-*.
    const std::string old = all[i].path + ".old";
    rename_or_fail(all[i].path, old);
    fs::remove_all(old, ec);
    if (ec) fail("cannot remove " + old + ": " + ec.message());
    removed.push_back(fs::path(all[i].path).filename().string());
  }
  return removed;
}

std::optional<CheckpointRef> find_latest_checkpoint(const std::string& root) {
  for (const CheckpointRef& ref : committed(root)) {
    try {
      const proto::CheckpointManifest m = check_checkpoint(ref.path);
      if (m.step() != ref.step) {
        fail(ref.path + " holds the checkpoint of step " + std::to_string(m.step()));
      }
      return ref;
    } catch (const CheckpointError& e) {
      STRATA_LOG(WARN) << "skipping " << ref.path << ": " << e.message();
    }
  }
  return std::nullopt;
}

CheckpointRef resolve_checkpoint(const std::string& path) {
  std::error_code ec;
  if (fs::exists(path + "/" + kManifestFile, ec)) {
    const proto::CheckpointManifest m = check_checkpoint(path);
    return {path, m.step()};
  }
  if (!fs::is_directory(path, ec)) fail("--resume " + path + ": no such checkpoint or directory");
  const auto latest = find_latest_checkpoint(path);
  if (!latest) {
    fail("--resume " + path +
         ": no complete checkpoint (step-NNNNNN/ with a valid manifest.pb) in it");
  }
  return *latest;
}

}  // namespace strata::graph
