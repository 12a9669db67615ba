"""Numba kernels: sampling, relabelling, CSC/CSR builds, gathers, generators."""
