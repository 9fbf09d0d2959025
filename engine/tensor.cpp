// Tensor views and the CPU element-wise helpers.
//
// Strided copies walk the destination in row-major order one innermost row at a time, keeping a
// multi-index for the outer dimensions, so no division happens per element; rows are split over
// OpenMP threads when the tensor is large.
#include "engine/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "engine/cuda_runtime.h"
#include "engine/element.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace strata {

// ---- shapes ------------------------------------------------------------------------------------

std::string shape_str(const Shape& shape) {
  std::ostringstream s;
  s << "(";
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  if (shape.size() == 1) s << ",";
  s << ")";
  return s.str();
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

// ---- storage -----------------------------------------------------------------------------------

Storage::Storage(Allocator& allocator, size_t nbytes, const char* what)
    : allocator_(&allocator), data_(allocator.allocate(nbytes, what)), nbytes_(nbytes) {}

Storage::~Storage() { allocator_->deallocate(data_, nbytes_); }

namespace {

// Row-major walk over `shape`, calling row(dst_offset, src_offset, inner_len) for each innermost
// row; offsets in elements.
template <typename RowFn>
void for_each_row(const Shape& shape, const Shape& dst_strides, const Shape& src_strides,
                  RowFn&& row) {
  const int64_t ndim = static_cast<int64_t>(shape.size());
  if (ndim == 0) {
    row(0, 0, 1);
    return;
  }
  const int64_t inner = shape[ndim - 1];
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < ndim; ++d) rows *= shape[d];
  if (rows == 0 || inner == 0) return;
  const bool parallel = rows * inner > (1 << 16);
#pragma omp parallel if (parallel)
  {
    // Each thread takes a contiguous block of rows and keeps its own multi-index.
    int nthreads = 1, tid = 0;
#ifdef _OPENMP
    nthreads = omp_get_num_threads();
    tid = omp_get_thread_num();
#endif
    const int64_t begin = rows * tid / nthreads;
    const int64_t end = rows * (tid + 1) / nthreads;
    std::vector<int64_t> index(static_cast<size_t>(std::max<int64_t>(ndim - 1, 0)), 0);
    int64_t rem = begin;
    int64_t dst = 0, src = 0;
    for (int64_t d = ndim - 2; d >= 0; --d) {
      index[d] = rem % shape[d];
      rem /= shape[d];
      dst += index[d] * dst_strides[d];
      src += index[d] * src_strides[d];
    }
    for (int64_t r = begin; r < end; ++r) {
      row(dst, src, inner);
      for (int64_t d = ndim - 2; d >= 0; --d) {
        ++index[d];
        dst += dst_strides[d];
        src += src_strides[d];
        if (index[d] < shape[d]) break;
        dst -= index[d] * dst_strides[d];
        src -= index[d] * src_strides[d];
        index[d] = 0;
      }
    }
  }
}

// The element-wise helpers work on device tensors by staging through the host: a blocking copy
// (after the device has finished every op) of a contiguous tensor. They are for initialization,
// checkpoints and reports, not for the hot path, which uses device ops.
Tensor host_copy(const Tensor& t, const char* what) {
  STRATA_CHECK(t.defined()) << what << " on an undefined tensor";
  if (t.device().is_cpu()) return t;
  const Tensor c = t.contiguous();  // a strided device view is gathered on the device first
  Tensor h = Tensor::empty(c.shape(), c.dtype());
  copy_across_devices(h, c);
  return h;
}

void check_device_destination(const Tensor& t, const char* what) {
  STRATA_CHECK(t.is_contiguous()) << what << " into a strided device tensor " << t.str()
                                  << " is not supported";
}

}  // namespace

// ---- construction ------------------------------------------------------------------------------

Tensor::Tensor(std::shared_ptr<Storage> storage, int64_t offset, Shape shape, Shape strides,
               DType dtype)
    : storage_(std::move(storage)),
      offset_(offset),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      dtype_(dtype) {
  STRATA_CHECK_EQ(shape_.size(), strides_.size()) << "tensor shape and strides differ in rank";
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Allocator* alloc) {
  for (int64_t d : shape) {
    STRATA_CHECK_GE(d, 0) << "negative dimension in shape " << strata::shape_str(shape);
  }
  Allocator& a = alloc ? *alloc : default_cpu_allocator();
  const size_t nbytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  auto storage = std::make_shared<Storage>(a, nbytes);
  return Tensor(std::move(storage), 0, shape, contiguous_strides(shape), dtype);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Allocator* alloc) {
  Tensor t = empty(shape, dtype, alloc);
  t.zero_();
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Allocator* alloc) {
  Tensor t = empty(shape, dtype, alloc);
  t.fill_(value);
  return t;
}

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, Allocator* alloc) {
  STRATA_CHECK_EQ(static_cast<int64_t>(values.size()), shape_numel(shape))
      << "from_vector: " << values.size() << " values for shape " << strata::shape_str(shape);
  Tensor t = empty(shape, dtype_of<T>(), alloc);
  if (!t.device().is_cpu()) {
    t.copy_from(from_vector(values, shape));
    return t;
  }
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));
  return t;
}

template Tensor Tensor::from_vector<float>(const std::vector<float>&, const Shape&, Allocator*);
template Tensor Tensor::from_vector<double>(const std::vector<double>&, const Shape&, Allocator*);
template Tensor Tensor::from_vector<int32_t>(const std::vector<int32_t>&, const Shape&, Allocator*);
template Tensor Tensor::from_vector<int64_t>(const std::vector<int64_t>&, const Shape&, Allocator*);
template Tensor Tensor::from_vector<uint8_t>(const std::vector<uint8_t>&, const Shape&, Allocator*);
template Tensor Tensor::from_vector<Half>(const std::vector<Half>&, const Shape&, Allocator*);
template Tensor Tensor::from_vector<BFloat16>(const std::vector<BFloat16>&, const Shape&,
                                              Allocator*);

Tensor Tensor::empty_like() const { return empty(shape_, dtype_, &allocator()); }

Tensor Tensor::zeros_like() const { return zeros(shape_, dtype_, &allocator()); }

Device Tensor::device() const { return storage_ ? storage_->device() : Device::cpu(); }

Allocator& Tensor::allocator() const {
  STRATA_CHECK(defined()) << "allocator() on an undefined tensor";
  return storage_->allocator();
}

int64_t Tensor::wrap_dim(int64_t d, int64_t ndim) const {
  const int64_t w = d < 0 ? d + ndim : d;
  STRATA_CHECK(w >= 0 && w < ndim)
      << "dimension " << d << " out of range for a tensor of shape " << shape_str();
  return w;
}

int64_t Tensor::size(int64_t d) const { return shape_[static_cast<size_t>(wrap_dim(d, dim()))]; }

int64_t Tensor::stride(int64_t d) const {
  return strides_[static_cast<size_t>(wrap_dim(d, dim()))];
}

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // no element to be out of place
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (shape_[d] == 1) continue;
    if (strides_[d] != expected) return false;
    expected *= shape_[d];
  }
  return true;
}

void* Tensor::raw_data() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

// ---- views -------------------------------------------------------------------------------------

Tensor Tensor::view(const Shape& shape) const {
  STRATA_CHECK(defined()) << "view() on an undefined tensor";
  STRATA_CHECK(is_contiguous()) << "view" << strata::shape_str(shape)
                                << " needs a contiguous tensor, got strides "
                                << strata::shape_str(strides_) << " for shape " << shape_str()
                                << "; use reshape() to copy";
  Shape resolved = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < resolved.size(); ++i) {
    if (resolved[i] == -1) {
      STRATA_CHECK_EQ(infer, -1) << "view" << strata::shape_str(shape) << ": more than one -1";
      infer = static_cast<int64_t>(i);
    } else {
      STRATA_CHECK_GE(resolved[i], 0) << "view" << strata::shape_str(shape);
      known *= resolved[i];
    }
  }
  if (infer >= 0) {
    STRATA_CHECK(known != 0 && numel() % known == 0)
        << "view" << strata::shape_str(shape) << " does not fit " << numel() << " elements";
    resolved[static_cast<size_t>(infer)] = numel() / known;
  }
  STRATA_CHECK_EQ(shape_numel(resolved), numel())
      << "view" << strata::shape_str(shape) << " of a tensor of shape " << shape_str();
  return Tensor(storage_, offset_, resolved, contiguous_strides(resolved), dtype_);
}

Tensor Tensor::reshape(const Shape& shape) const {
  return is_contiguous() ? view(shape) : contiguous().view(shape);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  const int64_t s = wrap_dim(start_dim, dim());
  const int64_t e = wrap_dim(end_dim, dim());
  STRATA_CHECK_LE(s, e) << "flatten(" << start_dim << ", " << end_dim << ")";
  Shape out(shape_.begin(), shape_.begin() + s);
  int64_t n = 1;
  for (int64_t d = s; d <= e; ++d) n *= shape_[d];
  out.push_back(n);
  out.insert(out.end(), shape_.begin() + e + 1, shape_.end());
  return reshape(out);
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  const int64_t a = wrap_dim(dim0, dim());
  const int64_t b = wrap_dim(dim1, dim());
  Shape shape = shape_, strides = strides_;
  std::swap(shape[a], shape[b]);
  std::swap(strides[a], strides[b]);
  return Tensor(storage_, offset_, shape, strides, dtype_);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  STRATA_CHECK_EQ(static_cast<int64_t>(dims.size()), dim())
      << "permute needs one entry per dimension of " << shape_str();
  Shape shape(dims.size()), strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], dim());
    STRATA_CHECK(!seen[d]) << "permute: dimension " << d << " repeated";
    seen[d] = true;
    shape[i] = shape_[d];
    strides[i] = strides_[d];
  }
  return Tensor(storage_, offset_, shape, strides, dtype_);
}

Tensor Tensor::narrow(int64_t dim_, int64_t start, int64_t length) const {
  const int64_t d = wrap_dim(dim_, dim());
  STRATA_CHECK(start >= 0 && length >= 0 && start + length <= shape_[d])
      << "narrow(dim " << d << ", start " << start << ", length " << length << ") of shape "
      << shape_str();
  Shape shape = shape_;
  shape[d] = length;
  return Tensor(storage_, offset_ + start * strides_[d], shape, strides_, dtype_);
}

Tensor Tensor::select(int64_t dim_, int64_t index) const {
  const int64_t d = wrap_dim(dim_, dim());
  STRATA_CHECK(index >= 0 && index < shape_[d])
      << "select(dim " << d << ", index " << index << ") of shape " << shape_str();
  Shape shape = shape_, strides = strides_;
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return Tensor(storage_, offset_ + index * strides_[d], shape, strides, dtype_);
}

Tensor Tensor::unsqueeze(int64_t dim_) const {
  const int64_t d = wrap_dim(dim_, dim() + 1);
  Shape shape = shape_, strides = strides_;
  const int64_t stride = d < dim() ? strides_[d] * shape_[d] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  return Tensor(storage_, offset_, shape, strides, dtype_);
}

Tensor Tensor::squeeze(int64_t dim_) const {
  const int64_t d = wrap_dim(dim_, dim());
  STRATA_CHECK_EQ(shape_[d], 1) << "squeeze(" << d << ") of shape " << shape_str();
  Shape shape = shape_, strides = strides_;
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return Tensor(storage_, offset_, shape, strides, dtype_);
}

// ---- copies ------------------------------------------------------------------------------------

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  STRATA_CHECK(defined()) << "clone() on an undefined tensor";
  Tensor out = empty(shape_, dtype_, &allocator());
  if (device().is_cpu()) {
    out.copy_from(*this);
  } else if (is_contiguous()) {
    copy_across_devices(out, *this);
  } else {
    // A strided device view (a channels-last activation): gathered on the device, on the stream
    // of its memory.
    STRATA_CHECK(dim() <= 8) << "clone of a strided " << str() << " of more than 8 dimensions";
    const Shape dst_strides = contiguous_strides(shape_);
    cuda::copy_strided(out.raw_data(), dst_strides.data(), raw_data(), strides_.data(),
                       shape_.data(), static_cast<int>(dim()), element_size(), device().index,
                       allocator().stream());
  }
  return out;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  STRATA_CHECK(defined()) << "to(dtype) on an undefined tensor";
  Tensor out = empty(shape_, dtype, &allocator());
  out.copy_from(*this);
  return out;
}

void Tensor::copy_from(const Tensor& src) const {
  STRATA_CHECK(defined() && src.defined()) << "copy_from with an undefined tensor";
  STRATA_CHECK(shape_ == src.shape_)
      << "copy_from: shape " << src.shape_str() << " into shape " << shape_str();
  if (numel() == 0) return;
  if (!device().is_cpu() || !src.device().is_cpu()) {
    if (dtype_ == src.dtype_ && is_contiguous() && src.is_contiguous()) {
      copy_across_devices(*this, src);
      return;
    }
    // Convert (or gather a strided view) on the host, then copy.
    const Tensor h_src = host_copy(src, "copy_from");
    if (device().is_cpu()) {
      copy_from(h_src);
      return;
    }
    check_device_destination(*this, "copy_from");
    Tensor h_dst = Tensor::empty(shape_, dtype_);
    h_dst.copy_from(h_src);
    copy_across_devices(*this, h_dst);
    return;
  }
  if (dtype_ == src.dtype_ && is_contiguous() && src.is_contiguous()) {
    std::memmove(raw_data(), src.raw_data(), nbytes());
    return;
  }
  char* dst_base = static_cast<char*>(raw_data());
  const char* src_base = static_cast<const char*>(src.raw_data());
  const Shape& dst_strides = strides_;
  const Shape& src_strides = src.strides_;
  dispatch_dtype(dtype_, [&](auto dst_tag) {
    using Dst = decltype(dst_tag);
    dispatch_dtype(src.dtype_, [&](auto src_tag) {
      using Src = decltype(src_tag);
      Dst* d = reinterpret_cast<Dst*>(dst_base);
      const Src* s = reinterpret_cast<const Src*>(src_base);
      const int64_t ds = dst_strides.empty() ? 1 : dst_strides.back();
      const int64_t ss = src_strides.empty() ? 1 : src_strides.back();
      for_each_row(shape_, dst_strides, src_strides, [&](int64_t doff, int64_t soff, int64_t n) {
        for (int64_t i = 0; i < n; ++i) d[doff + i * ds] = convert_element<Dst>(s[soff + i * ss]);
      });
    });
  });
}

void Tensor::fill_(double value) const {
  STRATA_CHECK(defined()) << "fill_ on an undefined tensor";
  if (!device().is_cpu()) {
    check_device_destination(*this, "fill_");
    if (value == 0.0) {
      cuda::memset_blocking(raw_data(), 0, nbytes(), device(), allocator().stream());
      return;
    }
    Tensor h = Tensor::empty(shape_, dtype_);
    h.fill_(value);
    copy_across_devices(*this, h);
    return;
  }
  char* base = static_cast<char*>(raw_data());
  dispatch_dtype(dtype_, [&](auto tag) {
    using T = decltype(tag);
    const T v = store_from_double<T>(value);
    T* p = reinterpret_cast<T*>(base);
    const int64_t st = strides_.empty() ? 1 : strides_.back();
    for_each_row(shape_, strides_, strides_, [&](int64_t off, int64_t, int64_t n) {
      for (int64_t i = 0; i < n; ++i) p[off + i * st] = v;
    });
  });
}

void Tensor::zero_() const {
  if (defined() && is_contiguous() && device().is_cpu()) {
    std::memset(raw_data(), 0, nbytes());
    return;
  }
  fill_(0.0);
}

template <typename T>
T Tensor::item() const {
  STRATA_CHECK_EQ(numel(), 1) << "item() of a tensor of shape " << shape_str();
  return to_vector<T>()[0];
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  STRATA_CHECK(defined()) << "to_vector on an undefined tensor";
  Tensor c = Tensor::empty(shape_, dtype_of<T>());
  c.copy_from(*this);
  const T* p = c.data<T>();
  return std::vector<T>(p, p + numel());
}

#define STRATA_INSTANTIATE_ACCESSORS(T) \
  template T Tensor::item<T>() const;   \
  template std::vector<T> Tensor::to_vector<T>() const;
STRATA_INSTANTIATE_ACCESSORS(float)
STRATA_INSTANTIATE_ACCESSORS(double)
STRATA_INSTANTIATE_ACCESSORS(int32_t)
STRATA_INSTANTIATE_ACCESSORS(int64_t)
STRATA_INSTANTIATE_ACCESSORS(uint8_t)
#undef STRATA_INSTANTIATE_ACCESSORS

std::string Tensor::str() const {
  if (!defined()) return "undefined tensor";
  std::ostringstream s;
  s << dtype_name(dtype_) << " " << device().str() << " " << shape_str();
  return s.str();
}

void copy_across_devices(const Tensor& dst, const Tensor& src) {
  STRATA_CHECK(dst.defined() && src.defined()) << "copy_across_devices: undefined tensor";
  STRATA_CHECK(dst.shape() == src.shape() && dst.dtype() == src.dtype())
      << "copy_across_devices: " << src.str() << " into " << dst.str();
  STRATA_CHECK(dst.is_contiguous() && src.is_contiguous())
      << "copy_across_devices needs contiguous tensors (" << src.str() << " -> " << dst.str()
      << ")";
  if (dst.device().is_cpu() && src.device().is_cpu()) {
    std::memmove(dst.raw_data(), src.raw_data(), src.nbytes());
    return;
  }
  cuda::memcpy_blocking(dst.raw_data(), dst.device(), dst.allocator().stream(), src.raw_data(),
                        src.device(), src.allocator().stream(), src.nbytes());
}

void copy_across_devices_async(const Tensor& dst, const Tensor& src) {
  if (dst.defined() && src.defined() && (dst.device().is_cuda() || src.device().is_cuda()) &&
      dst.shape() == src.shape() && dst.dtype() == src.dtype() && dst.is_contiguous() &&
      src.is_contiguous()) {
    cuda::memcpy_ordered(dst.raw_data(), dst.device(), dst.allocator().stream(), src.raw_data(),
                         src.device(), src.allocator().stream(), src.nbytes());
    return;
  }
  copy_across_devices(dst, src);  // host to host, or the checks and their errors
}

Tensor to_allocator(const Tensor& src, Allocator& alloc) {
  Tensor c = src.contiguous();  // a strided device view is gathered on its device first
  Tensor out = Tensor::empty(c.shape(), c.dtype(), &alloc);
  copy_across_devices(out, c);
  return out;
}

}  // namespace strata
