#pragma once
// The Python module's shared pieces: the trace object the functions take, the
// path and error helpers, and the three binders module.cpp calls.

#include <algorithm>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "moe_residency/detail/files.hpp"
#include "moe_residency/replay.hpp"
#include "moe_residency/trace.hpp"

namespace moe_residency_py {

namespace py = pybind11;

/// A trace read once, with the inputs the replays build from it made on first
/// use and kept (the next-use index Belady needs is built once per trace, not
/// once per call).
class trace_object {
 public:
  explicit trace_object(moe_residency::validated_route_trace t) : trace_(std::move(t)), shape_(trace_.shape()) {}

  const moe_residency::validated_route_trace& trace() const noexcept { return trace_; }
  const moe_residency::model_shape& shape() const noexcept { return shape_; }
  const std::string& source() const noexcept { return source_; }
  void set_source(std::string s) { source_ = std::move(s); }

  /// The static replay's input (load batches and next-use index). Thread-safe.
  const moe_residency::replay_input& replay_input() const;
  /// The dynamic replay's input (routings per decode token). Thread-safe.
  const moe_residency::routed_replay_input& routed_input() const;

 private:
  moe_residency::validated_route_trace trace_;
  moe_residency::model_shape shape_;
  std::string source_;
  mutable std::mutex mu_;
  mutable std::unique_ptr<moe_residency::replay_input> replay_;
  mutable std::unique_ptr<moe_residency::routed_replay_input> routed_;
};

/// os.fspath(p) as the file system's bytes: str, bytes or any os.PathLike.
/// Raises TypeError naming `what` (the parameter) for anything else, and
/// ValueError for an empty path or one holding a NUL byte (the C library
/// would cut it at the NUL and open another file).
std::string fspath(const py::handle& p, const char* what);

/// "a str", "an int": the type of `v` as a message names it.
std::string type_phrase(const py::handle& v);

/// What the module is doing, for the message of a MemoryError ("reading the
/// route trace t.csv"); set by `py_activity` on the calling thread.
std::string& current_activity();
/// Left in place when an exception unwinds it: the translator, which runs
/// after the unwinding, must still see what was being done.
class py_activity {
 public:
  explicit py_activity(std::string what) : outer_(current_activity()), unwinding_(std::uncaught_exceptions()) {
    current_activity() = std::move(what);
  }
  ~py_activity() {
    if (std::uncaught_exceptions() == unwinding_) current_activity() = std::move(outer_);
  }
  py_activity(const py_activity&) = delete;
  py_activity& operator=(const py_activity&) = delete;

 private:
  std::string outer_;
  int unwinding_;
};
/// Reads a whole file; raises OSError (errno, message, path) when it cannot be
/// opened or is a directory, so Python code can catch FileNotFoundError.
/// `check_head` (when given) sees the file's first bytes and its size before
/// the rest is read, and may throw to refuse it.
std::string read_file(const std::string& path, const moe_residency::detail::input_head_check& check_head = {});
/// Raises OSError for `path` from errno (the caller's failed call set it).
[[noreturn]] void raise_os_error(const std::string& path);

/// A numpy copy of a vector (results: small, and owned by Python afterwards).
template <class T>
py::array_t<T> column(const std::vector<T>& v) {
  py::array_t<T> a(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}
inline py::array_t<bool> column(const std::vector<bool>& v) {
  py::array_t<bool> a(static_cast<py::ssize_t>(v.size()));
  for (std::size_t i = 0; i < v.size(); ++i) a.mutable_data()[i] = v[i];
  return a;
}

void bind_trace(py::module_& m);
void bind_replay(py::module_& m);
void bind_timing(py::module_& m);

}  // namespace moe_residency_py
