#pragma once
/// The element types of router matrices and how an activation is rounded
/// before a dot product: plain enums, with no dependency, so that headers
/// describing routers (and users storing these settings) need not include the
/// GEMV kernels (detail/gemv.hpp, xsimd) to name them.

#include <cstdint>

namespace moe_residency {

/// Element type of a router matrix.
enum class element_type : std::uint8_t { f32, f16, bf16 };

/// How the activation is treated before the dot product.
/// `engine`: like ggml's CPU path, x is first rounded to the weight's 16-bit
/// type (f16: IEEE round-to-nearest-even; bf16: ggml's rounding), accumulation
/// in f32. No effect on f32 weights. `none`: x is used as given.
enum class activation_rounding : std::uint8_t { engine, none };

}  // namespace moe_residency
