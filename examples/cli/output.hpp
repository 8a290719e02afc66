#pragma once
// The tool's outputs: never written through a path that is a directory, a
// symbolic link, a FIFO or a device, never over one of the command's inputs,
// and never half. The bytes go to a new temporary file of our own beside the
// target (mkstemp: a user's file of any name is never touched), which is
// renamed over the target only once complete. Errors name the option, the path
// and the system's reason. "-" is standard output where a command says so
// (convert --out -); every other output refuses it rather than write a file
// named "-".

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <ostream>
#include <string>
#include <system_error>
#include <vector>

#include "moe_residency/detail/files.hpp"
#include "moe_residency/error.hpp"

namespace moe_residency_cli {

/// An input of the command, by the option that named it ("--in", "--trace").
struct named_input {
  const char* option;
  std::string path;
};

/// Throws moe_residency::error unless `path` may be written as the output of
/// `option`: a new path or an existing regular file, and not one of `inputs`.
inline void check_output_path(const std::string& path, const std::string& option,
                              const std::vector<named_input>& inputs) {
  namespace fs = std::filesystem;
  using moe_residency::error;
  if (path.empty()) throw error(option + ": empty path; expected a file to write");
  if (path == "-")
    throw error(option +
                ": '-' (standard output) is not taken here: standard output carries the command's report; expected a "
                "file to write");
  const std::string named = option + ": '" + path + "' ";
  if (const std::string p = moe_residency::detail::output_file_problem(path); !p.empty()) throw error(named + p);
  // The folder must be there before the work, not found missing after it (the
  // new file is made beside the target).
  {
    const fs::path parent = fs::path(path).parent_path();
    std::error_code e;
    if (!parent.empty() && !fs::is_directory(parent, e))
      throw error(named + "is in '" + parent.string() + "', which " +
                  (fs::exists(parent, e) ? "is not a directory" : "does not exist") +
                  "; expected a file in an existing directory");
    const std::string dir = parent.empty() ? std::string(".") : parent.string();
    if (::access(dir.c_str(), W_OK | X_OK) != 0)
      throw error(named + "is in '" + dir + "', where no file can be made: " + std::strerror(errno));
  }
  for (const named_input& in : inputs) {
    std::error_code e;
    if (!in.path.empty() && in.path != "-" && fs::equivalent(path, in.path, e))  // "-": standard input
      throw error(named + "is the input given by " + in.option +
                  "; expected another file (writing it would destroy the input)");
  }
}

/// A new empty file of our own beside `path` (mkstemp, mode 0600), for an
/// output's temporary bytes; its name is returned. Throws naming `option`.
inline std::string temp_file_beside(const std::string& path, const std::string& option) {
  std::string tmp = path + ".XXXXXX";
  const int fd = ::mkstemp(&tmp[0]);
  if (fd < 0)
    throw moe_residency::error(option + ": '" + path + "': cannot create a file beside it: " + std::strerror(errno));
  ::close(fd);
  return tmp;
}

/// Moves `tmp` (a complete file of ours from temp_file_beside, mode 0600)
/// over `path`, with the mode creating `path` would have given it. On failure
/// removes `tmp` and throws naming the option, the path and the reason.
inline void replace_with(const std::string& tmp, const std::string& path, const std::string& option) {
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::chmod(tmp.c_str(), 0666 & ~mask);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw moe_residency::error(option + ": '" + path + "': cannot replace it: " + std::strerror(err));
  }
}

/// Writes the output of `option` at `path` (check_output_path first): `write`
/// fills a new temporary file beside it, which then replaces `path`. On any
/// failure the temporary file is removed and `path` is left as it was.
inline void write_output_file(const std::string& path, const std::string& option,
                              const std::vector<named_input>& inputs, const std::function<void(std::ostream&)>& write) {
  using moe_residency::error;
  check_output_path(path, option, inputs);
  const std::string tmp = temp_file_beside(path, option);
  int err = 0;
  errno = 0;
  try {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (f) write(f);
    f.flush();
    if (!f) err = errno ? errno : EIO;
    f.close();
    if (!f && !err) err = errno ? errno : EIO;
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (err != 0) {
    std::remove(tmp.c_str());
    throw error(option + ": '" + path + "': write failed: " + std::strerror(err));
  }
  replace_with(tmp, path, option);
}

}  // namespace moe_residency_cli
