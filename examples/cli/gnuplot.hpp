#pragma once
// gnuplot as the tool runs it (--plot), with nothing from an input reaching
// its script as code:
//  - text (a title taken from a trace's header, a key) is written as a
//    double-quoted gnuplot string in which every byte but letters, digits,
//    space and , . : _ + - / ( ) % is an octal escape (\ooo), so the script
//    holds no quote, backquote, '@', '$', backslash or line break of the
//    input's: no quoting context of gnuplot's can be left, no command
//    substitution or macro can start;
//  - the points are numbers the tool prints, inline after the plot command;
//  - no path reaches gnuplot at all: it reads the script on its standard
//    input (an unnamed temporary file) and writes the picture to its standard
//    output, a new file of ours beside the target, with no argument;
//  - gnuplot exits 0 even when its write failed, so the picture is checked
//    (non-empty, an SVG from "<?xml" to "</svg>") before it replaces the
//    target, and the tool's own write of the script is checked too.

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/error.hpp"
#include "output.hpp"

extern char** environ;  // POSIX: the process environment, for posix_spawn

namespace moe_residency_cli {

/// `s` as a gnuplot double-quoted string literal whose bytes are all safe
/// (see the top of this file); a control byte or a byte of an invalid UTF-8
/// sequence becomes '?', so the SVG gnuplot writes stays valid UTF-8.
inline std::string gnuplot_text(const std::string& s) {
  auto safe = [](unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == ' ' || c == ',' ||
           c == '.' || c == ':' || c == '_' || c == '+' || c == '-' || c == '/' || c == '(' || c == ')' || c == '%';
  };
  auto octal = [](unsigned char c) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\%03o", static_cast<unsigned>(c));
    return std::string(buf);
  };
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out += c < 0x20 || c == 0x7f ? std::string("?") : safe(c) ? std::string(1, static_cast<char>(c)) : octal(c);
      ++i;
      continue;
    }
    // A UTF-8 sequence passes whole (escaped), or its first byte becomes '?'.
    const std::size_t n = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c <= 0xdf ? 2 : 0;
    bool ok = n != 0 && i + n <= s.size();
    for (std::size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
    if (!ok) {
      out += '?';
      ++i;
      continue;
    }
    for (std::size_t k = 0; k < n; ++k) out += octal(static_cast<unsigned char>(s[i + k]));
    i += n;
  }
  return out + "\"";
}

/// A number for gnuplot's inline data: 17 significant digits, NaN for a
/// value that is not finite (gnuplot leaves the point out).
inline std::string gnuplot_number(double v) {
  if (!std::isfinite(v)) return "NaN";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

/// Whether an executable `gnuplot` is on PATH (looked up directly: no shell).
inline bool gnuplot_installed() {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  for (std::size_t start = 0;;) {
    const std::size_t colon = p.find(':', start);
    std::string dir = p.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (dir.empty()) dir = ".";
    if (::access((dir + "/gnuplot").c_str(), X_OK) == 0) return true;
    if (colon == std::string::npos) return false;
    start = colon + 1;
  }
}

/// Refuses --plot before any work: gnuplot must be installed.
inline void require_gnuplot(const char* command) {
  if (!gnuplot_installed())
    throw moe_residency::error(
        std::string("--plot: needs gnuplot, which is not installed (no gnuplot on PATH); install it with "
                    "'apt-get install gnuplot-nox' (Debian/Ubuntu) or 'brew install gnuplot' (macOS), or leave "
                    "--plot out (moe-residency ") +
        command + " --format csv gives the same figures as data)");
}

/// One line of a plot: its key (any text: escaped) and its points.
struct gnuplot_series {
  std::string title;
  std::vector<std::pair<double, double>> points;
};

/// Draws `series` as an SVG at `svg` (--plot): `settings` are the script's
/// lines before the plot command (labels, ranges: fixed text, or text passed
/// through gnuplot_text). gnuplot runs into a new file beside `svg`, which
/// replaces it only once checked whole; on any failure `svg` is left as it
/// was and the message names the option, the path and what went wrong.
inline void render_svg_plot(const std::string& svg, const std::string& settings,
                            const std::vector<gnuplot_series>& series) {
  using moe_residency::error;
  std::string script = "set terminal svg size 900,560 dynamic font 'sans,12' background rgb 'white'\n" + settings;
  script += "plot ";
  for (std::size_t i = 0; i < series.size(); ++i)
    script += std::string(i ? ", " : "") + "'-' using 1:2 with linespoints lw 2 title " +
              gnuplot_text(series[i].title) + " noenhanced";
  script += "\n";
  for (const gnuplot_series& s : series) {
    for (const auto& pt : s.points) script += gnuplot_number(pt.first) + " " + gnuplot_number(pt.second) + "\n";
    script += "e\n";
  }
  // The script: an unnamed temporary file, written and checked before gnuplot sees it.
  std::FILE* in = std::tmpfile();
  if (!in)
    throw error(std::string("--plot: cannot create a temporary file for gnuplot's script: ") + std::strerror(errno));
  const bool wrote = std::fwrite(script.data(), 1, script.size(), in) == script.size() && std::fflush(in) == 0 &&
                     std::fseek(in, 0, SEEK_SET) == 0;
  if (!wrote) {
    const int e = errno;
    std::fclose(in);
    throw error(std::string("--plot: writing gnuplot's script to a temporary file failed: ") + std::strerror(e));
  }
  const std::string picture = temp_file_beside(svg, "--plot");
  const int out = ::open(picture.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  int rc = -1, spawn_error = 0;
  if (out < 0) {
    spawn_error = errno;
  } else {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, ::fileno(in), 0);
    posix_spawn_file_actions_adddup2(&fa, out, 1);
    char prog[] = "gnuplot";
    char* argv[] = {prog, nullptr};
    pid_t pid = 0;
    spawn_error = posix_spawnp(&pid, "gnuplot", &fa, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (spawn_error == 0) {
      int status = 0;
      pid_t w = 0;
      while ((w = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
      }
      if (w == pid && WIFEXITED(status)) rc = WEXITSTATUS(status);
    }
    ::close(out);
  }
  std::fclose(in);
  auto fail = [&](const std::string& why) {
    std::remove(picture.c_str());
    throw error("--plot: '" + svg + "': " + why + "; the file is left as it was");
  };
  if (spawn_error != 0) fail(std::string("cannot run gnuplot: ") + std::strerror(spawn_error));
  if (rc != 0) fail("gnuplot failed (exit " + std::to_string(rc) + ")");
  // gnuplot exits 0 when its own write fails (a full disk): the picture must be a whole SVG.
  std::string got;
  {
    std::FILE* f = std::fopen(picture.c_str(), "rb");
    if (!f) fail(std::string("cannot read back gnuplot's picture: ") + std::strerror(errno));
    char buf[1 << 16];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) got.append(buf, n);
    const bool read_error = std::ferror(f) != 0;
    std::fclose(f);
    if (read_error) fail("cannot read back gnuplot's picture");
  }
  std::size_t end = got.find_last_not_of(" \t\r\n");
  end = end == std::string::npos ? 0 : end + 1;
  if (got.empty()) fail("gnuplot exited 0 but wrote nothing (a full disk?)");
  if (got.rfind("<?xml", 0) != 0 || got.find("<svg") == std::string::npos || end < 6 ||
      got.compare(end - 6, 6, "</svg>") != 0)
    fail("gnuplot exited 0 but wrote " + std::to_string(got.size()) +
         " bytes that are not a whole SVG (no '<?xml' ... '</svg>'; a full disk?)");
  replace_with(picture, svg, "--plot");
}

}  // namespace moe_residency_cli
