// Replay and scoring in Python: a policy x budget grid through the library's
// replay (threads, GIL released), the dynamic replay (drop, speculation),
// policies written in Python, and the history predictors' scores.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "moe_residency/predict/history.hpp"

namespace moe_residency_py {

namespace {

using namespace moe_residency;

// ---- policies written in Python ------------------------------------------

/// The view a Python policy's victim() gets: valid only during that call.
struct python_cache_view {
  const cache_view* view = nullptr;
  std::uint32_t n_experts = 0, n_slots = 0;

  const cache_view& get() const {
    if (!view)
      throw error("CacheView: used after victim() returned; it is valid only during the call it was passed to");
    return *view;
  }
  std::uint32_t slot(long long s) const {
    if (s < 0 || s >= static_cast<long long>(n_slots))
      throw error("CacheView: slot " + std::to_string(s) + " out of range [0, " + std::to_string(n_slots) +
                  "); a slot is layer * n_experts + expert");
    return static_cast<std::uint32_t>(s);
  }
  /// A slot passed by Python to `method`: an int or anything with __index__
  /// (a numpy integer), not a bool; TypeError naming the method otherwise.
  std::uint32_t slot(const py::handle& s, const char* method) const {
    if (PyBool_Check(s.ptr()) || !PyIndex_Check(s.ptr()))
      throw py::type_error(std::string("CacheView.") + method + ": slot " + py::repr(s).cast<std::string>() + " is " +
                           type_phrase(s) + "; expected a slot (int): layer * n_experts + expert");
    const py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(s.ptr()));
    if (!i) throw py::error_already_set();
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
    return slot(overflow ? -1 : v);
  }
};

/// The first error a Python policy raised, kept until the replay ends: the
/// cache calls its hooks from noexcept code, so the error cannot unwind there.
struct python_failure {
  std::exception_ptr error;
  bool failed() const noexcept { return static_cast<bool>(error); }
};

/// The cache-policy contract (cache/policy_contract.hpp) implemented by a
/// Python object. Every hook but victim() is optional; over_budget() defaults
/// to the global byte budget without calling Python. Called with the GIL held.
class python_policy : public policy_base {
 public:
  static constexpr const char* name = "python";
  // The token-cycle guard is the policy's author's business: the cell runs.
  static constexpr bool collapses_below_cycle = false;

  python_policy(py::object obj, std::string label, python_failure* failure)
      : obj_(std::move(obj)), label_(std::move(label)), failure_(failure) {
    auto method = [&](const char* n) -> py::object {
      if (!py::hasattr(obj_, n)) return py::object();
      py::object f = obj_.attr(n);
      return f.is_none() ? py::object() : f;
    };
    victim_ = method("victim");
    if (!victim_)
      throw py::type_error("policy " + label_ +
                           ": no victim(view, layer) method; a policy needs victim() and may define init, "
                           "on_batch_begin, on_hit, on_repeat, on_insert, on_evict, over_budget and on_batch_end");
    init_ = method("init");
    batch_begin_ = method("on_batch_begin");
    hit_ = method("on_hit");
    repeat_ = method("on_repeat");
    insert_ = method("on_insert");
    evict_ = method("on_evict");
    over_ = method("over_budget");
    batch_end_ = method("on_batch_end");
  }

  void init(const model_shape& shape, std::uint64_t budget) {
    view_state_ = python_cache_view{nullptr, static_cast<std::uint32_t>(shape.n_experts()),
                                    static_cast<std::uint32_t>(shape.n_layers() * shape.n_experts())};
    view_ = py::cast(view_state_);
    if (init_) init_(shape, budget);  // may raise: the cache's constructor throws it on
  }
  void on_batch_begin(run_phase p, std::size_t layer) noexcept {
    call(batch_begin_, p == run_phase::decode ? "decode" : "prefill", layer);
  }
  void on_hit(std::uint32_t s) noexcept { call(hit_, s); }
  void on_repeat(std::uint32_t s) noexcept { call(repeat_, s); }
  void on_insert(std::uint32_t s) noexcept { call(insert_, s); }
  void on_evict(std::uint32_t s) noexcept { call(evict_, s); }
  void on_batch_end(std::size_t layer) noexcept { call(batch_end_, layer); }

  bool over_budget(const cache_view& v, std::size_t layer) noexcept {
    if (failure_->failed()) return false;  // stop evicting: the replay ends in an exception
    if (!over_) return v.used_bytes() > v.budget_bytes();
    bool out = false;
    with_view(v, [&] {
      const int truth = PyObject_IsTrue(over_(view_, layer).ptr());
      if (truth < 0) throw py::error_already_set();
      out = truth == 1;
    });
    return out;
  }

  std::uint32_t victim(const cache_view& v, std::size_t layer) noexcept {
    if (failure_->failed()) return no_slot;
    std::uint32_t out = no_slot;
    with_view(v, [&] {
      py::object r = victim_(view_, layer);
      if (r.is_none()) return;  // nothing may be evicted: the cache stays over its budget
      const long long s = slot_number(r, "victim()");
      const std::uint32_t slot = view_state_.slot(s);
      if (!v.evictable(slot))
        throw error("policy " + label_ + ": victim() returned slot " + std::to_string(s) + " (layer " +
                    std::to_string(slot / view_state_.n_experts) + ", expert " +
                    std::to_string(slot % view_state_.n_experts) + "), which is " +
                    (v.resident(slot) ? "pinned or in the current batch" : "not resident") +
                    "; expected a slot with view.evictable(slot), or None");
      out = slot;
    });
    return out;
  }

 private:
  // A slot from Python: an int or anything with __index__ (numpy integers), not a bool.
  long long slot_number(const py::object& r, const char* hook) const {
    auto type_name = [&] { return py::str(py::type::handle_of(r).attr("__name__")).cast<std::string>(); };
    if (PyBool_Check(r.ptr()) || !PyIndex_Check(r.ptr()))
      throw py::type_error("policy " + label_ + ": " + hook + " returned a " + type_name() +
                           "; expected a slot (int) or None");
    py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(r.ptr()));
    if (!i) throw py::error_already_set();
    int overflow = 0;
    const long long s = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
    if (overflow)
      throw error("policy " + label_ + ": " + hook + " returned " + py::str(r).cast<std::string>() +
                  ", out of range; expected a slot layer * n_experts + expert below " +
                  std::to_string(view_state_.n_slots));
    return s;
  }
  template <class F, class... A>
  void guarded(F&& f) noexcept {
    try {
      f();
    } catch (...) {
      failure_->error = std::current_exception();
    }
  }
  template <class... A>
  void call(const py::object& f, A&&... a) noexcept {
    if (!f || failure_->failed()) return;
    guarded([&] { f(std::forward<A>(a)...); });
  }
  template <class F>
  void with_view(const cache_view& v, F&& f) noexcept {
    auto& state = view_.cast<python_cache_view&>();
    state.view = &v;
    guarded(f);
    state.view = nullptr;
  }

  py::object obj_;
  std::string label_;
  python_failure* failure_;
  py::object victim_, init_, batch_begin_, hit_, repeat_, insert_, evict_, over_, batch_end_;
  python_cache_view view_state_;
  py::object view_;
};

std::string policy_label(const py::handle& p) {
  if (py::hasattr(p, "name") && py::isinstance<py::str>(p.attr("name"))) return p.attr("name").cast<std::string>();
  if (py::hasattr(p, "__name__")) return p.attr("__name__").cast<std::string>();
  return py::str(py::type::handle_of(p).attr("__name__")).cast<std::string>();
}

/// One cell of a Python policy: `factory()` makes a fresh policy object.
replay_result replay_python_cell(const trace_object& t, const py::object& factory, const std::string& label,
                                 double budget_mib, const replay_options& o) {
  check_replay_cell("lru", budget_mib);  // the budget's check (the name is ours)
  replay_result r;
  r.policy = label;
  r.budget_mib = budget_mib;
  r.budget_bytes = from_mib(budget_mib);
  python_failure failure;
  const auto t0 = std::chrono::steady_clock::now();
  detail::replay_run(t.replay_input(), python_policy(factory(), label, &failure), r, o, detail::replay_predictor::none);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (failure.failed()) std::rethrow_exception(failure.error);
  return r;
}

py::dict replay_columns(const std::vector<replay_result>& rs) {
  std::vector<double> budget, cum, dec, read, peak, secs;
  std::vector<std::uint64_t> lookups, hits, dlookups, dhits, evictions, cycle;
  std::vector<bool> below;
  py::list policy, warning;
  for (const auto& r : rs) {
    budget.push_back(r.budget_mib);
    policy.append(r.policy);
    cum.push_back(r.hit_pct_cum());
    dec.push_back(r.hit_pct_decode());
    read.push_back(r.read_mib());
    lookups.push_back(r.stats.all.lookups);
    hits.push_back(r.stats.all.hits);
    dlookups.push_back(r.stats.decode.lookups);
    dhits.push_back(r.stats.decode.hits);
    evictions.push_back(r.stats.all.evictions);
    peak.push_back(to_mib(r.stats.peak_bytes));
    cycle.push_back(r.token_cycle_bytes);
    below.push_back(r.budget_bytes < r.token_cycle_bytes);
    secs.push_back(r.seconds);
    warning.append(r.warning);
  }
  py::dict d;
  d["budget_mib"] = column(budget);
  d["policy"] = policy;
  d["hit_pct_cum"] = column(cum);
  d["hit_pct_decode"] = column(dec);
  d["read_mib"] = column(read);
  d["lookups"] = column(lookups);
  d["hits"] = column(hits);
  d["decode_lookups"] = column(dlookups);
  d["decode_hits"] = column(dhits);
  d["evictions"] = column(evictions);
  d["peak_resident_mib"] = column(peak);
  d["token_cycle_bytes"] = column(cycle);
  d["below_token_cycle"] = column(below);
  d["seconds"] = column(secs);
  d["warning"] = warning;
  return d;
}

/// One of `names`, or ValueError worded as the tool's choices are:
///   adaptive_scope: 'both' is not a choice; expected global or layer
std::string choice(const std::string& name, const std::string& value, const std::vector<std::string>& names) {
  for (const std::string& n : names)
    if (value == n) return value;
  std::string either;
  for (std::size_t i = 0; i < names.size(); ++i)
    either += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  throw py::value_error(name + ": '" + value + "' is not a choice; expected " + either);
}

/// The adaptive policy's tuning, as `replay --adaptive-*` takes it (the
/// numbers' ranges are checked by the package before the call).
adaptive_policy_options adaptive_options(double window, double margin, const std::string& objective,
                                         const std::string& first, const std::string& scope, double decay) {
  adaptive_policy_options a;
  a.window_tokens = window;
  a.margin = margin;
  a.objective = choice("adaptive_objective", objective, {"bytes", "misses"}) == "misses" ? adaptive_objective::misses
                                                                                         : adaptive_objective::bytes;
  const auto& names = adaptive_rule_names();
  choice("adaptive_first", first, names);
  a.first_leader = static_cast<std::uint32_t>(std::find(names.begin(), names.end(), first) - names.begin());
  a.scope =
      choice("adaptive_scope", scope, {"global", "layer"}) == "layer" ? adaptive_scope::layer : adaptive_scope::global;
  a.cycle.decay = decay;
  return a;
}

/// "replaying 12 cells of qwen3moe (tables of 48 layers x 128 experts a cell)", for a MemoryError.
std::string cells_activity(const model_shape& s, std::size_t cells) {
  return "replaying " + std::to_string(cells) + " cells of " + s.name() + " (tables of " +
         std::to_string(s.n_layers()) + " layers x " + std::to_string(s.n_experts()) + " experts a cell)";
}

/// The static grid: built-in policies on threads with the GIL released, then
/// Python policies one cell at a time with it held; results budget-major,
/// policies in the order given.
py::dict replay_static(const trace_object& t, const std::vector<double>& budgets, const py::list& policies,
                       unsigned threads, std::uint64_t seed, double decay, const adaptive_policy_options& adaptive) {
  replay_options o;
  o.threads = threads;
  o.seed = seed;
  o.cycle.decay = decay;
  o.adaptive = adaptive;
  std::vector<std::string> builtin;
  std::vector<std::size_t> builtin_at, python_at;
  std::vector<py::object> python;
  std::vector<std::string> python_label;
  for (std::size_t i = 0; i < policies.size(); ++i) {
    py::handle p = policies[i];
    if (py::isinstance<py::str>(p)) {
      builtin.push_back(p.cast<std::string>());
      builtin_at.push_back(i);
    } else if (PyCallable_Check(p.ptr())) {
      python.push_back(py::reinterpret_borrow<py::object>(p));
      python_label.push_back(policy_label(p));
      python_at.push_back(i);
    } else {
      throw py::type_error("replay: policies[" + std::to_string(i) + "] is a " +
                           py::str(py::type::handle_of(p).attr("__name__")).cast<std::string>() +
                           "; expected a policy name (str) or a class/factory that returns a policy object");
    }
  }
  if (budgets.empty()) throw error("replay: no budgets; expected at least one (MiB)");
  if (policies.empty()) throw error("replay: no policies; expected at least one of " + cache_policy_names());
  for (double b : budgets) check_replay_cell("lru", b);
  for (const auto& p : builtin) check_replay_cell(p, budgets.front());
  const replay_input& in = t.replay_input();
  const py_activity doing(cells_activity(in.shape(), budgets.size() * policies.size()));
  std::vector<replay_result> grid;
  if (!builtin.empty()) {
    py::gil_scoped_release nogil;
    grid = replay_grid(in, budgets, builtin, o);
  }
  std::vector<replay_result> out(budgets.size() * policies.size());
  for (std::size_t b = 0; b < budgets.size(); ++b) {
    for (std::size_t j = 0; j < builtin.size(); ++j)
      out[b * policies.size() + builtin_at[j]] = std::move(grid[b * builtin.size() + j]);
    for (std::size_t j = 0; j < python.size(); ++j)
      out[b * policies.size() + python_at[j]] = replay_python_cell(t, python[j], python_label[j], budgets[b], o);
  }
  return replay_columns(out);
}

/// A per-layer oracle profile given as a sequence of numbers: each a real
/// number (not a str, not a bool) in [0, 1], one per layer; checked as they
/// are, never written out as text and parsed back.
std::vector<double> profile_values(const py::object& seq, std::size_t n_layers) {
  if (!py::isinstance<py::iterable>(seq))
    throw py::type_error("oracle_profile: " + type_phrase(seq) +
                         "; expected a path to a profile file or a sequence of P, one per layer");
  std::vector<double> out;
  for (py::handle p : seq) {
    const std::string where = "oracle_profile[" + std::to_string(out.size()) + "]";
    if (PyBool_Check(p.ptr()) || py::isinstance<py::str>(p) || py::isinstance<py::bytes>(p) || !PyNumber_Check(p.ptr()))
      throw py::type_error(where + ": " + py::repr(p).cast<std::string>() + " is " + type_phrase(p) +
                           "; expected a number from 0 to 1");
    const double v = PyFloat_AsDouble(p.ptr());
    if (v == -1.0 && PyErr_Occurred()) throw py::error_already_set();
    const std::string problem = detail::real_problem(detail::show_number(v), detail::real_domain::closed(0, 1));
    if (!problem.empty()) throw py::value_error(where + ": " + problem);
    out.push_back(v);
  }
  if (out.size() != n_layers)
    throw py::value_error("oracle_profile: " + std::to_string(out.size()) + " values; expected " +
                          std::to_string(n_layers) + " (one P per layer)");
  return out;
}

/// The dynamic replay (drop, speculation, the prompt skipping the cache): one
/// cell per (budget, policy), as `replay --drop/--speculate/--decode-only`.
py::dict replay_dynamic_grid(const trace_object& t, const std::vector<double>& budgets,
                             const std::vector<std::string>& policies, std::optional<double> drop,
                             const std::string& speculate, std::size_t spec_cap, std::size_t horizon,
                             std::uint64_t seed, double decay, const py::object& oracle_profile, bool decode_only,
                             const adaptive_policy_options& adaptive) {
  if (budgets.empty()) throw error("replay: no budgets; expected at least one (MiB)");
  if (policies.empty()) throw error("replay: no policies; expected at least one of " + cache_policy_names());
  dynamic_replay_options base;
  base.drop = drop;
  base.speculation = parse_replay_speculation(speculate);
  base.speculation.cap = spec_cap;
  base.speculation.horizon = horizon;
  base.speculation.seed = seed;
  base.seed = seed;
  base.cycle.decay = decay;
  base.adaptive = adaptive;
  base.prefill_cached = !decode_only;
  const routed_replay_input& in = t.routed_input();
  if (!oracle_profile.is_none()) {
    if (base.speculation.source != speculation_source::oracle)
      throw error("replay: oracle_profile needs speculate='oracle:P'");
    if (py::isinstance<py::str>(oracle_profile) || py::isinstance<py::bytes>(oracle_profile) ||
        py::hasattr(oracle_profile, "__fspath__")) {
      const std::string path = fspath(oracle_profile, "oracle_profile");
      base.speculation.oracle_profile =
          parse_oracle_profile(read_file(path, detail::text_head(path, "a text file")), path, in.shape().n_layers());
    } else {
      base.speculation.oracle_profile = profile_values(oracle_profile, in.shape().n_layers());
    }
  }
  const py_activity doing(cells_activity(in.shape(), budgets.size() * policies.size()));
  for (double b : budgets)
    for (const auto& p : policies) check_replay_cell(p, b);
  std::vector<dynamic_replay_result> rs;
  {
    py::gil_scoped_release nogil;
    for (double b : budgets)
      for (const auto& p : policies) {
        dynamic_replay_options o = base;
        o.policy = p;
        o.budget_mib = b;
        rs.push_back(replay_dynamic(in, o));
      }
  }
  std::vector<double> budget, hit, dem, spec, io, lost, peak;
  std::vector<std::uint64_t> issued, useful, dropped, evictions;
  py::list policy, warning;
  for (const auto& r : rs) {
    budget.push_back(r.options.budget_mib);
    policy.append(r.options.policy);
    hit.push_back(r.hit_pct_decode());
    dem.push_back(r.demanded_mib_per_token());
    spec.push_back(r.speculative_mib_per_token());
    issued.push_back(r.reads.issued);
    useful.push_back(r.speculation.useful);
    dropped.push_back(r.drops.experts_dropped);
    io.push_back(100.0 * r.drops.miss_bytes_avoided_fraction());
    lost.push_back(100.0 * r.drops.weight_discarded_fraction());
    evictions.push_back(r.cache.all.evictions);
    peak.push_back(to_mib(r.cache.peak_bytes));
    warning.append(r.warning);
  }
  py::dict d;
  d["budget_mib"] = column(budget);
  d["policy"] = policy;
  d["hit_pct_decode"] = column(hit);
  d["demanded_mib_per_token"] = column(dem);
  d["speculative_mib_per_token"] = column(spec);
  d["spec_issued"] = column(issued);
  d["spec_useful"] = column(useful);
  d["experts_dropped"] = column(dropped);
  d["io_saved_pct"] = column(io);
  d["mass_lost_pct"] = column(lost);
  d["evictions"] = column(evictions);
  d["peak_resident_mib"] = column(peak);
  d["warning"] = warning;
  d["decode_tokens"] = in.decode_tokens();
  d["speculate"] = base.speculation.name();
  return d;
}

py::dict score(const trace_object& t, const std::vector<std::string>& predictors, float decay, bool paired,
               bool include_prefill) {
  check_history_predictor_names(predictors);
  const py_activity doing("scoring " + std::to_string(predictors.size()) + " predictors on " + t.shape().name() + " (" +
                          std::to_string(t.shape().n_layers()) + " layers x " + std::to_string(t.shape().n_experts()) +
                          " experts)");
  scorer_options options;
  options.paired = paired;
  options.score_prefill = include_prefill;
  frequency_options frequency;
  frequency.decay = decay;
  prediction_report r;
  {
    py::gil_scoped_release nogil;
    const trace_routings routings = collect_routings(t.trace());
    r = score_history_predictors(t.shape(), span<const routing>(routings.routings), routings.declined, predictors,
                                 options, frequency);
  }
  py::list rows;
  for (std::size_t p = 0; p < r.predictors.size(); ++p) {
    const overlap_counts& c = r.totals[p];
    std::vector<double> layer_slot, layer_whole;
    std::vector<std::uint64_t> layer_routings;
    for (const overlap_counts& l : r.layers[p]) {
      layer_slot.push_back(l.slot_pct());
      layer_whole.push_back(l.whole_pct());
      layer_routings.push_back(l.routings);
    }
    py::dict d;
    d["predictor"] = r.predictors[p].short_name;
    d["name"] = r.predictors[p].name;
    d["slot_pct"] = c.slot_pct();
    d["whole_pct"] = c.whole_pct();
    d["routings"] = c.routings;
    d["slots"] = c.slots;
    d["slot_hits"] = c.slot_hits;
    d["whole_hits"] = c.whole_hits;
    d["unscored"] = c.unscored;
    d["tie_forgiven"] = c.tie_forgiven;
    d["layer_slot_pct"] = column(layer_slot);
    d["layer_whole_pct"] = column(layer_whole);
    d["layer_routings"] = column(layer_routings);
    rows.append(d);
  }
  py::dict out;
  out["predictors"] = rows;
  out["offered"] = column(r.offered);
  out["declined"] = r.declined;
  out["ignored_phase"] = r.ignored_phase;
  out["text"] = format_text(r, true);
  return out;
}

}  // namespace

void bind_replay(py::module_& m) {
  py::class_<python_cache_view>(m, "CacheView",
                                "What a Python policy's victim() may ask the cache; valid only during that call. "
                                "Slots are layer * n_experts + expert.")
      .def(
          "evictable",
          [](const python_cache_view& v, const py::object& s) { return v.get().evictable(v.slot(s, "evictable")); },
          py::arg("slot"), "resident, not pinned, not looked up by the current batch")
      .def(
          "resident",
          [](const python_cache_view& v, const py::object& s) { return v.get().resident(v.slot(s, "resident")); },
          py::arg("slot"))
      .def(
          "layer_of",
          [](const python_cache_view& v, const py::object& s) {
            v.get();
            return v.slot(s, "layer_of") / v.n_experts;
          },
          py::arg("slot"))
      .def(
          "expert_of",
          [](const python_cache_view& v, const py::object& s) {
            v.get();
            return v.slot(s, "expert_of") % v.n_experts;
          },
          py::arg("slot"))
      .def(
          "bytes_of",
          [](const python_cache_view& v, const py::object& s) { return v.get().bytes_of(v.slot(s, "bytes_of")); },
          py::arg("slot"))
      .def(
          "layer_count",
          [](const python_cache_view& v, const py::object& layer) {
            const auto& view = v.get();
            const std::uint32_t n_layers = v.n_slots / v.n_experts;
            // A layer number, checked as a slot is: an int, not a bool.
            if (PyBool_Check(layer.ptr()) || !PyIndex_Check(layer.ptr()))
              throw py::type_error("CacheView.layer_count: layer " + py::repr(layer).cast<std::string>() + " is " +
                                   type_phrase(layer) + "; expected a layer number (int)");
            const py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(layer.ptr()));
            if (!i) throw py::error_already_set();
            int overflow = 0;
            const long long l = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
            if (overflow || l < 0 || l >= static_cast<long long>(n_layers))
              throw error("CacheView: layer " + py::str(layer).cast<std::string>() + " out of range [0, " +
                          std::to_string(n_layers) + ")");
            return view.layer_count(static_cast<std::size_t>(l));
          },
          py::arg("layer"), "resident experts of the layer")
      .def_property_readonly("used_bytes", [](const python_cache_view& v) { return v.get().used_bytes(); })
      .def_property_readonly("budget_bytes", [](const python_cache_view& v) { return v.get().budget_bytes(); })
      .def_property_readonly("n_experts", [](const python_cache_view& v) { return v.n_experts; });

  m.def(
      "_replay_static",
      [](const trace_object& t, const std::vector<double>& budgets, const py::list& policies, unsigned threads,
         std::uint64_t seed, double decay, double window, double margin, const std::string& objective,
         const std::string& first, const std::string& scope) {
        return replay_static(t, budgets, policies, threads, seed, decay,
                             adaptive_options(window, margin, objective, first, scope, decay));
      },
      py::arg("trace"), py::arg("budgets"), py::arg("policies"), py::arg("threads"), py::arg("seed"), py::arg("decay"),
      py::arg("adaptive_window"), py::arg("adaptive_margin"), py::arg("adaptive_objective"), py::arg("adaptive_first"),
      py::arg("adaptive_scope"));
  m.def(
      "_replay_dynamic",
      [](const trace_object& t, const std::vector<double>& budgets, const std::vector<std::string>& policies,
         std::optional<double> drop, const std::string& speculate, std::size_t spec_cap, std::size_t horizon,
         std::uint64_t seed, double decay, const py::object& oracle_profile, bool decode_only, double window,
         double margin, const std::string& objective, const std::string& first, const std::string& scope) {
        return replay_dynamic_grid(t, budgets, policies, drop, speculate, spec_cap, horizon, seed, decay,
                                   oracle_profile, decode_only,
                                   adaptive_options(window, margin, objective, first, scope, decay));
      },
      py::arg("trace"), py::arg("budgets"), py::arg("policies"), py::arg("drop"), py::arg("speculate"),
      py::arg("spec_cap"), py::arg("horizon"), py::arg("seed"), py::arg("decay"), py::arg("oracle_profile"),
      py::arg("decode_only"), py::arg("adaptive_window"), py::arg("adaptive_margin"), py::arg("adaptive_objective"),
      py::arg("adaptive_first"), py::arg("adaptive_scope"));
  m.def("_score", &score, py::arg("trace"), py::arg("predictors"), py::arg("decay"), py::arg("paired"),
        py::arg("include_prefill"));
  m.def(
      "policy_names", [] { return replay_policy_names(); }, "the built-in policies' names");
  m.attr("default_spec_cap") = speculation_planner::default_cap;
  m.attr("default_seed") = replay_options{}.seed;
  m.attr("default_cycle_decay") = cycle_policy_options{}.decay;
  m.attr("default_adaptive_window") = adaptive_policy_options{}.window_tokens;
  m.attr("default_adaptive_margin") = adaptive_policy_options{}.margin;
  m.attr("default_adaptive_first") = adaptive_rule_names()[adaptive_policy_options{}.first_leader];
  m.attr("adaptive_rule_names") = py::tuple(py::cast(adaptive_rule_names()));
}

}  // namespace moe_residency_py
