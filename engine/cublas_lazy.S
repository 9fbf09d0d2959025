/* The cuBLAS and cuBLASLt entry points Strata calls (engine/cublas_symbols.def), as jumps through
   a table that load_cublas() fills (engine/cublas_lazy.cpp). Each entry starts at a stub that
   reports the call and aborts, so a call before the libraries are loaded fails loudly.
   x86-64 System V only; CMake links the libraries directly elsewhere. */

	.macro STRATA_LAZY name, index
	.text
	.globl \name
	.type \name, @function
	.p2align 4
\name:
	jmp *strata_cublas_table+8*\index(%rip)
	.size \name, .-\name
	.p2align 4
.Lstrata_unloaded_\index:
	mov $\index, %edi
	jmp strata_cublas_unloaded@PLT
	.data
	.quad .Lstrata_unloaded_\index
	.endm

	.data
	.p2align 3
	.globl strata_cublas_table
	.hidden strata_cublas_table
strata_cublas_table:
#define STRATA_CUBLAS_SYMBOL(name) STRATA_LAZY name, __COUNTER__
#include "engine/cublas_symbols.def"
#undef STRATA_CUBLAS_SYMBOL

	.section .note.GNU-stack,"",@progbits
