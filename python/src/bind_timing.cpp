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
#include "moe_residency/timing/recorded_runs.hpp"

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
  d["requests_per_read"] = p.requests_per_read;
  d["pipelined_mgmt"] = p.pipelined_mgmt ? 1 : 0;
  d["compute_top_k"] = p.compute_top_k;
  d["mgmt_ms_per_lookup"] = p.mgmt_ms_per_lookup;
  d["compute_ms_per_fault"] = p.compute_ms_per_fault;
  d["faults_per_token"] = p.faults_per_token;
  d["faults_per_evicted_mib"] = p.faults_per_evicted_mib;
  d["compute_ms_per_read_mib"] = p.compute_ms_per_read_mib;
  d["noise_pct"] = p.noise_pct;
  return d;
}

py::dict tokens_dict(const std::vector<token_timing>& ts) {
  std::vector<double> wall, compute, stall, mgmt, wait, io, fault, contention, faults;
  std::vector<std::uint64_t> dem_b, spec_b;
  std::vector<std::uint32_t> dem_r, spec_r, canc, hits, lookups;
  for (const auto& t : ts) {
    wall.push_back(t.wall_ms);
    compute.push_back(t.compute_ms);
    stall.push_back(t.stall_ms);
    mgmt.push_back(t.mgmt_ms);
    wait.push_back(t.wait_ms);
    io.push_back(t.io_ms);
    fault.push_back(t.fault_ms);
    contention.push_back(t.contention_ms);
    faults.push_back(t.faults);
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
  d["fault_ms"] = column(fault);
  d["contention_ms"] = column(contention);
  d["faults"] = column(faults);
  d["demanded_bytes"] = column(dem_b);
  d["speculative_bytes"] = column(spec_b);
  d["demanded_reads"] = column(dem_r);
  d["speculative_reads"] = column(spec_r);
  d["speculative_cancelled"] = column(canc);
  d["hits"] = column(hits);
  d["lookups"] = column(lookups);
  return d;
}

py::dict summary_dict(const timing_summary& s) {
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
  summary["fault_ms_per_token"] = s.fault_ms_per_token;
  summary["contention_ms_per_token"] = s.contention_ms_per_token;
  summary["faults_per_token"] = s.faults_per_token;
  summary["io_ms_per_token"] = s.io_ms_per_token;
  return summary;
}

py::dict whatif(const trace_object& t, const py::object& config, double budget_mib, const std::string& policy,
                std::optional<double> drop, const std::string& speculate, std::optional<std::size_t> spec_cap,
                std::size_t horizon, std::optional<std::size_t> lanes, std::uint64_t seed,
                std::optional<std::size_t> k) {
  timing_params device = device_params(config);
  if (lanes) device.lanes = *lanes;
  // k_c: a device config without one measured C at the trace's top-k (as `moe-residency whatif`).
  if (device.compute_top_k == 0) device.compute_top_k = t.shape().top_k();
  device.validate();
  // Top-k: the trace's, or k (narrower replayed, wider modelled: timing/top_k.hpp).
  top_k_change change{t.shape().top_k(), t.shape().top_k(), false, seed, 0, 0};
  std::optional<routed_replay_input> other;
  if (k && *k != t.shape().top_k()) {
    if (*k < 1 || *k > 32) throw error("whatif: k " + std::to_string(*k) + "; expected 1 to 32 experts per routing");
    other.emplace(routed_replay_input::from_trace(with_top_k(t.trace().trace(), *k, seed, &change).trace()));
  }
  const routed_replay_input& in = other ? *other : t.routed_input();
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
  py::dict summary = summary_dict(r.summary);
  py::dict d;
  d["tokens"] = tokens_dict(r.tokens);
  d["summary"] = summary;
  d["params"] = params_dict(device);
  d["policy"] = r.replay.options.policy;
  d["budget_mib"] = budget_mib;
  d["speculate"] = speculate;
  d["spec_cap"] = o.speculation.cap;
  d["warning"] = r.replay.warning;
  d["top_k"] = in.shape().top_k();
  d["top_k_modelled"] = change.modelled;
  return d;
}

/// The runs of `files` (paths), each completed by configs[i] (a key=value,... string; empty
/// list: none), with `budget_mib` for a run whose header gives no cache budget.
std::vector<recorded_run> read_runs(const std::vector<py::object>& files, const std::vector<std::string>& configs,
                                    const char* what, std::optional<double> budget_mib) {
  if (!configs.empty() && configs.size() != files.size())
    throw error(std::string("calibrate: ") + std::to_string(configs.size()) + " " + what + " configurations for " +
                std::to_string(files.size()) + " files; expected one per file, in order, or none");
  std::vector<recorded_run> runs;
  for (std::size_t i = 0; i < files.size(); ++i) {
    const std::string path = fspath(files[i], what);
    const std::string text = read_file(path, detail::text_head(path, "a text file"));
    run_config given;
    if (!configs.empty()) given = parse_run_config_list(configs[i], std::string(what) + " configuration " + path);
    const run_config header = merge_run_config(parse_run_config(text, path), given, path);
    if (budget_mib && header.cache_mib && *header.cache_mib != *budget_mib)
      throw error("calibrate: budget_mib " + detail::show_number(*budget_mib) + ": " + path + " says cache_mb=" +
                  detail::show_number(*header.cache_mib) + "; expected the run's own budget, or none");
    if (budget_mib && !header.cache_mib) given.cache_mib = *budget_mib;
    runs.push_back(parse_recorded_run(text, path, given));
  }
  return runs;
}

py::dict score_dict(const calibration_score& s) {
  py::dict d;
  d["set"] = s.set;
  d["tokens"] = s.tokens;
  d["mean_recorded_ms"] = s.mean_recorded_ms;
  d["mean_predicted_ms"] = s.mean_predicted_ms;
  d["median_abs_err_pct"] = s.median_abs_err_pct;
  return d;
}

unsigned free_mask(const std::vector<std::string>& names) {
  static const std::pair<const char*, timing_param> table[] = {{"compute", timing_param::compute_ms_per_token},
                                                               {"latency", timing_param::read_latency_ms},
                                                               {"overlap", timing_param::overlap},
                                                               {"mgmt", timing_param::mgmt_ms_per_read},
                                                               {"eviction", timing_param::mgmt_ms_per_eviction},
                                                               {"bandwidth", timing_param::bandwidth_scale},
                                                               {"kernel", timing_param::read_cpu_ms_per_mib},
                                                               {"share", timing_param::expert_compute_share},
                                                               {"faults", timing_param::compute_ms_per_fault},
                                                               {"contention", timing_param::compute_ms_per_read_mib},
                                                               {"lookup", timing_param::mgmt_ms_per_lookup}};
  unsigned mask = 0;
  for (const std::string& n : names) {
    bool found = false;
    for (const auto& [name, id] : table)
      if (n == name) mask |= static_cast<unsigned>(id), found = true;
    if (!found)
      throw error("calibrate: free '" + n +
                  "'; expected compute, latency, overlap, mgmt, eviction, bandwidth, kernel, share, faults, "
                  "contention or lookup");
  }
  return mask;
}

py::dict calibrate(const trace_object& t, const std::vector<py::object>& metrics, std::optional<double> budget_mib,
                   const std::string& policy, const py::object& config, const std::string& split, bool fit_io,
                   const std::vector<std::string>& run_configs, const std::vector<py::object>& predict,
                   const std::vector<std::string>& predict_configs, const std::string& pair,
                   std::optional<std::vector<std::string>> free, std::optional<std::size_t> requests_per_read,
                   bool pipelined_mgmt, const py::object& expert_share, std::optional<double> noise_pct,
                   std::uint64_t seed) {
  calibration_options co;
  if (split == "halves") co.split = calibration_split::halves;
  else if (split == "interleaved") co.split = calibration_split::interleaved;
  else if (split == "all") co.split = calibration_split::all;
  else
    throw error("calibrate: split '" + split +
                "'; expected 'halves' (first half fitted, second held out), 'interleaved' or 'all'");
  pairing_choice pc = pairing_choice::automatic;
  if (pair == "step") pc = pairing_choice::step;
  else if (pair == "volume") pc = pairing_choice::volume;
  else if (pair != "auto") throw error("calibrate: pair '" + pair + "'; expected 'auto', 'step' or 'volume'");
  if (free) co.free = free_mask(*free);
  if (fit_io) {
    co.fit_io = true;
    co.free |= static_cast<unsigned>(timing_param::bandwidth_scale);
  }
  timing_params start = device_params(config);
  if (requests_per_read) start.requests_per_read = *requests_per_read;
  if (pipelined_mgmt) start.pipelined_mgmt = true;
  if (!expert_share.is_none()) {
    if (py::isinstance<py::str>(expert_share) && expert_share.cast<std::string>() == "bytes")
      start.expert_compute_share = expert_share_from_bytes(t.trace().header());
    else if (py::isinstance<py::str>(expert_share) && expert_share.cast<std::string>() == "fit")
      co.free |= static_cast<unsigned>(timing_param::expert_compute_share);
    else if (py::isinstance<py::float_>(expert_share) || py::isinstance<py::int_>(expert_share))
      start.expert_compute_share = expert_share.cast<double>();
    else
      throw py::type_error("calibrate: expert_share " + py::repr(expert_share).cast<std::string>() +
                           "; expected 'bytes', 'fit' or a share in [0, 1]");
  }
  start.validate();
  if (metrics.empty()) throw error("calibrate: no metrics file; expected a path or a list of paths");
  const std::vector<recorded_run> runs = read_runs(metrics, run_configs, "metrics", budget_mib);
  const std::vector<recorded_run> held = read_runs(predict, predict_configs, "predict", std::nullopt);
  const route_trace& trace = t.trace().trace();
  runs_calibration rc;
  std::vector<run_prediction> preds;
  {
    py::gil_scoped_release nogil;
    rc = calibrate_recorded_runs(trace, runs, start, co, policy, pc, seed);
    for (const recorded_run& r : runs)
      preds.push_back(predict_recorded_run(trace, r, rc.result.params, rc.weights, policy, seed));
    for (const recorded_run& r : held)
      preds.push_back(predict_recorded_run(trace, r, rc.result.params, rc.weights, policy, seed));
  }
  const calibration_result& c = rc.result;
  const double noise = noise_pct ? *noise_pct : c.params.noise_pct;
  py::dict d;
  d["params"] = params_dict(c.params);
  d["config_text"] = format_timing_config(c.params);
  d["free"] = c.free;
  d["fit"] = score_dict(c.fit);
  d["held_out"] = score_dict(c.held_out);
  d["predicted_ms"] = column(c.predicted_ms);
  std::vector<double> recorded;
  for (const recorded_run& r : runs)
    recorded.insert(recorded.end(), r.metrics.wall_ms.begin(), r.metrics.wall_ms.end());
  d["recorded_ms"] = column(recorded);
  d["in_fit"] = column(c.in_fit);
  d["iterations"] = c.iterations;
  d["rms_ms"] = c.rms_ms;
  d["compute_floor_pct"] = c.compute_floor_pct;
  d["noise_pct"] = noise;
  d["token_weights"] = column(rc.weights);
  py::list rl;
  for (std::size_t i = 0; i < preds.size(); ++i) {
    const run_prediction& p = preds[i];
    py::dict r;
    r["source"] = p.source;
    r["fitted"] = i < runs.size();
    r["budget_mib"] = p.setup.budget_mib;
    r["lanes"] = p.setup.lanes ? p.setup.lanes : c.params.lanes;
    r["top_k"] = p.setup.top_k;
    r["top_k_modelled"] = p.top_k.modelled;
    r["measured_ms"] = p.measured_ms;
    r["predicted_ms"] = p.predicted_ms;
    r["summary"] = summary_dict(p.summary);
    if (i < runs.size()) {
      r["pairing"] = to_string(rc.pairings[i].how);
      r["fit"] = score_dict(c.runs[i].fit);
      r["held_out"] = score_dict(c.runs[i].held_out);
    }
    const ab_comparison ab = compare_runs(p, preds[0], std::isfinite(noise) ? noise : 0.0);
    r["measured_ratio"] = ab.measured.ratio;
    r["predicted_ratio"] = ab.predicted.ratio;
    r["ratio_err_pct"] = ab.ratio_err_pct;
    r["err_pct"] = ab.err_pct;
    r["sign_right"] = ab.sign_right;
    r["measured_verdict"] = to_string(ab.measured.verdict);
    r["predicted_verdict"] = to_string(ab.predicted.verdict);
    rl.append(r);
  }
  d["runs"] = rl;
  return d;
}

py::dict verdict(double time_ms, double baseline_ms, double noise_pct) {
  const ratio_verdict v = judge_ratio(time_ms, baseline_ms, noise_pct);
  py::dict d;
  d["ratio"] = v.ratio;
  d["noise_pct"] = v.noise_pct;
  d["verdict"] = to_string(v.verdict);
  return d;
}

}  // namespace

void bind_timing(py::module_& m) {
  m.def("_whatif", &whatif, py::arg("trace"), py::arg("config"), py::arg("budget_mib"), py::arg("policy"),
        py::arg("drop"), py::arg("speculate"), py::arg("spec_cap"), py::arg("horizon"), py::arg("lanes"),
        py::arg("seed"), py::arg("k"));
  m.def("_calibrate", &calibrate, py::arg("trace"), py::arg("metrics"), py::arg("budget_mib"), py::arg("policy"),
        py::arg("config"), py::arg("split"), py::arg("fit_io"), py::arg("run_configs"), py::arg("predict"),
        py::arg("predict_configs"), py::arg("pair"), py::arg("free"), py::arg("requests_per_read"),
        py::arg("pipelined_mgmt"), py::arg("expert_share"), py::arg("noise_pct"), py::arg("seed"));
  m.def("_verdict", &verdict, py::arg("time_ms"), py::arg("baseline_ms"), py::arg("noise_pct"));
  m.def(
      "timing_params", [](const py::object& config) { return params_dict(device_params(config)); },
      py::arg("config") = py::none(),
      "The wall-clock model's parameters of a config (a path or a dict), defaults filled in, as a dict.");
}

}  // namespace moe_residency_py
