// Winograd F(4x4, 3x3) for float32 3x3 stride-1 convolutions; see ops/conv2d_winograd_cpu.h.
//
// Layouts (T tiles of a chunk of nb images, tile t = image tpi + tile row ntx + tile column; a
// block of kb output channels starting at ob):
//   V  (36, C, T)   transformed input tiles   U, dU (36, kb, C)  transformed kernels of a block
//   dM (36, OC, T)  transformed dy tiles      M     (36, kb, T)  a block's products
// Kernels are transformed block by block, so the scratch stays within a few MiB however many
// channels there are; with several chunks of images they are transformed once per call when all
// blocks fit kResidentKernelBytes, else again for each chunk.
// The transforms work on kLanes tiles (or kernels) at once: a scalar gather into a
// (rows, cols, kLanes) block, then the two 1-D passes of P . P^T on whole lanes, whose loops the
// compiler unrolls and folds the constant coefficients of (zeros skipped, ones and minus ones
// free). The loops over planes are compiled for AVX-512, AVX2 and the baseline, chosen at run
// time (target_clones), so a portable build still runs the lanes in vector registers.
//
// Threads: the transforms split (channel, image) planes, so each thread owns whole planes of x,
// y and dx (the overlapping input tiles of the dx scatter never race); the 36 products of a
// chunk are split over threads, one single-threaded gemm each (blas::gemm runs on one thread
// inside a parallel region).
#include "ops/conv2d_winograd_cpu.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "ops/blas.h"
#include "ops/cpu_util.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    !defined(STRATA_NO_TARGET_CLONES)
#define STRATA_MULTIVERSION \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define STRATA_MULTIVERSION
#endif

namespace strata::ops::cpu::winograd {
namespace {

constexpr int kLanes = 16;
constexpr int kXi = 36;  // 6 x 6 transformed tile entries
// Fewer channels than this on either side (the 3-channel first layer of an image model): the
// transforms cost more than the products they save; im2col keeps such convolutions.
constexpr int64_t kMinChannels = 16;
// Output planes narrower or shorter than a tile (VGG's 2 x 2 at 32 px) waste most of it: im2col
// was 3-4x faster there (tools/bench/op_bench.cpp, conv_vgg_512_2px).
constexpr int64_t kMinOutputSide = 4;
// Upper bound on a chunk's transformed tiles (V and M, or V and dM): measured on the 2-core EPYC
// for ResNet-18 / VGG shapes at 32 px, larger chunks gain nothing once the products run on
// hundreds of tiles, and smaller ones keep V in the caches between its transform and its gemm.
constexpr int64_t kChunkBudgetBytes = int64_t{6} << 20;
// Upper bound on one block of transformed kernels (see channels_per_block).
constexpr int64_t kKernelBudgetBytes = int64_t{4} << 20;
// With several chunks of images, the kernels of all blocks are transformed once per call (and
// the backward's dU summed over the chunks, then transformed once) when they fit this bound:
// transforming them per chunk cost as much as the input transform at 16 x 16 and 8 x 8 planes
// (ResNet-18's layer2 and layer3 at 32 px, 4 and 2 chunks).
constexpr int64_t kResidentKernelBytes = int64_t{16} << 20;

template <int O, int I>
struct Mat {
  float v[O][I];
};

template <int O, int I>
constexpr Mat<I, O> transposed(const Mat<O, I>& m) {
  Mat<I, O> t{};
  for (int i = 0; i < O; ++i) {
    for (int j = 0; j < I; ++j) t.v[j][i] = m.v[i][j];
  }
  return t;
}

// Lavin and Gray's F(4x4, 3x3) with interpolation points 0, +-1, +-2 and infinity.
constexpr Mat<6, 6> kBT = {{{4, 0, -5, 0, 1, 0},
                            {0, -4, -4, 1, 1, 0},
                            {0, 4, -4, -1, 1, 0},
                            {0, -2, -1, 2, 1, 0},
                            {0, 2, -1, -2, 1, 0},
                            {0, 4, 0, -5, 0, 1}}};
constexpr Mat<6, 3> kG = {{{1.0f / 4, 0, 0},
                           {-1.0f / 6, -1.0f / 6, -1.0f / 6},
                           {-1.0f / 6, 1.0f / 6, -1.0f / 6},
                           {1.0f / 24, 1.0f / 12, 1.0f / 6},
                           {1.0f / 24, -1.0f / 12, 1.0f / 6},
                           {0, 0, 1}}};
constexpr Mat<4, 6> kAT = {{{1, 1, 1, 1, 1, 0},  //
                            {0, 1, -1, 2, -2, 0},
                            {0, 1, 1, 4, 4, 0},
                            {0, 1, -1, 8, -8, 1}}};
constexpr Mat<6, 6> kB = transposed(kBT);
constexpr Mat<3, 6> kGT = transposed(kG);
constexpr Mat<6, 4> kA = transposed(kAT);

// out (O, O, kLanes) = P in P^T for in (I, I, kLanes).
template <int O, int I, const Mat<O, I>& P>
__attribute__((always_inline)) inline void transform(const float* in, float* out) {
  float tmp[O * I * kLanes];
#pragma GCC unroll 8
  for (int i = 0; i < O; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < I; ++j) {
      float* t = tmp + (i * I + j) * kLanes;
      bool first = true;
#pragma GCC unroll 8
      for (int r = 0; r < I; ++r) {
        const float c = P.v[i][r];
        if (c == 0.0f) continue;
        const float* src = in + (r * I + j) * kLanes;
        if (first) {
          for (int l = 0; l < kLanes; ++l) t[l] = c * src[l];
        } else {
          for (int l = 0; l < kLanes; ++l) t[l] += c * src[l];
        }
        first = false;
      }
      if (first) std::fill(t, t + kLanes, 0.0f);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < O; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < O; ++j) {
      float* o = out + (i * O + j) * kLanes;
      bool first = true;
#pragma GCC unroll 8
      for (int s = 0; s < I; ++s) {
        const float c = P.v[j][s];
        if (c == 0.0f) continue;
        const float* src = tmp + (i * I + s) * kLanes;
        if (first) {
          for (int l = 0; l < kLanes; ++l) o[l] = c * src[l];
        } else {
          for (int l = 0; l < kLanes; ++l) o[l] += c * src[l];
        }
        first = false;
      }
      if (first) std::fill(o, o + kLanes, 0.0f);
    }
  }
}

// dst[0, n) = src[0, n) for n <= kLanes; a full group copies with a fixed size (inline vector
// moves, not a library call per group).
__attribute__((always_inline)) inline void copy_lanes(float* dst, const float* src, int n) {
  if (n == kLanes) {
    std::memcpy(dst, src, kLanes * sizeof(float));
  } else {
    for (int l = 0; l < n; ++l) dst[l] = src[l];
  }
}

struct Geo {
  int64_t batch, c, h, w, oc, oh, ow, ph, pw;
  int64_t nty, ntx, tpi;  // tile rows, tile columns, tiles per image
};

Geo geometry(const Tensor& x, const Tensor& weight, const Conv2dParams& p) {
  Geo g;
  g.batch = x.size(0);
  g.c = x.size(1);
  g.h = x.size(2);
  g.w = x.size(3);
  g.oc = weight.size(0);
  g.ph = p.pad_h;
  g.pw = p.pad_w;
  g.oh = g.h + 2 * g.ph - 2;
  g.ow = g.w + 2 * g.pw - 2;
  g.nty = (g.oh + 3) / 4;
  g.ntx = (g.ow + 3) / 4;
  g.tpi = g.nty * g.ntx;
  return g;
}

// Output channels per block: the block's transformed kernels (36 kb C) within
// kKernelBudgetBytes, blocks of even size. The products run block by block, so U never holds the
// whole layer's 36 OC C (75 MiB at 512 channels, and fresh pages on every call).
int64_t channels_per_block(const Geo& g) {
  const int64_t per_channel = kXi * g.c * int64_t{sizeof(float)};
  const int64_t fit = std::clamp<int64_t>(kKernelBudgetBytes / per_channel, 1, g.oc);
  const int64_t blocks = (g.oc + fit - 1) / fit;
  return (g.oc + blocks - 1) / blocks;
}

// Whether the kernels of all blocks stay transformed for the whole call (kResidentKernelBytes);
// with one chunk, block by block needs less memory for the same work.
bool kernels_resident(const Geo& g, int64_t nb_max) {
  return nb_max < g.batch && kXi * g.oc * g.c * int64_t{sizeof(float)} <= kResidentKernelBytes;
}

// Images per chunk: a chunk's V and products (M of one block, or all of dM) within
// kChunkBudgetBytes, spread evenly.
int64_t images_per_chunk(const Geo& g, int64_t product_rows) {
  const int64_t per_image = kXi * (g.c + product_rows) * g.tpi * int64_t{sizeof(float)};
  const int64_t fit = std::clamp<int64_t>(kChunkBudgetBytes / per_image, 1, g.batch);
  const int64_t chunks = (g.batch + fit - 1) / fit;
  return (g.batch + chunks - 1) / chunks;
}

// Tiles are walked in (channel, image, tile row, tile column) order over a range [q0, q1) of
// planes numbered q = channel nb + image (nb images in the chunk), and transformed kLanes at a
// time. In this order the tiles of one channel are consecutive columns (image tpi + tile) of the
// transformed layouts, so a group of lanes reads or writes them in contiguous runs whatever the
// plane size; a group may span images, so that planes of fewer tiles than lanes (8 x 8 and 4 x 4
// outputs: 4 and 1 tile) still fill every lane (the transform costs the same for 1 lane as for
// 16).
struct TileCursor {
  int64_t nb, tpi, nty, ntx;
  int64_t ch, i, ty = 0, tx = 0;
  TileCursor(const Geo& g, int64_t images, int64_t q)
      : nb(images), tpi(g.tpi), nty(g.nty), ntx(g.ntx), ch(q / images), i(q % images) {}
  void next() {
    if (++tx < ntx) return;
    tx = 0;
    if (++ty < nty) return;
    ty = 0;
    if (++i < nb) return;
    i = 0;
    ++ch;
  }
};

// One lane of a group: its plane (channel ch, image i; q = ch nb + i) and tile (row ty, column
// tx; column j = i tpi + ty ntx + tx of the transformed layouts).
struct Lane {
  int64_t ch, i, ty, tx, j, q;
};

// Fills lanes[0, n) from the cursor (advancing it); returns whether the n tiles are of one
// channel (then their columns j are consecutive).
inline bool next_lanes(TileCursor& cur, int n, Lane* lanes) {
  for (int l = 0; l < n; ++l) {
    lanes[l] = {cur.ch,
                cur.i,
                cur.ty,
                cur.tx,
                cur.i * cur.tpi + cur.ty * cur.ntx + cur.tx,
                cur.ch * cur.nb + cur.i};
    cur.next();
  }
  return lanes[0].ch == lanes[n - 1].ch;
}

// out[xi kLanes + l] -> dst[xi xi_stride + ch_l ld_t + j_l] for the n lanes; one contiguous copy
// per xi when the lanes are of one channel. The xi loop is outside: the 36 rows of a layout are
// xi_stride apart (often a multiple of 4 KiB, so they share cache sets), and each is finished
// before the next.
__attribute__((always_inline)) inline void store_lanes(const Lane* lanes, int n, bool contiguous,
                                                       const float* out, float* dst, int64_t ld_t,
                                                       int64_t xi_stride) {
  if (contiguous) {
    float* base = dst + lanes[0].ch * ld_t + lanes[0].j;
    for (int xi = 0; xi < kXi; ++xi) copy_lanes(base + xi * xi_stride, out + xi * kLanes, n);
    return;
  }
  for (int xi = 0; xi < kXi; ++xi) {
    float* row = dst + xi * xi_stride;
    for (int l = 0; l < n; ++l) row[lanes[l].ch * ld_t + lanes[l].j] = out[xi * kLanes + l];
  }
}

// The inverse gather: in[xi kLanes + l] = src[xi xi_stride + ch_l ld_t + j_l].
__attribute__((always_inline)) inline void load_lanes(const Lane* lanes, int n, bool contiguous,
                                                      const float* src, float* in, int64_t ld_t,
                                                      int64_t xi_stride) {
  if (contiguous) {
    const float* base = src + lanes[0].ch * ld_t + lanes[0].j;
    for (int xi = 0; xi < kXi; ++xi) copy_lanes(in + xi * kLanes, base + xi * xi_stride, n);
    return;
  }
  for (int xi = 0; xi < kXi; ++xi) {
    const float* row = src + xi * xi_stride;
    for (int l = 0; l < n; ++l) in[xi * kLanes + l] = row[lanes[l].ch * ld_t + lanes[l].j];
  }
}

// Zero-padded copies of the planes a group of lanes reads, so that every tile is gathered
// without bounds checks: plane q sits in slot q % slots, padded to (4 nty + 2) x (4 ntx + 2)
// (the padding of the convolution on the top and left, zeros past the input on the bottom and
// right). The slots outnumber the planes one group can touch, so a group never evicts its own
// planes, and a plane is copied once however many groups read it.
class PaddedPlanes {
 public:
  explicit PaddedPlanes(const Geo& g)
      : g_(g),
        rows_(4 * g.nty + 2),
        cols_(4 * g.ntx + 2),
        slots_(std::min<int64_t>(kLanes, (kLanes - 1 + g.tpi - 1) / g.tpi + 2)),
        data_(slots_ * rows_ * cols_),
        tags_(slots_, -1) {}

  int64_t cols() const { return cols_; }

  // The padded copy of plane q (at src), made if its slot holds another plane.
  const float* plane(int64_t q, const float* src) {
    const int64_t slot = q % slots_;
    float* dst = data_.data() + slot * rows_ * cols_;
    if (tags_[slot] == q) return dst;
    tags_[slot] = q;
    const int64_t copied = std::min(g_.w, cols_ - g_.pw);
    for (int64_t r = 0; r < rows_; ++r) {
      float* row = dst + r * cols_;
      const int64_t ih = r - g_.ph;
      if (ih < 0 || ih >= g_.h) {
        std::fill(row, row + cols_, 0.0f);
        continue;
      }
      std::fill(row, row + g_.pw, 0.0f);
      std::copy(src + ih * g_.w, src + ih * g_.w + copied, row + g_.pw);
      std::fill(row + g_.pw + copied, row + cols_, 0.0f);
    }
    return dst;
  }

 private:
  const Geo& g_;
  int64_t rows_, cols_, slots_;
  std::vector<float> data_;
  std::vector<int64_t> tags_;
};

// V[xi, ch, j] for the tiles of planes [q0, q1) of a chunk of nb images starting at x.
STRATA_MULTIVERSION
void input_transform(const Geo& g, const float* x, int64_t ld_t, float* v, int64_t q0, int64_t q1) {
  alignas(64) float in[kXi * kLanes];
  alignas(64) float out[kXi * kLanes];
  Lane lanes[kLanes];
  PaddedPlanes padded(g);
  const int64_t ld = padded.cols();
  TileCursor cur(g, ld_t / g.tpi, q0);
  for (int64_t left = (q1 - q0) * g.tpi; left > 0; left -= kLanes) {
    const int n = static_cast<int>(std::min<int64_t>(kLanes, left));
    const bool contiguous = next_lanes(cur, n, lanes);
    if (n < kLanes) std::fill(in, in + kXi * kLanes, 0.0f);
    for (int l = 0; l < n; ++l) {
      const Lane& t = lanes[l];
      const float* plane = padded.plane(t.q, x + (t.i * g.c + t.ch) * g.h * g.w);
      const float* corner = plane + 4 * t.ty * ld + 4 * t.tx;
      for (int r = 0; r < 6; ++r) {
        for (int s = 0; s < 6; ++s) in[(r * 6 + s) * kLanes + l] = corner[r * ld + s];
      }
    }
    transform<6, 6, kBT>(in, out);
    store_lanes(lanes, n, contiguous, out, v, ld_t, g.c * ld_t);
  }
}

// y planes of the output channels [ob, ob + kb) (planes [q0, q1), q = (channel - ob) nb +
// image) from M[xi, o - ob, j] (M of the block: xi stride kb ld_t), plus bias.
STRATA_MULTIVERSION
void output_transform(const Geo& g, const float* m, int64_t ld_t, int64_t ob, int64_t kb,
                      const float* bias, float* y, int64_t q0, int64_t q1) {
  alignas(64) float in[kXi * kLanes];
  alignas(64) float out[16 * kLanes];
  Lane lanes[kLanes];
  TileCursor cur(g, ld_t / g.tpi, q0);
  for (int64_t left = (q1 - q0) * g.tpi; left > 0; left -= kLanes) {
    const int n = static_cast<int>(std::min<int64_t>(kLanes, left));
    const bool contiguous = next_lanes(cur, n, lanes);
    if (n < kLanes) std::fill(in, in + kXi * kLanes, 0.0f);
    load_lanes(lanes, n, contiguous, m, in, ld_t, kb * ld_t);
    transform<4, 6, kAT>(in, out);
    for (int l = 0; l < n; ++l) {
      const Lane& t = lanes[l];
      const float b = bias != nullptr ? bias[ob + t.ch] : 0.0f;
      float* corner = y + (t.i * g.oc + ob + t.ch) * g.oh * g.ow + 4 * t.ty * g.ow + 4 * t.tx;
      const int rows = static_cast<int>(std::min<int64_t>(4, g.oh - 4 * t.ty));
      const int cols = static_cast<int>(std::min<int64_t>(4, g.ow - 4 * t.tx));
      if (rows == 4 && cols == 4) {
        for (int r = 0; r < 4; ++r) {
          for (int s = 0; s < 4; ++s) corner[r * g.ow + s] = out[(r * 4 + s) * kLanes + l] + b;
        }
        continue;
      }
      for (int r = 0; r < rows; ++r) {
        for (int s = 0; s < cols; ++s) corner[r * g.ow + s] = out[(r * 4 + s) * kLanes + l] + b;
      }
    }
  }
}

// dM[xi, o, j] = (AT^T dY AT)[xi] for the dy planes [q0, q1) (q = channel nb + image).
STRATA_MULTIVERSION
void output_grad_transform(const Geo& g, const float* dy, int64_t ld_t, float* dm, int64_t q0,
                           int64_t q1) {
  alignas(64) float in[16 * kLanes];
  alignas(64) float out[kXi * kLanes];
  Lane lanes[kLanes];
  TileCursor cur(g, ld_t / g.tpi, q0);
  for (int64_t left = (q1 - q0) * g.tpi; left > 0; left -= kLanes) {
    const int n = static_cast<int>(std::min<int64_t>(kLanes, left));
    const bool contiguous = next_lanes(cur, n, lanes);
    if (n < kLanes) std::fill(in, in + 16 * kLanes, 0.0f);
    for (int l = 0; l < n; ++l) {
      const Lane& t = lanes[l];
      const float* corner = dy + (t.i * g.oc + t.ch) * g.oh * g.ow + 4 * t.ty * g.ow + 4 * t.tx;
      const int rows = static_cast<int>(std::min<int64_t>(4, g.oh - 4 * t.ty));
      const int cols = static_cast<int>(std::min<int64_t>(4, g.ow - 4 * t.tx));
      if (rows == 4 && cols == 4) {
        for (int r = 0; r < 4; ++r) {
          for (int s = 0; s < 4; ++s) in[(r * 4 + s) * kLanes + l] = corner[r * g.ow + s];
        }
        continue;
      }
      for (int r = 0; r < 4; ++r) {
        for (int s = 0; s < 4; ++s) {
          in[(r * 4 + s) * kLanes + l] = r < rows && s < cols ? corner[r * g.ow + s] : 0.0f;
        }
      }
    }
    transform<6, 4, kA>(in, out);
    store_lanes(lanes, n, contiguous, out, dm, ld_t, g.oc * ld_t);
  }
}

// dx planes [q0, q1) (q = channel nb + image) = the scatter of (BT^T dV BT) over the input tiles;
// the planes are overwritten (each zeroed when the walk reaches it, while it is in cache).
STRATA_MULTIVERSION
void input_grad_transform(const Geo& g, const float* dv, int64_t ld_t, float* dx, int64_t q0,
                          int64_t q1) {
  alignas(64) float in[kXi * kLanes];
  alignas(64) float out[kXi * kLanes];
  Lane lanes[kLanes];
  const int64_t nb = ld_t / g.tpi, plane_size = g.h * g.w;
  auto plane_of = [&](int64_t q) { return dx + ((q % nb) * g.c + q / nb) * plane_size; };
  int64_t zeroed = q0;  // planes [q0, zeroed) are zeroed
  TileCursor cur(g, nb, q0);
  for (int64_t left = (q1 - q0) * g.tpi; left > 0; left -= kLanes) {
    const int n = static_cast<int>(std::min<int64_t>(kLanes, left));
    const bool contiguous = next_lanes(cur, n, lanes);
    for (; zeroed <= lanes[n - 1].q; ++zeroed) {
      float* plane = plane_of(zeroed);
      std::fill(plane, plane + plane_size, 0.0f);
    }
    if (n < kLanes) std::fill(in, in + kXi * kLanes, 0.0f);
    load_lanes(lanes, n, contiguous, dv, in, ld_t, g.c * ld_t);
    transform<6, 6, kB>(in, out);
    for (int l = 0; l < n; ++l) {
      const Lane& t = lanes[l];
      float* plane = dx + (t.i * g.c + t.ch) * plane_size;
      const int64_t r0 = 4 * t.ty - g.ph, s0 = 4 * t.tx - g.pw;
      if (r0 >= 0 && s0 >= 0 && r0 + 6 <= g.h && s0 + 6 <= g.w) {  // interior: no checks
        float* corner = plane + r0 * g.w + s0;
        for (int r = 0; r < 6; ++r) {
          for (int s = 0; s < 6; ++s) corner[r * g.w + s] += out[(r * 6 + s) * kLanes + l];
        }
        continue;
      }
      const int r_lo = static_cast<int>(std::max<int64_t>(0, -r0));
      const int r_hi = static_cast<int>(std::min<int64_t>(6, g.h - r0));
      const int s_lo = static_cast<int>(std::max<int64_t>(0, -s0));
      const int s_hi = static_cast<int>(std::min<int64_t>(6, g.w - s0));
      for (int r = r_lo; r < r_hi; ++r) {
        float* row = plane + (r0 + r) * g.w + s0;
        for (int s = s_lo; s < s_hi; ++s) row[s] += out[(r * 6 + s) * kLanes + l];
      }
    }
  }
}

// U[xi, o - ob, ch] = (G g G^T)[xi] for output channels [o0, o1) of the block starting at ob
// (U of the block: xi stride ld_xi).
STRATA_MULTIVERSION
void kernel_transform(const Geo& g, const float* w, int64_t ob, int64_t ld_xi, float* u, int64_t o0,
                      int64_t o1) {
  alignas(64) float in[9 * kLanes];
  alignas(64) float out[kXi * kLanes];
  for (int64_t o = o0; o < o1; ++o) {
    for (int64_t c0 = 0; c0 < g.c; c0 += kLanes) {
      const int n = static_cast<int>(std::min<int64_t>(kLanes, g.c - c0));
      if (n < kLanes) std::fill(in, in + 9 * kLanes, 0.0f);
      for (int l = 0; l < n; ++l) {
        const float* k = w + (o * g.c + c0 + l) * 9;
        for (int q = 0; q < 9; ++q) in[q * kLanes + l] = k[q];
      }
      transform<6, 3, kG>(in, out);
      float* dst = u + (o - ob) * g.c + c0;
      for (int xi = 0; xi < kXi; ++xi) copy_lanes(dst + xi * ld_xi, out + xi * kLanes, n);
    }
  }
}

// dweight[o, ch] += (G^T dU G) for output channels [o0, o1) from dU[xi, o - ob, ch] (xi stride
// ld_xi).
STRATA_MULTIVERSION
void kernel_grad_transform(const Geo& g, const float* du, int64_t ob, int64_t ld_xi, float* dw,
                           int64_t o0, int64_t o1) {
  alignas(64) float in[kXi * kLanes];
  alignas(64) float out[9 * kLanes];
  for (int64_t o = o0; o < o1; ++o) {
    for (int64_t c0 = 0; c0 < g.c; c0 += kLanes) {
      const int n = static_cast<int>(std::min<int64_t>(kLanes, g.c - c0));
      if (n < kLanes) std::fill(in, in + kXi * kLanes, 0.0f);
      const float* src = du + (o - ob) * g.c + c0;
      for (int xi = 0; xi < kXi; ++xi) copy_lanes(in + xi * kLanes, src + xi * ld_xi, n);
      transform<3, 6, kGT>(in, out);
      for (int l = 0; l < n; ++l) {
        float* k = dw + (o * g.c + c0 + l) * 9;
        for (int q = 0; q < 9; ++q) k[q] += out[q * kLanes + l];
      }
    }
  }
}

Tensor scratch(ExecContext& ctx, int64_t elements) {
  return Tensor::empty({elements}, DType::kF32, &ctx.allocator());
}

// The 36 products of a chunk, split over threads, one single-threaded gemm each.
template <typename F>
void for_each_xi(F&& product) {
  detail::parallel_for(kXi, 1, [&](int64_t x0, int64_t x1) {
    for (int64_t xi = x0; xi < x1; ++xi) product(xi);
  });
}

}  // namespace

bool takes(const Tensor& x, const Tensor& weight, const Conv2dParams& p) {
  return x.dtype() == DType::kF32 && weight.size(2) == 3 && weight.size(3) == 3 &&
         p.stride_h == 1 && p.stride_w == 1 && p.dilation_h == 1 && p.dilation_w == 1 &&
         p.groups == 1 && p.pad_h <= 2 && p.pad_w <= 2 && x.size(1) >= kMinChannels &&
         weight.size(0) >= kMinChannels && x.size(2) + 2 * p.pad_h - 2 >= kMinOutputSide &&
         x.size(3) + 2 * p.pad_w - 2 >= kMinOutputSide;
}

void forward(ExecContext& ctx, const Tensor& x, const Tensor& weight, const float* bias,
             const Conv2dParams& p, Tensor& y) {
  const Geo g = geometry(x, weight, p);
  const int64_t kb_max = channels_per_block(g);
  const int64_t nb_max = images_per_chunk(g, kb_max);
  const int64_t t_max = nb_max * g.tpi;
  const bool resident = kernels_resident(g, nb_max);
  // U (of a block, or all blocks when resident), V of a chunk, M of a block and chunk.
  const int64_t u_elems = kXi * (resident ? g.oc : kb_max) * g.c;
  Tensor buffer = scratch(ctx, u_elems + kXi * (g.c + kb_max) * t_max);
  float* u = buffer.data<float>();
  float* v = u + u_elems;
  float* m = v + kXi * g.c * t_max;
  const float* pw = weight.data<float>();
  const float* px = x.data<float>();
  float* py = y.data<float>();
  // The U of the block at ob: transformed here unless all blocks were transformed up front.
  auto block_kernels = [&](int64_t ob, int64_t kb, bool transform_now) {
    float* ub = resident ? u + kXi * ob * g.c : u;
    if (transform_now) {
      detail::parallel_for(kb, 1, [&](int64_t o0, int64_t o1) {
        kernel_transform(g, pw, ob, kb * g.c, ub, ob + o0, ob + o1);
      });
    }
    return ub;
  };
  if (resident) {
    for (int64_t ob = 0; ob < g.oc; ob += kb_max)
      block_kernels(ob, std::min(kb_max, g.oc - ob), true);
  }
  for (int64_t b0 = 0; b0 < g.batch; b0 += nb_max) {
    const int64_t nb = std::min(nb_max, g.batch - b0);
    const int64_t ld_t = nb * g.tpi;
    const float* xb = px + b0 * g.c * g.h * g.w;
    detail::parallel_for(nb * g.c, 1,
                         [&](int64_t p0, int64_t p1) { input_transform(g, xb, ld_t, v, p0, p1); });
    float* yb = py + b0 * g.oc * g.oh * g.ow;
    for (int64_t ob = 0; ob < g.oc; ob += kb_max) {
      const int64_t kb = std::min(kb_max, g.oc - ob);
      const float* ub = block_kernels(ob, kb, !resident);
      for_each_xi([&](int64_t xi) {
        blas::gemm(ctx, false, false, kb, ld_t, g.c, 1.0f, ub + xi * kb * g.c, g.c,
                   v + xi * g.c * ld_t, ld_t, 0.0f, m + xi * kb * ld_t, ld_t);
      });
      detail::parallel_for(nb * kb, 1, [&](int64_t p0, int64_t p1) {
        output_transform(g, m, ld_t, ob, kb, bias, yb, p0, p1);
      });
    }
  }
}

void backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& weight,
              const Conv2dParams& p, float* dweight, float* dx) {
  if (dweight == nullptr && dx == nullptr) return;
  const Geo g = geometry(x, weight, p);
  const int64_t kb_max = channels_per_block(g);
  const int64_t nb_max = images_per_chunk(g, g.oc);
  const int64_t t_max = nb_max * g.tpi;
  const bool resident = kernels_resident(g, nb_max);
  // U of a block (all of U when resident, and then dU of all blocks too, summed over the chunks),
  // or U / dU of a block; then V / dV and dM of a chunk.
  const int64_t u_elems = kXi * (resident ? g.oc : kb_max) * g.c;
  const int64_t du_elems = resident && dweight != nullptr ? u_elems : 0;
  Tensor buffer = scratch(ctx, u_elems + du_elems + kXi * (g.c + g.oc) * t_max);
  float* u = buffer.data<float>();
  float* du_all = u + u_elems;
  float* v = du_all + du_elems;
  float* dm = v + kXi * g.c * t_max;
  const float* pw = weight.data<float>();
  const float* px = x.data<float>();
  const float* pdy = dy.data<float>();
  auto transform_kernels = [&](int64_t ob, int64_t kb, float* ub) {
    detail::parallel_for(kb, 1, [&](int64_t o0, int64_t o1) {
      kernel_transform(g, pw, ob, kb * g.c, ub, ob + o0, ob + o1);
    });
  };
  auto add_kernel_grads = [&](int64_t ob, int64_t kb, const float* dub) {
    detail::parallel_for(kb, 1, [&](int64_t o0, int64_t o1) {
      kernel_grad_transform(g, dub, ob, kb * g.c, dweight, ob + o0, ob + o1);
    });
  };
  if (resident && dx != nullptr) {
    for (int64_t ob = 0; ob < g.oc; ob += kb_max) {
      transform_kernels(ob, std::min(kb_max, g.oc - ob), u + kXi * ob * g.c);
    }
  }
  for (int64_t b0 = 0; b0 < g.batch; b0 += nb_max) {
    const int64_t nb = std::min(nb_max, g.batch - b0);
    const int64_t ld_t = nb * g.tpi;
    const float* dyb = pdy + b0 * g.oc * g.oh * g.ow;
    detail::parallel_for(nb * g.oc, 1, [&](int64_t p0, int64_t p1) {
      output_grad_transform(g, dyb, ld_t, dm, p0, p1);
    });
    if (dweight != nullptr) {
      // dU of each block: summed over the chunks when resident (transformed into dweight after
      // the last), else added into dweight for this chunk at once (G^T . G is linear).
      const float* xb = px + b0 * g.c * g.h * g.w;
      detail::parallel_for(
          nb * g.c, 1, [&](int64_t p0, int64_t p1) { input_transform(g, xb, ld_t, v, p0, p1); });
      for (int64_t ob = 0; ob < g.oc; ob += kb_max) {
        const int64_t kb = std::min(kb_max, g.oc - ob);
        float* dub = resident ? du_all + kXi * ob * g.c : u;
        const float beta = resident && b0 > 0 ? 1.0f : 0.0f;
        for_each_xi([&](int64_t xi) {
          blas::gemm(ctx, false, true, kb, g.c, ld_t, 1.0f, dm + (xi * g.oc + ob) * ld_t, ld_t,
                     v + xi * g.c * ld_t, ld_t, beta, dub + xi * kb * g.c, g.c);
        });
        if (!resident) add_kernel_grads(ob, kb, dub);
      }
    }
    if (dx != nullptr) {
      // dV = sum over the blocks of U_block^T dM_block, into V's buffer.
      for (int64_t ob = 0; ob < g.oc; ob += kb_max) {
        const int64_t kb = std::min(kb_max, g.oc - ob);
        float* ub = resident ? u + kXi * ob * g.c : u;
        if (!resident) transform_kernels(ob, kb, ub);
        const float beta = ob == 0 ? 0.0f : 1.0f;
        for_each_xi([&](int64_t xi) {
          blas::gemm(ctx, true, false, g.c, ld_t, kb, 1.0f, ub + xi * kb * g.c, g.c,
                     dm + (xi * g.oc + ob) * ld_t, ld_t, beta, v + xi * g.c * ld_t, ld_t);
        });
      }
      float* dxb = dx + b0 * g.c * g.h * g.w;
      detail::parallel_for(nb * g.c, 1, [&](int64_t p0, int64_t p1) {
        input_grad_transform(g, v, ld_t, dxb, p0, p1);
      });
    }
  }
  if (resident && dweight != nullptr) {
    for (int64_t ob = 0; ob < g.oc; ob += kb_max) {
      add_kernel_grads(ob, std::min(kb_max, g.oc - ob), du_all + kXi * ob * g.c);
    }
  }
}

}  // namespace strata::ops::cpu::winograd
