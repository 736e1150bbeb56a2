"""CPU kernels in C, compiled once on first use (`build.load`) and called through ctypes."""
