// Traces in Python: read_trace / write_trace, the Trace object with numpy
// views of its rows (no copy), and the model shape.

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <system_error>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings.hpp"

namespace moe_residency_py {

namespace {

using namespace moe_residency;

// A read-only 1-D view of one field of every row: the rows are 32-byte
// records, so the view strides over them; `base` keeps the trace alive.
template <class T>
py::array field_view(const trace_object& t, std::size_t offset, py::handle base) {
  const auto& rows = t.trace().rows();
  const char* first = rows.empty() ? nullptr : reinterpret_cast<const char*>(rows.data()) + offset;
  py::array a(py::dtype::of<T>(), {static_cast<py::ssize_t>(rows.size())},
              {static_cast<py::ssize_t>(sizeof(trace_row))}, first, base);
  a.attr("setflags")(py::arg("write") = false);
  return a;
}

static_assert(sizeof(layer_id) == 2 && sizeof(expert_id) == 2 && sizeof(run_phase) == 1,
              "the numpy views below assume 16-bit layer and expert ids and an 8-bit phase");

std::shared_ptr<trace_object> read_trace(const py::object& path_like) {
  const std::string path = fspath(path_like, "read_trace: path");
  const py_activity doing("reading the route trace " + path);
  std::string bytes = read_file(
      path, [&path](std::string_view head, std::uint64_t size) { detail::check_route_trace_head(head, size, path); });
  std::unique_ptr<validated_route_trace> t;
  std::vector<std::string> warnings;  // raised as Python warnings once the GIL is back
  {
    py::gil_scoped_release nogil;
    t = std::make_unique<validated_route_trace>(
        !bytes.empty() && static_cast<unsigned char>(bytes[0]) == 0x89
            ? parse_route_trace_binary(bytes, path, [&warnings](const std::string& w) { warnings.push_back(w); })
            : parse_route_trace_csv(bytes, path));
  }
  for (const std::string& w : warnings)
    if (PyErr_WarnEx(PyExc_UserWarning, w.c_str(), 1) < 0) throw py::error_already_set();  // warnings as errors
  std::shared_ptr<trace_object> out;
  try {  // the model shape (a top-k above 32 cannot be replayed), named with the file
    out = std::make_shared<trace_object>(std::move(*t));
  } catch (const error& e) {
    throw error(path + ": " + e.what());
  }
  out->set_source(path);
  return out;
}

void write_trace(const py::object& trace, const py::object& path_like, const py::object& format_obj) {
  if (!py::isinstance<trace_object>(trace))
    throw py::type_error("write_trace: trace: " + type_phrase(trace) + "; expected a moe_residency.Trace");
  const trace_object& t = trace.cast<const trace_object&>();
  if (!py::isinstance<py::str>(format_obj))
    throw py::type_error("write_trace: format: " + py::repr(format_obj).cast<std::string>() + " is " +
                         type_phrase(format_obj) + "; expected 'csv' or 'binary'");
  const std::string format = format_obj.cast<std::string>();
  const std::string path = fspath(path_like, "write_trace: path");
  if (format != "csv" && format != "binary")
    throw error("write_trace: format '" + format + "'; expected 'csv' or 'binary'");
  // The tool reads "-" as standard output; the module writes files only, and
  // never one named "-" by accident.
  if (path == "-")
    throw error(
        "write_trace: path '-' is standard output to the tool; expected a file path (the module writes "
        "files: open sys.stdout.buffer and write the file's bytes there)");
  // As the tool's outputs: never through a link, a FIFO, a device or a
  // directory, and never over the file the trace was read from.
  if (const std::string p = detail::output_file_problem(path); !p.empty())
    throw error("write_trace: '" + path + "' " + p);
  std::error_code same_ec;
  if (!t.source().empty() && std::filesystem::equivalent(path, t.source(), same_ec))
    throw error("write_trace: '" + path +
                "' is the file this trace was read from; expected another file "
                "(writing it would replace the input)");
  std::ostringstream bytes;
  {
    py::gil_scoped_release nogil;
    if (format == "csv") write_route_trace_csv(t.trace(), bytes);
    else write_route_trace_binary(t.trace(), bytes);
  }
  const std::string data = std::move(bytes).str();
  // A temporary file of our own beside the target, renamed over it: a failed write never
  // leaves a half file, and never touches a file we did not create. Errors name the target.
  std::string tmp = path + ".XXXXXX";
  const int fd = ::mkstemp(&tmp[0]);
  if (fd < 0) raise_os_error(path);
  const mode_t mask = ::umask(0);  // mkstemp makes 0600; give the file what open() would
  ::umask(mask);
  ::fchmod(fd, 0666 & ~mask);
  int failed = 0;
  {
    py::gil_scoped_release nogil;
    for (std::size_t off = 0; off < data.size() && !failed;) {
      const ssize_t n = ::write(fd, data.data() + off, data.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) failed = n < 0 ? errno : EIO;
      else off += static_cast<std::size_t>(n);
    }
    if (::close(fd) != 0 && !failed) failed = errno;
    if (!failed && ::rename(tmp.c_str(), path.c_str()) != 0) failed = errno;
    if (failed) ::unlink(tmp.c_str());
  }
  if (failed) {
    errno = failed;
    raise_os_error(path);
  }
}

}  // namespace

void bind_trace(py::module_& m) {
  py::class_<model_shape>(m, "ModelShape", "A model's MoE shape: experts, top-k and per-layer expert bytes")
      .def_property_readonly("name", &model_shape::name)
      .def_property_readonly("n_layers", &model_shape::n_layers, "layers, dense ones included")
      .def_property_readonly("n_moe_layers", &model_shape::n_moe_layers)
      .def_property_readonly("n_experts", &model_shape::n_experts)
      .def_property_readonly("top_k", &model_shape::top_k)
      .def_property_readonly(
          "expert_bytes", [](const model_shape& s) { return column(s.all_expert_bytes()); },
          "bytes of one expert, per layer (0 for a dense layer)")
      .def(
          "is_moe",
          [](const model_shape& s, const py::object& layer) {
            if (PyBool_Check(layer.ptr()) || !PyIndex_Check(layer.ptr()))
              throw py::type_error("is_moe: layer: " + py::repr(layer).cast<std::string>() + " is " +
                                   type_phrase(layer) + "; expected a layer number (int)");
            const py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(layer.ptr()));
            if (!i) throw py::error_already_set();
            int overflow = 0;  // beyond a long long: outside any model
            const long long l = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
            return overflow == 0 && l >= 0 && static_cast<unsigned long long>(l) < s.n_layers() &&
                   s.is_moe(layer_id(static_cast<std::uint16_t>(l)));
          },
          py::arg("layer"), "whether layer `layer` is an MoE layer (False outside the model)")
      .def_property_readonly(
          "token_cycle_bytes", [](const model_shape& s) { return token_cycle_bytes(s); },
          "bytes one decode token routes: every MoE layer's top-k experts")
      .def("__repr__", [](const model_shape& s) {
        return "<ModelShape " + s.name() + ": " + std::to_string(s.n_layers()) + " layers (" +
               std::to_string(s.n_moe_layers()) + " MoE), " + std::to_string(s.n_experts()) + " experts, top-" +
               std::to_string(s.top_k()) + ">";
      });

  py::class_<trace_object, std::shared_ptr<trace_object>>(
      m, "Trace",
      "A route trace: one row per routed expert. The row fields are read-only numpy views of the "
      "trace's own memory (no copy); they stay valid as long as any of them or the trace is alive.")
      .def("__len__", [](const trace_object& t) { return t.trace().rows().size(); })
      .def_property_readonly("source", &trace_object::source, "the path it was read from")
      .def_property_readonly("shape", &trace_object::shape)
      .def_property_readonly("model", [](const trace_object& t) { return t.trace().header().model; })
      .def_property_readonly("arch", [](const trace_object& t) { return t.trace().header().arch; })
      .def_property_readonly("n_layer", [](const trace_object& t) { return t.trace().header().n_layer; })
      .def_property_readonly("n_expert", [](const trace_object& t) { return t.trace().header().n_expert; })
      .def_property_readonly("n_expert_used", [](const trace_object& t) { return t.trace().header().n_expert_used; })
      .def_property_readonly(
          "expert_bytes", [](const trace_object& t) { return column(t.trace().header().expert_bytes); },
          "per layer, from the '# layer=' lines (0 where there is none)")
      .def_property_readonly("dense_bytes",
                             [](const trace_object& t) { return column(t.trace().header().dense_bytes); })
      .def_property_readonly("has_dropped_column",
                             [](const trace_object& t) { return t.trace().header().has_dropped_column; })
      .def_property_readonly(
          "noncanonical_weights", [](const trace_object& t) { return t.trace().noncanonical_weights(); },
          "CSV weights not in the engine's %g form (kept as the nearest float)")
      .def_property_readonly("decode_tokens", [](const trace_object& t) { return t.routed_input().decode_tokens(); })
      .def_property_readonly("turn",
                             [](py::object self) {
                               return field_view<std::uint32_t>(self.cast<const trace_object&>(),
                                                                offsetof(trace_row, turn), self);
                             })
      .def_property_readonly(
          "step",
          [](py::object self) {
            return field_view<std::uint32_t>(self.cast<const trace_object&>(), offsetof(trace_row, step), self);
          },
          "the token's absolute position")
      .def_property_readonly(
          "weight",
          [](py::object self) {
            return field_view<float>(self.cast<const trace_object&>(), offsetof(trace_row, weight), self);
          },
          "the final applied routing weight (may be NaN)")
      .def_property_readonly("layer",
                             [](py::object self) {
                               return field_view<std::uint16_t>(self.cast<const trace_object&>(),
                                                                offsetof(trace_row, layer), self);
                             })
      .def_property_readonly("expert",
                             [](py::object self) {
                               return field_view<std::uint16_t>(self.cast<const trace_object&>(),
                                                                offsetof(trace_row, expert), self);
                             })
      .def_property_readonly(
          "slot",
          [](py::object self) {
            return field_view<std::uint8_t>(self.cast<const trace_object&>(), offsetof(trace_row, slot), self);
          },
          "rank in the routing, 0 = highest weight")
      .def_property_readonly(
          "phase",
          [](py::object self) {
            return field_view<std::uint8_t>(self.cast<const trace_object&>(), offsetof(trace_row, phase), self);
          },
          "0 prefill, 1 decode")
      .def_property_readonly(
          "residency",
          [](py::object self) {
            return field_view<std::uint8_t>(self.cast<const trace_object&>(), offsetof(trace_row, residency), self);
          },
          "0 miss, 1 hit, 2 hit thanks to a speculative read")
      .def_property_readonly(
          "dropped",
          [](py::object self) {
            return field_view<std::int8_t>(self.cast<const trace_object&>(), offsetof(trace_row, dropped), self);
          },
          "1 dropped, 0 not, -1 when the file has no dropped column")
      .def_property_readonly(
          "row_expert_bytes",
          [](py::object self) {
            return field_view<std::uint64_t>(self.cast<const trace_object&>(), offsetof(trace_row, expert_bytes), self);
          },
          "bytes this routing read: 0, or its layer's expert bytes")
      .def("__repr__", [](const trace_object& t) {
        return "<Trace " + t.source() + ": " + t.shape().name() + ", " + std::to_string(t.trace().rows().size()) +
               " rows>";
      });

  m.def("read_trace", &read_trace, py::arg("path"),
        "Reads a route trace, CSV or binary (told apart by the first byte). Raises OSError when the file cannot "
        "be read and ValueError, naming the line and column, when it is malformed.");
  m.def("write_trace", &write_trace, py::arg("trace"), py::arg("path"), py::arg("format") = "csv",
        "Writes a trace as CSV or binary, through a temporary file renamed over `path`.");
}

}  // namespace moe_residency_py
