// Checkpoint files: round trips (whole and split stores, tied parameters), every kind of bad input
// refused with the file and tensor named and nothing half-loaded, and the directory protocol
// (temporary names, latest, pruning, incomplete checkpoints skipped).
#include "graph/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "graph/layers.h"
#include "graph/model.h"
#include "graph/param_store.h"
#include "testing/testing.h"

namespace strata::graph {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<Model> mlp(int64_t fc1_out = 5, bool extra_layer = false, bool drop_fc2 = false) {
  auto m = std::make_unique<Model>("m", Shape{3});
  m->add(std::make_unique<LinearLayer>("fc1", 3, fc1_out, true));
  m->add(std::make_unique<BatchNormLayer>("bn", Shape{fc1_out}, 0.1, 1e-5, true));
  m->add(std::make_unique<ReluLayer>("relu"));
  if (!drop_fc2) m->add(std::make_unique<LinearLayer>("fc2", fc1_out, 2, false));
  if (extra_layer) m->add(std::make_unique<LinearLayer>("fc3", 2, 2, true));
  return m;
}

const std::vector<std::string> kSlots = {"exp_avg", "exp_avg_sq"};

// A store of layers [begin, end) with parameters from `seed` and random buffers and state.
std::unique_ptr<ParamStore> make_store(Model& m, size_t begin, size_t end, uint64_t seed) {
  auto s = std::make_unique<ParamStore>(m, begin, end, default_cpu_allocator());
  s->initialize(seed);
  s->ensure_state(2);
  s->buffers().copy_from(testing::random_tensor(s->buffers().shape(), seed + 1));
  s->state(0).copy_from(testing::random_tensor(s->params().shape(), seed + 2));
  s->state(1).copy_from(testing::random_tensor(s->params().shape(), seed + 3, 0, 1));
  return s;
}

struct Snapshot {
  std::vector<float> params, buffers, state0, state1;
  bool operator==(const Snapshot& o) const {
    return params == o.params && buffers == o.buffers && state0 == o.state0 && state1 == o.state1;
  }
};
// The values of every entry (not the alignment padding between them, which is not saved).
Snapshot snapshot(const ParamStore& s) {
  Snapshot out;
  auto append = [](std::vector<float>* to, const Tensor& t) {
    const std::vector<float> v = t.to_vector<float>();
    to->insert(to->end(), v.begin(), v.end());
  };
  for (size_t i = 0; i < s.param_entries().size(); ++i) {
    append(&out.params, s.param(i));
    append(&out.state0, s.state_view(0, i));
    append(&out.state1, s.state_view(1, i));
  }
  for (size_t i = 0; i < s.buffer_entries().size(); ++i) append(&out.buffers, s.buffer(i));
  return out;
}

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/strata_ckpt_" + name;
  fs::remove_all(dir);
  fs::create_directories(dir + "/tensors");
  return dir;
}

// Writes the stores' layers and a manifest of step 7 into `dir`.
proto::CheckpointManifest write(const std::string& dir,
                                const std::vector<const ParamStore*>& stores) {
  proto::CheckpointManifest m;
  m.set_format_version(kCheckpointFormatVersion);
  m.set_step(7);
  for (const ParamStore* s : stores) {
    const StoreTensors t = write_store_tensors(*s, kSlots, dir);
    for (const auto& r : t.tensors) *m.add_tensor() = r;
    for (const auto& f : t.files) *m.add_file() = f;
  }
  write_manifest(dir, m);
  return m;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

TEST(Checkpoint, RoundTripRestoresParametersBuffersAndOptimizerState) {
  const std::string dir = fresh_dir("roundtrip");
  auto m = mlp();
  auto saved = make_store(*m, 0, m->size(), 1);
  const proto::CheckpointManifest manifest = write(dir, {saved.get()});
  // fc1 (weight, bias), bn (weight, bias, 2 buffers), fc2 (weight): params and 2 slots each.
  EXPECT_EQ(manifest.tensor_size(), 5 * 3 + 2);
  EXPECT_EQ(manifest.file_size(), 3);  // relu has no tensors
  EXPECT_TRUE(fs::exists(dir + "/tensors/fc1.bin"));

  auto m2 = mlp();
  auto loaded = make_store(*m2, 0, m2->size(), 99);
  ASSERT_FALSE(snapshot(*loaded) == snapshot(*saved));
  const proto::CheckpointManifest read = check_checkpoint(dir);
  EXPECT_EQ(read.step(), 7);
  StoreLoad(dir, read, *loaded, kSlots).apply(*loaded);
  EXPECT_TRUE(snapshot(*loaded) == snapshot(*saved));
}

// Copies the parameters, buffers and state of `to`'s entries from the entries of the same name.
void copy_by_name(const ParamStore& from, ParamStore& to) {
  for (size_t i = 0; i < to.param_entries().size(); ++i) {
    for (size_t j = 0; j < from.param_entries().size(); ++j) {
      if (from.param_entries()[j].full_name() != to.param_entries()[i].full_name()) continue;
      to.param(i).copy_from(from.param(j));
      for (size_t s = 0; s < 2; ++s) to.state_view(s, i).copy_from(from.state_view(s, j));
    }
  }
  for (size_t i = 0; i < to.buffer_entries().size(); ++i) {
    for (size_t j = 0; j < from.buffer_entries().size(); ++j) {
      if (from.buffer_entries()[j].full_name() == to.buffer_entries()[i].full_name()) {
        to.buffer(i).copy_from(from.buffer(j));
      }
    }
  }
}

TEST(Checkpoint, StoresOfAnyRangeLoadWhatOtherRangesWrote) {
  const std::string dir = fresh_dir("ranges");
  auto m = mlp();
  auto whole = make_store(*m, 0, m->size(), 1);
  // Written by two "stages" holding the same values...
  auto ma = mlp(), mb = mlp();
  auto a = make_store(*ma, 0, 2, 7);
  auto b = make_store(*mb, 2, 4, 8);
  copy_by_name(*whole, *a);
  copy_by_name(*whole, *b);
  write(dir, {a.get(), b.get()});
  // ...read by one, and by another split.
  auto m2 = mlp();
  auto loaded = make_store(*m2, 0, m2->size(), 5);
  StoreLoad(dir, read_manifest(dir), *loaded, kSlots).apply(*loaded);
  EXPECT_TRUE(snapshot(*loaded) == snapshot(*whole));
  auto m3 = mlp();
  auto first = make_store(*m3, 0, 1, 5);
  StoreLoad(dir, read_manifest(dir), *first, kSlots).apply(*first);
  EXPECT_EQ(first->param(0).to_vector<float>(), whole->param(0).to_vector<float>());
}

// A head tied to an embedding: saved once under its owner, loaded into an alias (one store) or
// a copy (the owner on another stage).
class TiedHead final : public Layer {
 public:
  TiedHead() : Layer("head") {}
  const char* type() const override { return "tied_head"; }
  std::vector<ParamSpec> param_specs() const override {
    ParamSpec p;
    p.name = "weight";
    p.shape = {4, 3};
    p.tied_to = "embed.weight";
    return {p};
  }
  Shape output_shape(const Shape& in) const override { return in; }
  TensorList forward(ExecContext&, const TensorList& in, LayerTape&) override { return in; }
  TensorList backward(ExecContext&, const TensorList& g, LayerTape&) override { return g; }
};

std::unique_ptr<Model> tied_model() {
  auto m = std::make_unique<Model>("tied", Shape{3});
  m->add(std::make_unique<LinearLayer>("embed", 3, 4, false));
  m->add(std::make_unique<ReluLayer>("relu"));
  m->add(std::make_unique<TiedHead>());
  return m;
}

TEST(Checkpoint, TiedParametersAreSavedOnceAndLoadedWhereverTheCopyLives) {
  const std::string dir = fresh_dir("tied");
  auto m = tied_model();
  auto whole = make_store(*m, 0, m->size(), 3);
  ASSERT_TRUE(whole->param_entries()[1].alias);
  const proto::CheckpointManifest manifest = write(dir, {whole.get()});
  for (const auto& t : manifest.tensor()) EXPECT_NE(t.layer(), "head") << t.name();

  auto m2 = tied_model();
  auto first = make_store(*m2, 0, 2, 8);
  auto last = make_store(*m2, 2, 3, 9);  // holds a copy of embed.weight
  ASSERT_EQ(last->tied_copies().size(), 1u);
  StoreLoad(dir, manifest, *first, kSlots).apply(*first);
  StoreLoad(dir, manifest, *last, kSlots).apply(*last);
  EXPECT_EQ(last->param(0).to_vector<float>(), whole->param(0).to_vector<float>());
  EXPECT_EQ(last->state_view(1, 0).to_vector<float>(), whole->state_view(1, 0).to_vector<float>());
  EXPECT_EQ(first->param(0).to_vector<float>(), whole->param(0).to_vector<float>());
}

// Loading `dir` into a fresh store must throw a CheckpointError mentioning every `needle`, and
// leave the store exactly as it was.
void expect_refused(const std::string& dir, Model& model, const std::vector<std::string>& needles) {
  auto store = make_store(model, 0, model.size(), 42);
  const Snapshot before = snapshot(*store);
  try {
    const proto::CheckpointManifest m = check_checkpoint(dir);
    StoreLoad(dir, m, *store, kSlots).apply(*store);
    ADD_FAILURE() << "the checkpoint was accepted";
  } catch (const CheckpointError& e) {
    for (const std::string& n : needles) {
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "'" << n << "' not in: " << e.what();
    }
  }
  EXPECT_TRUE(snapshot(*store) == before) << "the store changed";
}

class BadCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    model_ = mlp();
    store_ = make_store(*model_, 0, model_->size(), 1);
    manifest_ = write(dir_, {store_.get()});
  }
  std::string manifest_path() const { return dir_ + "/manifest.pb"; }
  // The last file holds fc2: corrupting it proves that fc1 and bn, read first, are not applied.
  std::string fc2_path() const { return dir_ + "/tensors/fc2.bin"; }
  void patch(const std::string& path, size_t offset, const std::string& bytes) {
    std::string data = read_file(path);
    ASSERT_LE(offset + bytes.size(), data.size());
    data.replace(offset, bytes.size(), bytes);
    write_file(path, data);
  }

  std::string dir_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<ParamStore> store_;
  proto::CheckpointManifest manifest_;
};

TEST_F(BadCheckpoint, ManifestWithWrongMagic) {
  patch(manifest_path(), 0, "NOTSTRAT");
  expect_refused(dir_, *model_, {manifest_path(), "bad magic"});
}

TEST_F(BadCheckpoint, ManifestOfAnotherVersion) {
  patch(manifest_path(), 8, std::string("\x09\x00\x00\x00", 4));
  expect_refused(dir_, *model_, {manifest_path(), "format version 9", "reads version 1"});
}

TEST_F(BadCheckpoint, TruncatedManifest) {
  const std::string data = read_file(manifest_path());
  write_file(manifest_path(), data.substr(0, data.size() - 3));
  expect_refused(dir_, *model_, {manifest_path(), "truncated"});
}

TEST_F(BadCheckpoint, ManifestChecksumMismatch) {
  std::string data = read_file(manifest_path());
  data[data.size() - 2] ^= 0x40;
  write_file(manifest_path(), data);
  expect_refused(dir_, *model_, {manifest_path(), "checksum mismatch"});
}

TEST_F(BadCheckpoint, TensorFileWithWrongMagic) {
  patch(fc2_path(), 0, "GARBAGE!");
  expect_refused(dir_, *model_, {fc2_path(), "bad magic"});
}

TEST_F(BadCheckpoint, TensorFileOfAnotherVersion) {
  patch(fc2_path(), 8, std::string("\x02\x00\x00\x00", 4));
  expect_refused(dir_, *model_, {fc2_path(), "version 2"});
}

TEST_F(BadCheckpoint, TruncatedTensorFile) {
  const std::string data = read_file(fc2_path());
  write_file(fc2_path(), data.substr(0, data.size() - 8));
  expect_refused(dir_, *model_, {fc2_path(), "the manifest says", "truncated"});
}

TEST_F(BadCheckpoint, TensorChecksumMismatchLoadsNothing) {
  // Flip one bit of fc2.weight's momentum (the last tensor of the last file).
  const proto::CheckpointTensor& last = manifest_.tensor(manifest_.tensor_size() - 1);
  ASSERT_EQ(last.layer(), "fc2");
  std::string data = read_file(fc2_path());
  data[last.offset() + 5] ^= 0x01;
  write_file(fc2_path(), data);
  // The cheap completeness check passes (sizes and headers are right)...
  EXPECT_NO_THROW(check_checkpoint(dir_));
  // ...the load does not, and nothing of fc1 or bn (read before) reaches the store.
  expect_refused(dir_, *model_, {fc2_path(), "checksum mismatch", "fc2.weight", "exp_avg_sq"});
}

TEST_F(BadCheckpoint, ManifestNamingAMissingFile) {
  fs::remove(fc2_path());
  expect_refused(dir_, *model_, {fc2_path(), "missing file"});
}

// Manifests a fuzzer wrote (tests/fuzz/checkpoint_manifest_fuzz.cpp): sizes and offsets from the
// file must not overflow into a range that passes the checks, nor names lead outside the directory.
void expect_manifest_refused(const std::string& dir, const proto::CheckpointManifest& m,
                             const std::string& what) {
  write_manifest(dir, m);
  try {
    read_manifest(dir);
    FAIL() << "accepted a manifest with " << what;
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST_F(BadCheckpoint, ManifestWithAShapeWhoseSizeOverflows) {
  proto::CheckpointManifest m = manifest_;
  m.mutable_tensor(0)->clear_shape();
  m.mutable_tensor(0)->add_shape(int64_t{1} << 62);  // x 4 bytes: 2^64, 0 when it wraps around
  m.mutable_tensor(0)->add_shape(4);
  m.mutable_tensor(0)->set_bytes(0);
  expect_manifest_refused(dir_, m, "more bytes than 2^64");
  m.mutable_tensor(0)->set_shape(0, -1);
  expect_manifest_refused(dir_, m, "negative size");
}

TEST_F(BadCheckpoint, ManifestWithAnOffsetThatWrapsAround) {
  proto::CheckpointManifest m = manifest_;
  proto::CheckpointTensor* t = m.mutable_tensor(0);
  t->set_offset(~uint64_t{0} - t->bytes() + 2);  // offset + bytes == 1 (mod 2^64)
  expect_manifest_refused(dir_, m, "does not fit its shape");
}

TEST_F(BadCheckpoint, ManifestNamingAFileOutsideTheCheckpoint) {
  for (const std::string name :
       {"../../etc/passwd", "/etc/passwd", "tensors/../../x.bin", "tensors/", "manifest.pb"}) {
    proto::CheckpointManifest m = manifest_;
    const std::string old = m.file(0).file();
    m.mutable_file(0)->set_file(name);
    for (proto::CheckpointTensor& t : *m.mutable_tensor())
      if (t.file() == old) t.set_file(name);
    expect_manifest_refused(dir_, m, "is not of the form tensors/<name>.bin");
  }
}

TEST_F(BadCheckpoint, ModelWithALayerTheCheckpointLacks) {
  auto bigger = mlp(5, /*extra_layer=*/true);
  expect_refused(dir_, *bigger, {dir_, "no param fc3.weight", "layer fc3"});
}

TEST_F(BadCheckpoint, ModelWithAnotherShape) {
  auto wider = mlp(6);
  expect_refused(dir_, *wider, {dir_ + "/tensors/fc1.bin", "fc1.weight", "(5, 3)", "(6, 3)"});
}

TEST_F(BadCheckpoint, ModelWithoutALayerOfTheCheckpoint) {
  auto smaller = mlp(5, false, /*drop_fc2=*/true);
  EXPECT_EQ(unknown_layers(manifest_, *smaller), std::vector<std::string>{"fc2"});
  EXPECT_TRUE(unknown_layers(manifest_, *model_).empty());
}

TEST_F(BadCheckpoint, OtherOptimizerState) {
  auto store = make_store(*model_, 0, model_->size(), 42);
  EXPECT_THROW(StoreLoad(dir_, manifest_, *store, {"momentum", "other"}), CheckpointError);
}

// ---- the directory protocol -------------------------------------------------------------------

void write_checkpoint(const std::string& root, int64_t step, const ParamStore& store) {
  const std::string tmp = begin_checkpoint(root, step);
  proto::CheckpointManifest m;
  m.set_format_version(kCheckpointFormatVersion);
  m.set_step(step);
  const StoreTensors t = write_store_tensors(store, kSlots, tmp);
  for (const auto& r : t.tensors) *m.add_tensor() = r;
  for (const auto& f : t.files) *m.add_file() = f;
  write_manifest(tmp, m);
  commit_checkpoint(root, step);
}

std::string latest_of(const std::string& root) { return read_file(root + "/latest"); }

TEST(CheckpointDirectory, CommitPublishesAtomicallyAndPointsLatestAtIt) {
  const std::string root = ::testing::TempDir() + "/strata_ckpt_dirs";
  fs::remove_all(root);
  auto m = mlp();
  auto store = make_store(*m, 0, m->size(), 1);
  EXPECT_FALSE(find_latest_checkpoint(root).has_value());
  write_checkpoint(root, 3, *store);
  EXPECT_EQ(latest_of(root), "step-000003\n");
  EXPECT_FALSE(fs::exists(root + "/step-000003.tmp"));
  write_checkpoint(root, 12, *store);
  // A write killed before its rename leaves a .tmp, never a step-*: ignored.
  begin_checkpoint(root, 15);
  // A step-* without manifest (copied by hand, or damaged) is skipped, with a warning.
  fs::create_directories(root + "/step-000020/tensors");
  auto found = find_latest_checkpoint(root);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->step, 12);
  EXPECT_EQ(found->path, root + "/step-000012");
  EXPECT_EQ(resolve_checkpoint(root).step, 12);
  EXPECT_EQ(resolve_checkpoint(root + "/step-000003").step, 3);
  EXPECT_THROW(resolve_checkpoint(root + "/nope"), CheckpointError);
  fs::remove_all(root + "/step-000020");

  // `latest` lagging behind (killed between the rename and the pointer) does not matter.
  write_file(root + "/latest", "step-000003\n");
  EXPECT_EQ(find_latest_checkpoint(root)->step, 12);

  // A checkpoint of a step that exists already replaces it.
  write_checkpoint(root, 12, *store);
  EXPECT_EQ(find_latest_checkpoint(root)->step, 12);
  EXPECT_EQ(latest_of(root), "step-000012\n");

  write_checkpoint(root, 13, *store);
  write_checkpoint(root, 14, *store);
  const std::vector<std::string> removed = prune_checkpoints(root, 2);
  EXPECT_TRUE(fs::exists(root + "/step-000014"));
  EXPECT_TRUE(fs::exists(root + "/step-000013"));
  EXPECT_FALSE(fs::exists(root + "/step-000012"));
  EXPECT_FALSE(fs::exists(root + "/step-000003"));
  EXPECT_FALSE(fs::exists(root + "/step-000015.tmp"));  // leftovers go too
  EXPECT_EQ(removed.size(), 3u) << ::testing::PrintToString(removed);
}

TEST(CheckpointDirectory, AManifestOfAnotherStepIsNotTaken) {
  const std::string root = ::testing::TempDir() + "/strata_ckpt_renamed";
  fs::remove_all(root);
  auto m = mlp();
  auto store = make_store(*m, 0, m->size(), 1);
  write_checkpoint(root, 4, *store);
  write_checkpoint(root, 5, *store);
  fs::rename(root + "/step-000004", root + "/step-000009");  // renamed by hand
  EXPECT_EQ(find_latest_checkpoint(root)->step, 5);
}

}  // namespace
}  // namespace strata::graph
