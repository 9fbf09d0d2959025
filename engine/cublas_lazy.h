// cuBLAS and cuBLASLt, loaded when the first CUDA context is made instead of when the program
// starts. Loading libcublasLt costs about 0.5 s of CPU (its relocations and static
// initialization), which every run of a CUDA build paid, on a GPU or not: each `strata` command
// and each test process. The functions Strata calls (engine/cublas_symbols.def) are jumps through a
// table (engine/cublas_lazy.S) that load_cublas fills from dlopen, so a build with CUDA starts as
// fast as one without until it uses a GPU. Where the jumps are not built (not x86-64), the
// libraries are linked as usual and load_cublas does nothing.
#pragma once

namespace strata::cuda {

// Loads libcublasLt and libcublas (by soname, so LD_LIBRARY_PATH and the program's run path
// apply; then from the toolkit's directory at build time) and resolves every function Strata
// calls. Idempotent and thread-safe; a strata::Error naming the library or the function when one
// is missing.
void load_cublas();

}  // namespace strata::cuda
