#pragma once
/// The llama.cpp adapter: observes an unmodified llama.cpp through its graph
/// eval callback, maps and reads the GGUF file's experts, feeds sessions and
/// recorders, and manages the residency of a memory-mapped model's experts.
/// Not part of the umbrella header: it needs llama.h, ggml.h and gguf.h.
/// See docs/llama-cpp.md and docs/llama-cpp-residency.md.
///
/// | header                      | what                                              |
/// |-----------------------------|---------------------------------------------------|
/// | llama_cpp/structure.hpp     | node names, layer structure, events, counters     |
/// | llama_cpp/observer.hpp      | the cb_eval observer                              |
/// | llama_cpp/gguf.hpp          | expert byte ranges in the file, dense bytes       |
/// | llama_cpp/reader.hpp        | pread / fadvise reads of an expert                |
/// | llama_cpp/sinks.hpp         | session_sink, configure_routers, route_recorder   |
/// | llama_cpp/advice.hpp        | memory advice (madvise/mlock) behind an interface |
/// | llama_cpp/residency.hpp     | mmap_residency: experts of a mapped model managed |

#include "moe_residency/adapters/llama_cpp/gguf.hpp"
#include "moe_residency/adapters/llama_cpp/observer.hpp"
#include "moe_residency/adapters/llama_cpp/residency/advice.hpp"
#include "moe_residency/adapters/llama_cpp/reader.hpp"
#include "moe_residency/adapters/llama_cpp/residency.hpp"
#include "moe_residency/adapters/llama_cpp/sinks.hpp"
#include "moe_residency/adapters/llama_cpp/structure.hpp"
