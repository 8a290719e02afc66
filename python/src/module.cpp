// moe_residency._core: the C++ library for Python. The package's
// __init__.py wraps what this returns in small result classes.

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bindings.hpp"
#include "moe_residency/detail/files.hpp"
#include "moe_residency/detail/numbers.hpp"
#include "moe_residency/version.hpp"

namespace moe_residency_py {

const moe_residency::replay_input& trace_object::replay_input() const {
  std::lock_guard<std::mutex> lock(mu_);
  const py_activity doing("grouping the load batches of " + source_);
  if (!replay_)
    replay_ = std::make_unique<moe_residency::replay_input>(moe_residency::replay_input::from_trace(trace_.trace()));
  return *replay_;
}

const moe_residency::routed_replay_input& trace_object::routed_input() const {
  std::lock_guard<std::mutex> lock(mu_);
  const py_activity doing("grouping the load batches of " + source_);
  if (!routed_)
    routed_ = std::make_unique<moe_residency::routed_replay_input>(
        moe_residency::routed_replay_input::from_trace(trace_.trace()));
  return *routed_;
}

std::string type_phrase(const py::handle& v) {
  const std::string n = py::str(py::type::handle_of(v).attr("__name__")).cast<std::string>();
  return (n.find_first_of("aeiouAEIOU") == 0 ? "an " : "a ") + n;
}

std::string& current_activity() {
  thread_local std::string what;
  return what;
}

std::string fspath(const py::handle& p, const char* what) {
  if (!py::isinstance<py::str>(p) && !py::isinstance<py::bytes>(p) && !py::hasattr(p, "__fspath__"))
    throw py::type_error(std::string(what) + ": " + py::repr(p).cast<std::string>() + " is " + type_phrase(p) +
                         "; expected a path (str, bytes or os.PathLike)");
  // os.fsencode: the file system's own bytes, so a name that is not UTF-8 still opens.
  py::bytes b = py::module_::import("os").attr("fsencode")(p);
  std::string s(b);
  if (s.empty()) throw py::value_error(std::string(what) + ": empty path; expected a file");
  if (const std::size_t nul = s.find('\0'); nul != std::string::npos)
    throw py::value_error(std::string(what) + ": " + py::repr(p).cast<std::string>() + " holds a NUL byte at offset " +
                          std::to_string(nul) + "; expected a path (the system would cut it at the NUL)");
  return s;
}

void raise_os_error(const std::string& path) {
  PyErr_SetFromErrnoWithFilename(PyExc_OSError, path.c_str());
  throw py::error_already_set();
}

std::string read_file(const std::string& path, const moe_residency::detail::input_head_check& check_head) {
  // A FIFO would block the open; a device or socket is no file to read whole.
  if (const std::string p = moe_residency::detail::input_file_problem(path); !p.empty() && p != "is a directory")
    throw moe_residency::error(path + ": " + p + "; expected a regular file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) raise_os_error(path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    raise_os_error(path);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    errno = EISDIR;
    raise_os_error(path);
  }
  std::string out;
  char buf[1 << 16];
  bool head_checked = !check_head;
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      errno = e;
      raise_os_error(path);
    }
    if (n > 0) out.append(buf, static_cast<std::size_t>(n));
    // The head alone first: a file that is not what was asked for is refused
    // from its first bytes, not read whole (a large sparse file, a model).
    if (!head_checked && (n == 0 || out.size() >= moe_residency::detail::input_head_bytes)) {
      head_checked = true;
      try {
        check_head(std::string_view(out).substr(0, moe_residency::detail::input_head_bytes),
                   static_cast<std::uint64_t>(st.st_size));
      } catch (...) {
        ::close(fd);
        throw;
      }
    }
    if (n == 0) break;
  }
  ::close(fd);
  return out;
}

}  // namespace moe_residency_py

PYBIND11_MODULE(_core, m) {
  namespace py = pybind11;
  m.doc() = "moe-residency's C++ core: traces, replay, scoring and the wall-clock model";
  m.attr("__version__") = std::to_string(MOE_RESIDENCY_VERSION_MAJOR) + "." +
                          std::to_string(MOE_RESIDENCY_VERSION_MINOR) + "." +
                          std::to_string(MOE_RESIDENCY_VERSION_PATCH);
  // The library's one exception type says what input was wrong: ValueError.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const moe_residency::error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const std::bad_alloc&) {
      // Inputs are bounded before anything is sized from them; if memory still
      // runs out, say what was being sized, not "std::bad_alloc".
      const std::string& what = moe_residency_py::current_activity();
      PyErr_SetString(PyExc_MemoryError,
                      ("out of memory while " + (what.empty() ? std::string("running the call") : what)).c_str());
    }
  });
  // The checked number rules of the library (detail/numbers.hpp), for the
  // package's parameters: one wording for the tool's options and Python's.
  m.def(
      "_check_real",
      [](const std::string& name, double v, double lo, double hi, bool lo_open, bool hi_open, bool as_float) {
        const moe_residency::detail::real_domain d{lo, hi, lo_open, hi_open};
        const std::string text = moe_residency::detail::show_number(v);
        const std::string p =
            as_float ? moe_residency::detail::float_problem(text, d) : moe_residency::detail::real_problem(text, d);
        if (!p.empty()) throw py::value_error(name + ": " + p);
        return as_float ? static_cast<double>(static_cast<float>(v)) : v;
      },
      py::arg("name"), py::arg("value"), py::arg("lo"), py::arg("hi"), py::arg("lo_open"), py::arg("hi_open"),
      py::arg("as_float"));
  m.def(
      "_check_whole",
      [](const std::string& name, const std::string& text, std::uint64_t lo, std::uint64_t hi) {
        std::uint64_t v = 0;
        const std::string p = moe_residency::detail::whole_problem(text, lo, hi, &v);
        if (!p.empty()) throw py::value_error(name + ": " + p);
        return v;
      },
      py::arg("name"), py::arg("text"), py::arg("lo"), py::arg("hi"));
  moe_residency_py::bind_trace(m);
  moe_residency_py::bind_replay(m);
  moe_residency_py::bind_timing(m);
}
