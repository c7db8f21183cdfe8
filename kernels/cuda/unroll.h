#pragma once
// Loop unrolling for both compilers (g++ warns about the bare CUDA pragma): TERN_UNROLL unrolls fully,
// TERN_UNROLL_2 by two, TERN_NO_UNROLL not at all.
#if defined(__CUDACC__)
#define TERN_UNROLL _Pragma("unroll")
#define TERN_UNROLL_2 _Pragma("unroll 2")
#define TERN_NO_UNROLL _Pragma("unroll 1")
#else
#define TERN_UNROLL _Pragma("GCC unroll 16")
#define TERN_UNROLL_2 _Pragma("GCC unroll 2")
#define TERN_NO_UNROLL _Pragma("GCC unroll 1")
#endif
