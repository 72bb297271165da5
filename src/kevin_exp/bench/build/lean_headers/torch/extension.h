// Lean shadow of <torch/extension.h> (see kx_lean_core.h). pybind11 and torch's Python glue are
// left out of nvcc translation units and of the builder's candidate units (KX_NO_PYBIND).
#pragma once
#include <kx_lean_core.h>
#if !defined(__CUDACC__) && !defined(KX_NO_PYBIND)
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>
#endif
