// Lean replacement for the heavy torch umbrella headers (kevin_exp builder, fast mode).
// What kernel code typically needs: at::Tensor and its methods, TensorOptions, the allocation
// ops, TORCH_CHECK, AT_DISPATCH_*, Half/BFloat16, at::parallel_for, plus every standard header the
// real umbrella header pulls in. A source needing more fails to compile and the builder rebuilds
// it with torch's real headers. torch::empty & co. resolve to the at:: ops here (the autograd
// factories of the real header differ only for requires_grad=true, which at:: rejects).
#pragma once
#ifdef __CUDACC__
#include <kx_std_types.h>  // generated: the C++ standard headers torch/types.h pulls in
#else
#include <kx_std_extension.h>  // generated: the C++ standard headers torch/extension.h pulls in
#endif
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/core/ScalarType.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <c10/util/irange.h>
// generated: torch's allocation ops without their umbrella includes (ATen/Context.h, ...)
#include <kx_ops/arange.h>
#include <kx_ops/empty.h>
#include <kx_ops/empty_like.h>
#include <kx_ops/empty_strided.h>
#include <kx_ops/full.h>
#include <kx_ops/full_like.h>
#include <kx_ops/ones.h>
#include <kx_ops/ones_like.h>
#include <kx_ops/zeros.h>
#include <kx_ops/zeros_like.h>
#include <optional>

// Same names torch/types.h puts in namespace torch.
namespace torch {
using namespace at;  // NOLINT
using std::nullopt;  // NOLINT
using std::optional;  // NOLINT
using Dtype = at::ScalarType;
constexpr auto kUInt8 = at::kByte;
constexpr auto kInt8 = at::kChar;
constexpr auto kInt16 = at::kShort;
constexpr auto kInt32 = at::kInt;
constexpr auto kInt64 = at::kLong;
constexpr auto kUInt16 = at::kUInt16;
constexpr auto kUInt32 = at::kUInt32;
constexpr auto kUInt64 = at::kUInt64;
constexpr auto kFloat16 = at::kHalf;
constexpr auto kFloat32 = at::kFloat;
constexpr auto kFloat64 = at::kDouble;
constexpr auto kU8 = kUInt8;
constexpr auto kU16 = kUInt16;
constexpr auto kU32 = kUInt32;
constexpr auto kU64 = kUInt64;
constexpr auto kI8 = kInt8;
constexpr auto kI16 = kInt16;
constexpr auto kI32 = kInt32;
constexpr auto kI64 = kInt64;
constexpr auto kF16 = kFloat16;
constexpr auto kF32 = kFloat32;
constexpr auto kF64 = kFloat64;
}  // namespace torch
