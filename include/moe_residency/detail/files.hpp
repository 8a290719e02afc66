#pragma once
// Reading an input file whole, after checking that it is one: a directory, a
// FIFO or a device given where a file is expected gets a message naming the
// path and what it is (a FIFO would otherwise block the reader, a directory
// read as empty or fail deep in the standard library), and a failed open or
// read names the system's reason.

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <string_view>
#include <system_error>

#include "moe_residency/detail/text_encoding.hpp"
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

/// What `path` is that an output must not be written through, as the end of
/// a sentence naming it ("is a symbolic link; expected ..."); "" for a new
/// path or an existing regular file. Renaming a finished file over a link
/// would replace the link, not write its target; a FIFO, a device or a
/// directory is no file to replace.
inline std::string output_file_problem(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) return "is empty; expected a file to write";
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(path, ec);
  const char* expected = "; expected a regular file or a new path";
  switch (st.type()) {
    case fs::file_type::not_found:
    case fs::file_type::regular: return {};
    case fs::file_type::symlink:
      return std::string("is a symbolic link") + expected + " (the link would be replaced, not its target written)";
    case fs::file_type::directory: return std::string("is a directory") + expected;
    case fs::file_type::fifo: return std::string("is a FIFO (named pipe)") + expected;
    case fs::file_type::block:
    case fs::file_type::character: return std::string("is a device") + expected;
    case fs::file_type::socket: return std::string("is a socket") + expected;
    case fs::file_type::none: return "cannot be examined: " + ec.message();
    default: return std::string("is not a regular file") + expected;
  }
}

/// How many bytes of an input its head check sees before the rest is read.
constexpr std::size_t input_head_bytes = 64 * 1024;

/// Looks at an input's first bytes (up to input_head_bytes) and its total
/// size before the rest is read, and throws to refuse it: a large file that
/// is not what was expected (a disk image, a sparse file, a model given as a
/// trace) is refused after 64 KiB, not read whole first.
using input_head_check = std::function<void(std::string_view head, std::uint64_t size)>;

/// A head check for a text input (a configuration, a metrics or a curve
/// file): compressed data or UTF-16/32 text is named as such
/// (check_text_encoding), and a NUL byte in its head means binary data.
/// Throws "<path>: holds binary data (a NUL byte at offset K); expected <expected>".
inline input_head_check text_head(const std::string& path, const std::string& expected) {
  return [path, expected](std::string_view head, std::uint64_t) {
    check_text_encoding(head, path, expected);
    if (const std::size_t nul = head.find('\0'); nul != std::string_view::npos)
      throw error(path + ": holds binary data (a NUL byte at offset " + std::to_string(nul) + "); expected " +
                  expected);
  };
}

/// The whole of the regular file at `path`. Throws `error`
/// ("<path>: is a directory; expected <expected>", "<path>: cannot open: <reason>")
/// before reading anything that is not a regular file, and lets `check_head`
/// refuse the file from its first bytes before the rest is read.
inline std::string read_input_file(const std::string& path, const std::string& expected,
                                   const input_head_check& check_head = {}) {
  if (const std::string p = input_file_problem(path); !p.empty())
    throw error(path + ": " + p + "; expected " + expected);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw error(path + ": cannot open: " + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff n = in.tellg();
  if (n < 0) throw error(path + ": cannot determine the file size");
  in.seekg(0, std::ios::beg);
  const auto size = static_cast<std::uint64_t>(n);
  if (static_cast<std::uint64_t>(static_cast<std::size_t>(size)) != size)  // a 32-bit machine
    throw error(path + ": " + std::to_string(size) + " bytes do not fit this machine's memory; expected " + expected);
  // The head first, and the rest only once `check_head` has passed it: a
  // refused file is never read, nor its size allocated, whole.
  const std::size_t whole = static_cast<std::size_t>(size), head = std::min(whole, input_head_bytes);
  std::string bytes;
  auto read = [&](std::size_t from) {
    bytes.resize(from == 0 ? head : whole);
    const std::size_t count = bytes.size() - from;
    if (count > 0 && !in.read(&bytes[from], static_cast<std::streamsize>(count)))
      throw error(path + ": read failed after " + std::to_string(from + static_cast<std::size_t>(in.gcount())) +
                  " bytes: " + std::strerror(errno));
  };
  read(0);
  if (check_head) check_head(bytes, size);
  read(head);
  return bytes;
}

}  // namespace detail
}  // namespace moe_residency
