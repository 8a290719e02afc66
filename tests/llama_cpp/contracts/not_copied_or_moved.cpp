// The adapter's objects that hand `this` to someone else (a context's eval
// callback, a cache's warning sink, a read callback on the lanes) are neither
// copied nor moved: a copy or a moved-to object would leave that pointer on
// the old one. tests/llama_cpp/CMakeLists.txt compiles this file once per
// class (MR_CLASS) and operation (MR_OP), each expected to fail with the
// compiler's "use of deleted function" for exactly that member; without
// MR_OP it is the control, and must compile.
#include <utility>

#include "moe_residency/adapters/llama_cpp.hpp"
#include "moe_residency/adapters/llama_cpp/residency.hpp"

namespace cases {
using route_recorder = moe_residency::llama_cpp::route_recorder<moe_residency::lru_policy>;
using observer = moe_residency::llama_cpp::observer;
using gguf_expert_reader = moe_residency::llama_cpp::gguf_expert_reader;
using mmap_residency = moe_residency::llama_cpp::mmap_residency<>;
}  // namespace cases

using T = cases::MR_CLASS;

#define MR_copy_construct 1
#define MR_move_construct 2
#define MR_copy_assign 3
#define MR_move_assign 4
#define MR_CAT(a, b) a##b
#define MR_CASE(op) MR_CAT(MR_, op)

void exercise(T& a, T& b) {
#if !defined(MR_OP)
  (void)a;
  (void)b;
#elif MR_CASE(MR_OP) == MR_copy_construct
  T c(a);
  (void)c;
  (void)b;
#elif MR_CASE(MR_OP) == MR_move_construct
  T c(std::move(a));
  (void)c;
  (void)b;
#elif MR_CASE(MR_OP) == MR_copy_assign
  a = b;
#elif MR_CASE(MR_OP) == MR_move_assign
  a = std::move(b);
#else
#error "MR_OP: expected copy_construct, move_construct, copy_assign or move_assign"
#endif
}

int main() {}
