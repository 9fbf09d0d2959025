#include "parallel/micro_batches.h"

#include "engine/check.h"
#include "ops/cross_entropy.h"

namespace strata::parallel {

LoaderMicroBatches::LoaderMicroBatches(std::shared_ptr<const io::Dataset> data,
                                       const io::DataLoaderOptions& options, int64_t micro_batches,
                                       bool loads_data, Communicator* dp_last, int64_t ignore_index,
                                       bool per_micro_batch)
    : data_(data),
      loader_(data, options),
      micro_batches_(micro_batches),
      loads_data_(loads_data),
      dp_last_(dp_last),
      ignore_index_(ignore_index),
      per_micro_batch_(per_micro_batch) {
  STRATA_CHECK_GE(micro_batches, 1) << "--micro-batches must be at least 1";
  STRATA_CHECK_GT(loader_.batches_per_epoch(), 0)
      << "dataset " << data->name() << " (" << data->size() << " samples) gives no batch of "
      << options.batch_size;
}

int64_t LoaderMicroBatches::group_rows(int64_t step) const {
  int64_t begin = 0, end = 0;
  loader_.shard_rows(step % loader_.batches_per_epoch(), &begin, &end);
  return end - begin;
}

void LoaderMicroBatches::split(int64_t micro_batch, int64_t* step, int64_t* begin,
                               int64_t* rows) const {
  STRATA_CHECK_GE(micro_batch, 0) << "negative micro-batch id";
  *step = micro_batch / micro_batches_;
  const int64_t i = micro_batch % micro_batches_;
  const int64_t r = group_rows(*step);
  *begin = i * r / micro_batches_;
  *rows = (i + 1) * r / micro_batches_ - *begin;
}

MicroBatchSource::Info LoaderMicroBatches::info(int64_t micro_batch) {
  Info info;
  int64_t begin = 0;
  split(micro_batch, &info.step, &begin, &info.rows);
  int64_t shard_begin = 0, shard_end = 0;
  loader_.shard_rows(info.step % loader_.batches_per_epoch(), &shard_begin, &shard_end);
  info.sample_offset = shard_begin + begin;
  if (loads_data_) {
    const std::vector<double>& n = load(info.step).normalizers;
    info.loss_normalizer = n[per_micro_batch_ ? micro_batch % micro_batches_ : 0];
  }
  return info;
}

LoaderMicroBatches::StepData& LoaderMicroBatches::load(int64_t step) {
  auto it = steps_.find(step);
  if (it != steps_.end()) return it->second;
  STRATA_CHECK(loads_data_) << "this rank does not load data";
  STRATA_CHECK_GE(step, next_step_) << "step " << step << " requested after its data was released";
  const int64_t per_epoch = loader_.batches_per_epoch();
  StepData data;
  while (next_step_ <= step) {
    const int64_t epoch = next_step_ / per_epoch;
    if (epoch != loader_epoch_) {
      loader_.start_epoch(epoch, next_step_ % per_epoch);
      loader_epoch_ = epoch;
    }
    io::Batch batch;
    STRATA_CHECK(loader_.next(&batch)) << "data loader ended epoch " << epoch << " early";
    STRATA_CHECK_EQ(batch.step, next_step_ % per_epoch) << "data loader out of step";
    if (next_step_ == step) data.batch = std::move(batch);
    ++next_step_;
  }
  // Counted targets: of the whole shard, or of each micro-batch.
  const int64_t parts = per_micro_batch_ ? micro_batches_ : 1;
  std::vector<double> counts;
  for (int64_t i = 0; i < parts; ++i) {
    const int64_t rows = data.batch.target.size(0);
    const int64_t begin = i * rows / parts, end = (i + 1) * rows / parts;
    const Tensor part = data.batch.target.narrow(0, begin, end - begin).reshape({-1});
    counts.push_back(static_cast<double>(ops::count_targets(part, ignore_index_)));
  }
  if (dp_last_ != nullptr && dp_last_->size() > 1) {
    Tensor t = Tensor::from_vector(counts, {parts});
    auto r = dp_last_->all_reduce(t);
    r->wait(dp_last_->timeout(), "loss normalizer of step " + std::to_string(step));
    counts = t.to_vector<double>();
  }
  for (double& c : counts) c = c > 0 ? c : 1.0;
  data.normalizers = std::move(counts);
  return steps_.emplace(step, std::move(data)).first->second;
}

TensorList LoaderMicroBatches::input(int64_t micro_batch) {
  int64_t step = 0, begin = 0, rows = 0;
  split(micro_batch, &step, &begin, &rows);
  return {load(step).batch.input.narrow(0, begin, rows)};
}

Tensor LoaderMicroBatches::target(int64_t micro_batch) {
  int64_t step = 0, begin = 0, rows = 0;
  split(micro_batch, &step, &begin, &rows);
  return load(step).batch.target.narrow(0, begin, rows);
}

void LoaderMicroBatches::start_at(int64_t step) {
  STRATA_CHECK(steps_.empty() && loader_epoch_ < 0) << "start_at after the first micro-batch";
  STRATA_CHECK_GE(step, 0) << "start_at a negative step";
  next_step_ = step;
}

void LoaderMicroBatches::release_before(int64_t step) {
  steps_.erase(steps_.begin(), steps_.lower_bound(step));
}

}  // namespace strata::parallel
