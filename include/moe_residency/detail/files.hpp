#pragma once
// Reading an input file whole, after checking that it is one: a directory, a
// FIFO or a device given where a file is expected gets a message naming the
// path and what it is (a FIFO would otherwise block the reader, a directory
// read as empty or fail deep in the standard library), and a failed open or
// read names the system's reason.

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "moe_residency/error.hpp"

namespace moe_residency {
namespace detail {

/// What `path` is instead of a regular file (or a symbolic link to one), as
/// the end of a sentence naming it ("is a directory", "is a FIFO (named
/// pipe)", ...); "" for a regular file, and for a path that does not exist
/// (the open that follows names the system's reason).
inline std::string input_file_problem(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  switch (st.type()) {
    case fs::file_type::regular: return {};
    case fs::file_type::not_found: return {};
    case fs::file_type::directory: return "is a directory";
    case fs::file_type::fifo: return "is a FIFO (named pipe)";
    case fs::file_type::block:
    case fs::file_type::character: return "is a device";
    case fs::file_type::socket: return "is a socket";
    case fs::file_type::none: return "cannot be examined: " + ec.message();
    default: return "is not a regular file";
  }
}

/// The whole of the regular file at `path`. Throws `error`
/// ("<path>: is a directory; expected <expected>", "<path>: cannot open: <reason>")
/// before reading anything that is not a regular file.
inline std::string read_input_file(const std::string& path, const std::string& expected) {
  if (const std::string p = input_file_problem(path); !p.empty()) throw error(path + ": " + p + "; expected " + expected);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw error(path + ": cannot open: " + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff n = in.tellg();
  if (n < 0) throw error(path + ": cannot determine the file size");
  in.seekg(0, std::ios::beg);
  std::string bytes(static_cast<std::size_t>(n), '\0');
  if (n > 0 && !in.read(&bytes[0], n))
    throw error(path + ": read failed after " + std::to_string(in.gcount()) + " bytes: " + std::strerror(errno));
  return bytes;
}

}  // namespace detail
}  // namespace moe_residency
