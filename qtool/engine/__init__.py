"""The engines that run the integer and float GRU fast: the CPU (numba, SIMD) and CUDA kernels and
the choice between them."""
