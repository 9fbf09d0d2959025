// Tensor: a view {storage, offset, shape, strides, dtype} over reference-counted storage.
//
// Copying a Tensor copies the view, never the data: both refer to the same Storage, which frees
// its bytes (through the allocator that gave them) when the last view goes. View operations
// (view, transpose, permute, narrow, select, ...) never copy; contiguous(), clone(), to() and
// copy_from() do, and say so. Offsets and strides count elements, not bytes.
//
// A CUDA tensor's data<T>() is a device pointer. The element-wise helpers here (fill_, zero_,
// copy_from, to(dtype), item, to_vector, from_vector) also take contiguous device tensors by
// staging through the host: each copies on the stream that orders the tensor's memory (its
// allocator's, Allocator::stream(): a context's tensors come after the work enqueued on that
// context so far) and waits for that stream, not for the rest of the device. They are for
// initialization, checkpoints and reports; the hot path uses device ops (ops/).
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "engine/allocator.h"
#include "engine/check.h"
#include "engine/device.h"
#include "engine/dtype.h"

namespace strata {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);  // "(2, 3, 4)"
int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);

// Bytes from one allocator, freed through it when the last reference goes.
class Storage {
 public:
  Storage(Allocator& allocator, size_t nbytes, const char* what = nullptr);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Allocator& allocator() const { return *allocator_; }
  Device device() const { return allocator_->device(); }

 private:
  Allocator* allocator_;
  void* data_;
  size_t nbytes_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false
  Tensor(std::shared_ptr<Storage> storage, int64_t offset, Shape shape, Shape strides, DType dtype);

  // New contiguous tensors. The allocator defaults to default_cpu_allocator(). `empty` leaves
  // the bytes uninitialized.
  static Tensor empty(const Shape& shape, DType dtype = DType::kF32, Allocator* alloc = nullptr);
  static Tensor zeros(const Shape& shape, DType dtype = DType::kF32, Allocator* alloc = nullptr);
  static Tensor full(const Shape& shape, double value, DType dtype = DType::kF32,
                     Allocator* alloc = nullptr);
  // A CPU tensor holding a copy of `values` (values.size() must equal the shape's numel).
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                            Allocator* alloc = nullptr);
  // Same shape and dtype, from the same allocator.
  Tensor empty_like() const;
  Tensor zeros_like() const;

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const;
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const;    // negative d counts from the end
  int64_t stride(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  size_t element_size() const { return dtype_size(dtype_); }
  int64_t offset() const { return offset_; }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  Allocator& allocator() const;
  // True when both views refer to the same storage.
  bool shares_storage(const Tensor& other) const { return storage_ == other.storage_; }

  // Pointer to element 0 of the view; T must match dtype() (checked).
  template <typename T>
  T* data() const {
    STRATA_CHECK(defined()) << "data() on an undefined tensor";
    STRATA_CHECK(dtype_of<T>() == dtype_)
        << "data<" << dtype_name(dtype_of<T>()) << ">() on a " << dtype_name(dtype_) << " tensor";
    return static_cast<T*>(raw_data());
  }
  void* raw_data() const;

  // ---- views (no copy) -------------------------------------------------------------------
  Tensor view(const Shape& shape) const;     // needs a contiguous tensor; one -1 is inferred
  Tensor reshape(const Shape& shape) const;  // a view when contiguous, else a copy
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;  // removes `dim`
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;

  // ---- copies and element-wise helpers (CPU) ----------------------------------------------
  Tensor contiguous() const;     // this tensor when already contiguous, else a contiguous copy
  Tensor clone() const;          // always a new contiguous copy
  Tensor to(DType dtype) const;  // converting copy (this tensor when dtype already matches)
  // Copies src into this view element by element (shapes must match), converting dtypes.
  // These write through the view; like every handle to shared storage, a const Tensor still
  // refers to mutable data.
  void copy_from(const Tensor& src) const;
  void fill_(double value) const;
  void zero_() const;

  template <typename T>
  T item() const;  // the single element (numel() == 1), converted to T
  template <typename T>
  std::vector<T> to_vector() const;  // all elements in row-major order, converted to T

  std::string shape_str() const { return strata::shape_str(shape_); }
  std::string str() const;  // "f32 cpu (2, 3)"

 private:
  int64_t wrap_dim(int64_t d, int64_t ndim) const;

  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;
  Shape shape_;
  Shape strides_;
  DType dtype_ = DType::kF32;
};

using TensorList = std::vector<Tensor>;

inline std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

// Copies between devices (and between host allocators). Both must have the same shape and dtype
// and be contiguous; CUDA copies go through the CUDA runtime.
void copy_across_devices(const Tensor& dst, const Tensor& src);
// The same copy without the host waiting for the device: ordered on the stream of the destination's
// memory (or the source's; engine/cuda_runtime.h memcpy_ordered). For device-to-device copies on
// a hot path (the --dp-delay gradient ring); host to host it is copy_across_devices.
void copy_across_devices_async(const Tensor& dst, const Tensor& src);
// A contiguous copy of `src` on `alloc`'s device.
Tensor to_allocator(const Tensor& src, Allocator& alloc);

}  // namespace strata
