// load_cublas: dlopen of cuBLASLt and cuBLAS, and the jump table of engine/cublas_lazy.S.
#include "engine/cublas_lazy.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "engine/check.h"

#ifdef STRATA_CUBLAS_LAZY
extern "C" void* strata_cublas_table[];

namespace {

const char* const kNames[] = {
#define STRATA_CUBLAS_SYMBOL(name) #name,
#include "engine/cublas_symbols.def"
#undef STRATA_CUBLAS_SYMBOL
};

}  // namespace

// Where a table entry still points before load_cublas: the call cannot go on.
extern "C" [[noreturn]] void strata_cublas_unloaded(int index) {
  std::fprintf(stderr,
               "strata: %s called before cuBLAS was loaded (strata::cuda::load_cublas runs when "
               "a CUDA context is made)\n",
               kNames[index]);
  std::abort();
}
#endif

namespace strata::cuda {

void load_cublas() {
#ifdef STRATA_CUBLAS_LAZY
  static std::once_flag once;
  static std::string error;
  std::call_once(once, [] {
    // cuBLASLt first: libcublas needs it.
    void* handles[2] = {nullptr, nullptr};
    const char* const sonames[2] = {STRATA_CUBLASLT_SONAME, STRATA_CUBLAS_SONAME};
    for (int i = 0; i < 2; ++i) {
      handles[i] = dlopen(sonames[i], RTLD_NOW | RTLD_GLOBAL);
      if (handles[i] == nullptr) {
        const std::string first = dlerror();
        const std::string path = std::string(STRATA_CUDA_LIBRARY_DIR) + "/" + sonames[i];
        handles[i] = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
        if (handles[i] == nullptr) {
          error = std::string("cannot load ") + sonames[i] + " (" + first + "; " + dlerror() +
                  "): cuBLAS is needed to run on a GPU (set LD_LIBRARY_PATH to the CUDA " +
                  "toolkit's lib directory)";
          return;
        }
      }
    }
    for (size_t k = 0; k < sizeof(kNames) / sizeof(kNames[0]); ++k) {
      void* f = dlsym(handles[1], kNames[k]);
      if (f == nullptr) f = dlsym(handles[0], kNames[k]);
      if (f == nullptr) {
        error = std::string("cuBLAS has no function ") + kNames[k] + " (loaded " +
                STRATA_CUBLAS_SONAME + " and " + STRATA_CUBLASLT_SONAME + ")";
        return;
      }
      strata_cublas_table[k] = f;
    }
  });
  STRATA_CHECK(error.empty()) << error;
#endif
}

}  // namespace strata::cuda
