// The wall-clock model in Python: whatif (a replay's predicted per-token
// times on a device) and calibrate (fit the model to recorded per-token metrics).

#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "moe_residency/timing.hpp"
#include "moe_residency/timing/calibrate.hpp"

namespace moe_residency_py {

namespace {

using namespace moe_residency;

/// A device: a config file's path, or a {key: value} mapping in the config's
/// own keys (one parser, one set of checks either way).
// One value of a config dict as the config file's text: a number (int, float, numpy
// scalar) at full precision, or a string of one line.
std::string config_value(const std::string& key, py::handle v) {
  auto bad = [&](const std::string& what) {
    return py::type_error("config['" + key + "']: " + what + "; expected a number, a string of one line" +
                          (key == "curve" ? " or a {lanes: MiB/s} dict" : ""));
  };
  if (py::isinstance<py::str>(v)) {
    const std::string s = v.cast<std::string>();
    if (s.find_first_of("\n\r#") != std::string::npos) throw bad("'" + s + "' holds a line break or '#'");
    return s;
  }
  if (PyBool_Check(v.ptr())) throw bad("a bool");
  if (PyIndex_Check(v.ptr())) return py::str(py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr())));
  if (PyFloat_Check(v.ptr()) || PyNumber_Check(v.ptr())) {
    const double d = PyFloat_AsDouble(v.ptr());
    if (d == -1.0 && PyErr_Occurred()) throw py::error_already_set();
    return detail::format_printf("%.17g", d);
  }
  throw bad("a " + py::str(py::type::handle_of(v).attr("__name__")).cast<std::string>());
}

/// A device: a config file's path, or a {key: value} mapping in the config's
/// own keys (one parser, one set of checks either way).
timing_params device_params(const py::object& config) {
  if (config.is_none()) return timing_params{};
  if (py::isinstance<py::dict>(config)) {
    std::string text;
    for (auto kv : config.cast<py::dict>()) {
      if (!py::isinstance<py::str>(kv.first))
        throw py::type_error("config: key " + py::repr(kv.first).cast<std::string>() + "; expected a str");
      const std::string key = kv.first.cast<std::string>();
      std::string value;
      if (py::isinstance<py::dict>(kv.second)) {  // curve = {lanes: MiB/s}
        for (auto p : kv.second.cast<py::dict>())
          value += (value.empty() ? "" : ",") + config_value(key, p.first) + ":" + config_value(key, p.second);
      } else {
        value = config_value(key, kv.second);
      }
      if (key.find_first_of("\n\r#= ") != std::string::npos)
        throw py::type_error("config: key '" + key + "' holds a space, '=', '#' or a line break");
      text += key + " = " + value + "\n";
    }
    // An empty dict asks for every default in so many words (a config file
    // without settings is refused: there it is more likely a mistake).
    return text.empty() ? timing_params{} : parse_timing_config(text, "config");
  }
  const std::string path = fspath(config, "config");
  return parse_timing_config(read_file(path, detail::text_head(path, "a text file")), path);
}

py::dict params_dict(const timing_params& p) {
  py::dict d, curve;
  for (const auto& pt : p.curve.points()) curve[py::float_(pt.first)] = py::float_(pt.second);
  d["lanes"] = p.lanes;
  d["curve"] = curve;
  d["read_latency_ms"] = p.read_latency_ms;
  d["bandwidth_scale"] = p.bandwidth_scale;
  d["compute_ms_per_token"] = p.compute_ms_per_token;
  d["expert_compute_share"] = p.expert_compute_share;
  d["overlap"] = p.overlap;
  d["mgmt_ms_per_read"] = p.mgmt_ms_per_read;
  d["mgmt_ms_per_eviction"] = p.mgmt_ms_per_eviction;
  d["read_cpu_ms_per_mib"] = p.read_cpu_ms_per_mib;
  d["mgmt_ms_per_request"] = p.mgmt_ms_per_request;
  d["mgmt_ms_per_pin"] = p.mgmt_ms_per_pin;
  d["fault_bandwidth_scale"] = p.fault_bandwidth_scale;
  d["kernel_overlap"] = p.kernel_overlap;
  return d;
}

py::dict tokens_dict(const std::vector<token_timing>& ts) {
  std::vector<double> wall, compute, stall, mgmt, wait, io;
  std::vector<std::uint64_t> dem_b, spec_b;
  std::vector<std::uint32_t> dem_r, spec_r, canc, hits, lookups;
  for (const auto& t : ts) {
    wall.push_back(t.wall_ms);
    compute.push_back(t.compute_ms);
    stall.push_back(t.stall_ms);
    mgmt.push_back(t.mgmt_ms);
    wait.push_back(t.wait_ms);
    io.push_back(t.io_ms);
    dem_b.push_back(t.demanded_bytes);
    spec_b.push_back(t.speculative_bytes);
    dem_r.push_back(t.demanded_reads);
    spec_r.push_back(t.speculative_reads);
    canc.push_back(t.speculative_cancelled);
    hits.push_back(t.hits);
    lookups.push_back(t.lookups);
  }
  py::dict d;
  d["wall_ms"] = column(wall);
  d["compute_ms"] = column(compute);
  d["stall_ms"] = column(stall);
  d["mgmt_ms"] = column(mgmt);
  d["wait_ms"] = column(wait);
  d["io_ms"] = column(io);
  d["demanded_bytes"] = column(dem_b);
  d["speculative_bytes"] = column(spec_b);
  d["demanded_reads"] = column(dem_r);
  d["speculative_reads"] = column(spec_r);
  d["speculative_cancelled"] = column(canc);
  d["hits"] = column(hits);
  d["lookups"] = column(lookups);
  return d;
}

py::dict whatif(const trace_object& t, const py::object& config, double budget_mib, const std::string& policy,
                std::optional<double> drop, const std::string& speculate, std::optional<std::size_t> spec_cap,
                std::size_t horizon, std::optional<std::size_t> lanes, std::uint64_t seed) {
  timing_params device = device_params(config);
  if (lanes) device.lanes = *lanes;
  device.validate();
  const routed_replay_input& in = t.routed_input();
  dynamic_replay_options o;
  o.policy = policy;
  o.budget_mib = budget_mib;
  o.drop = drop;
  o.seed = seed;
  // "full": the true next routing, all of it (oracle:1 at cap k), as `moe-residency whatif` reads it.
  o.speculation = parse_replay_speculation(speculate == "full" ? "oracle:1" : speculate);
  o.speculation.cap = spec_cap              ? *spec_cap
                      : speculate == "full" ? in.shape().top_k()
                                            : speculation_planner::default_cap;
  o.speculation.horizon = horizon;
  o.speculation.seed = seed;
  timed_replay r;
  {
    py::gil_scoped_release nogil;
    r = predict_timing(in, o, device);
  }
  const timing_summary& s = r.summary;
  py::dict summary;
  summary["tokens"] = s.tokens;
  summary["s_per_token"] = s.s_per_token;
  summary["tok_per_s"] = s.tok_per_s;
  summary["stall_ms_per_token"] = s.stall_ms_per_token;
  summary["mgmt_ms_per_token"] = s.mgmt_ms_per_token;
  summary["compute_ms_per_token"] = s.compute_ms_per_token;
  summary["demanded_mib_per_token"] = s.demanded_mib_per_token;
  summary["speculative_mib_per_token"] = s.speculative_mib_per_token;
  summary["speculative_cancelled_per_token"] = s.speculative_cancelled_per_token;
  summary["hit_pct"] = s.hit_pct;
  py::dict d;
  d["tokens"] = tokens_dict(r.tokens);
  d["summary"] = summary;
  d["params"] = params_dict(device);
  d["policy"] = r.replay.options.policy;
  d["budget_mib"] = budget_mib;
  d["speculate"] = speculate;
  d["spec_cap"] = o.speculation.cap;
  d["warning"] = r.replay.warning;
  return d;
}

py::dict calibrate(const trace_object& t, const py::object& metrics, double budget_mib, const std::string& policy,
                   const py::object& config, const std::string& split, bool fit_io) {
  calibration_options co;
  if (split == "halves") co.split = calibration_split::halves;
  else if (split == "interleaved") co.split = calibration_split::interleaved;
  else if (split == "all") co.split = calibration_split::all;
  else
    throw error("calibrate: split '" + split +
                "'; expected 'halves' (first half fitted, second held out), 'interleaved' or 'all'");
  if (fit_io) {
    co.fit_io = true;
    co.free |= static_cast<unsigned>(timing_param::bandwidth_scale);
  }
  const timing_params start = device_params(config);
  const std::string metrics_path = fspath(metrics, "metrics");
  const token_metrics m =
      parse_token_metrics(read_file(metrics_path, detail::text_head(metrics_path, "a text file")), metrics_path);
  const routed_replay_input& in = t.routed_input();
  dynamic_replay_options o;
  o.policy = policy;
  o.budget_mib = budget_mib;
  calibration_result c;
  {
    py::gil_scoped_release nogil;
    const dynamic_replay_result r = replay_dynamic(in, o);
    c = calibrate_timing(in.shape(), r.decode_loads, m, start, co);
  }
  auto score = [](const calibration_score& s) {
    py::dict d;
    d["set"] = s.set;
    d["tokens"] = s.tokens;
    d["mean_recorded_ms"] = s.mean_recorded_ms;
    d["mean_predicted_ms"] = s.mean_predicted_ms;
    d["median_abs_err_pct"] = s.median_abs_err_pct;
    return d;
  };
  py::dict d;
  d["params"] = params_dict(c.params);
  d["config_text"] = format_timing_config(c.params);
  d["free"] = c.free;
  d["fit"] = score(c.fit);
  d["held_out"] = score(c.held_out);
  d["predicted_ms"] = column(c.predicted_ms);
  d["recorded_ms"] = column(m.wall_ms);
  d["in_fit"] = column(c.in_fit);
  d["iterations"] = c.iterations;
  d["rms_ms"] = c.rms_ms;
  d["compute_floor_pct"] = c.compute_floor_pct;
  return d;
}

}  // namespace

void bind_timing(py::module_& m) {
  m.def("_whatif", &whatif, py::arg("trace"), py::arg("config"), py::arg("budget_mib"), py::arg("policy"),
        py::arg("drop"), py::arg("speculate"), py::arg("spec_cap"), py::arg("horizon"), py::arg("lanes"),
        py::arg("seed"));
  m.def("_calibrate", &calibrate, py::arg("trace"), py::arg("metrics"), py::arg("budget_mib"), py::arg("policy"),
        py::arg("config"), py::arg("split"), py::arg("fit_io"));
  m.def(
      "timing_params", [](const py::object& config) { return params_dict(device_params(config)); },
      py::arg("config") = py::none(),
      "The wall-clock model's parameters of a config (a path or a dict), defaults filled in, as a dict.");
}

}  // namespace moe_residency_py
