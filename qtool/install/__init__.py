"""Install-time compilation of the CPU kernels and the seeding of a user's numba cache from them."""
