// The C ABI (include/moe_residency/c/moe_residency.h) over the llama.cpp
// adapter's observer and mmap_residency. Every entry point catches every
// exception and turns it into a status and the thread's last-error message.

#include "moe_residency/c/moe_residency.h"

#include <exception>
#include <memory>
#include <new>
#include <string>

#include "llama.h"
#include "moe_residency/adapters/llama_cpp.hpp"
#include "moe_residency/adapters/llama_cpp/residency.hpp"

namespace mrl = moe_residency::llama_cpp;

struct moe_residency_manager {
  moe_residency_manager(const llama_model* m, std::string p, mrl::residency_options o)
      : model(m), path(std::move(p)), options(o), obs(m) {}
  const llama_model* model;
  std::string path;
  mrl::residency_options options;
  mrl::observer obs;
  std::unique_ptr<mrl::mmap_residency<>> manager;
  bool started = false;
  std::string summary;
};

namespace {

thread_local std::string last_error;

moe_residency_status fail(moe_residency_status s, const std::string& what) {
  try {
    last_error = what;
  } catch (...) {
    // the message could not be kept (out of memory): the status still says it
  }
  return s;
}

/// Runs `body`, mapping every exception to a status and a message.
template <class Body>
moe_residency_status guarded(const char* who, Body&& body) noexcept {
  try {
    last_error.clear();
    return body();
  } catch (const std::bad_alloc&) {
    return fail(MOE_RESIDENCY_FAILED, std::string(who) + ": out of memory");
  } catch (const std::invalid_argument& e) {
    return fail(MOE_RESIDENCY_INVALID_ARGUMENT, std::string(who) + ": " + e.what());
  } catch (const moe_residency::configuration_error& e) {
    return fail(MOE_RESIDENCY_INVALID_ARGUMENT, std::string(who) + ": " + e.what());
  } catch (const moe_residency::refusal& e) {
    return fail(MOE_RESIDENCY_REFUSED, std::string(who) + ": " + e.what());
  } catch (const std::exception& e) {
    return fail(MOE_RESIDENCY_FAILED, std::string(who) + ": " + e.what());
  } catch (...) {
    return fail(MOE_RESIDENCY_FAILED, std::string(who) + ": an unknown exception");
  }
}

bool is_bool(int v) { return v == 0 || v == 1; }

mrl::residency_options to_options(const moe_residency_options& c) {
  const struct {
    const char* name;
    int v;
  } flags[] = {{"pin_dense", c.pin_dense}, {"exact", c.exact},     {"predicted", c.predicted},
               {"cache", c.cache},         {"overlap", c.overlap}, {"act_when_fits", c.act_when_fits},
               {"measure", c.measure},     {"pool", c.pool}};
  for (const auto& f : flags)
    if (!is_bool(f.v))
      throw std::invalid_argument(std::string("options.") + f.name + " = " + std::to_string(f.v) + "; expected 0 or 1");
  if (c.lanes == 0) throw std::invalid_argument("options.lanes = 0; expected at least 1 read lane");
  if (c.cache_budget_bytes != 0 && !c.cache)
    throw std::invalid_argument("options.cache_budget_bytes = " + std::to_string(c.cache_budget_bytes) +
                                " but options.cache = 0; expected cache = 1 with a budget, or budget 0");
  if (!(c.pin_dense || c.exact || c.predicted || c.cache))
    throw std::invalid_argument("options: every part is 0 (pin_dense, exact, predicted, cache); expected at least one");
  mrl::residency_options o;  // the C++ defaults for what C does not set
  o.pin_dense = c.pin_dense != 0;
  o.exact = c.exact != 0;
  o.predicted = c.predicted != 0;
  o.cache = c.cache != 0;
  o.cache_budget_bytes = c.cache_budget_bytes;
  o.lanes = c.lanes;
  o.overlap = c.overlap != 0;
  o.fits = c.act_when_fits ? mrl::when_fits::act : mrl::when_fits::stand_down;
  o.measure = c.measure != 0;
  if (c.pool != 0) o.use_pool();
  try {
    o.validate();
  } catch (const moe_residency::configuration_error& e) {
    throw std::invalid_argument(std::string("options: ") + e.what());
  }
  return o;
}

}  // namespace

extern "C" {

void moe_residency_options_default(moe_residency_options* o) {
  if (o == nullptr) return;
  // The C++ defaults (residency_options{}), field by field: one set of defaults.
  const mrl::residency_options d;
  *o = moe_residency_options{};
  o->pin_dense = d.pin_dense;
  o->exact = d.exact;
  o->predicted = d.predicted;
  o->cache = d.cache;
  o->cache_budget_bytes = d.cache_budget_bytes;
  o->lanes = static_cast<std::uint32_t>(d.lanes);
  o->overlap = d.overlap;
  o->act_when_fits = d.fits == mrl::when_fits::act;
  o->measure = d.measure;
  o->pool = d.pool;
}

moe_residency_status moe_residency_attach(const llama_model* model, const char* gguf_path,
                                          const moe_residency_options* options, llama_context_params* cparams,
                                          moe_residency_manager** out) {
  return guarded("moe_residency_attach", [&] {
    if (out == nullptr) return fail(MOE_RESIDENCY_INVALID_ARGUMENT, "moe_residency_attach: out is null");
    *out = nullptr;
    if (model == nullptr) return fail(MOE_RESIDENCY_INVALID_ARGUMENT, "moe_residency_attach: model is null");
    if (gguf_path == nullptr || *gguf_path == '\0')
      return fail(MOE_RESIDENCY_INVALID_ARGUMENT, "moe_residency_attach: gguf_path is null or empty");
    if (cparams == nullptr) return fail(MOE_RESIDENCY_INVALID_ARGUMENT, "moe_residency_attach: cparams is null");
    moe_residency_options c;
    moe_residency_options_default(&c);
    if (options != nullptr) c = *options;
    auto r = std::make_unique<moe_residency_manager>(model, gguf_path, to_options(c));
    try {
      mrl::gguf_expert_map::by_name(r->path);  // the file (and every split) readable, before llama.cpp's context
    } catch (const moe_residency::error& e) {
      throw moe_residency::refusal(e.what());  // a file this process cannot read: nothing to manage
    }
    r->obs.install(*cparams);
    *out = r.release();
    return MOE_RESIDENCY_OK;
  });
}

moe_residency_status moe_residency_start(moe_residency_manager* r, llama_context* ctx) {
  return guarded("moe_residency_start", [&] {
    if (r == nullptr || ctx == nullptr)
      return fail(MOE_RESIDENCY_INVALID_ARGUMENT, "moe_residency_start: the handle or the context is null");
    if (r->started) return fail(MOE_RESIDENCY_BAD_STATE, "moe_residency_start: already started");
    r->started = true;
    auto m = std::make_unique<mrl::mmap_residency<>>(r->obs, r->path, r->options);
    // The warm-up, the structure (a dense model: REFUSED), the activation (its
    // refusals, with the figures: REFUSED); a failed decode: FAILED.
    mrl::start(ctx, r->obs, *m, r->path);
    r->manager = std::move(m);
    return MOE_RESIDENCY_OK;
  });
}

moe_residency_status moe_residency_settle(moe_residency_manager* r) {
  if (r == nullptr) return fail(MOE_RESIDENCY_INVALID_ARGUMENT, "moe_residency_settle: the handle is null");
  if (r->manager) r->manager->settle();
  return MOE_RESIDENCY_OK;
}

moe_residency_status moe_residency_get_stats(const moe_residency_manager* r, moe_residency_stats* out) {
  if (r == nullptr || out == nullptr)
    return fail(MOE_RESIDENCY_INVALID_ARGUMENT, "moe_residency_get_stats: the handle or out is null");
  *out = moe_residency_stats{};
  if (!r->manager) return MOE_RESIDENCY_OK;
  const mrl::residency_stats s = r->manager->stats();
  out->active = r->manager->active() ? 1 : 0;
  out->standing_down = r->manager->standing_down() ? 1 : 0;
  out->routed_experts = s.routed_experts;
  out->routed_resident = s.routed_resident;
  out->exact_reads = s.exact_reads;
  out->exact_bytes = s.exact_bytes;
  out->predicted_issued = s.predicted_issued;
  out->predicted_useful = s.predicted_useful;
  out->cache_hits = s.cache_hits;
  out->cache_misses = s.cache_misses;
  out->evictions = s.evictions;
  out->pinned_bytes = s.pinned_bytes;
  out->dense_bytes = s.dense_bytes;
  out->budget_bytes = r->manager->budget_bytes();
  out->read_wait_ns = s.read_wait_ns;
  out->advice_errors = s.advice_errors();
  return MOE_RESIDENCY_OK;
}

const char* moe_residency_summary(moe_residency_manager* r) {
  if (r == nullptr) return "";
  try {
    r->summary = r->manager ? r->manager->summary() : std::string("residency: not active");
  } catch (...) {
    return "";
  }
  return r->summary.c_str();
}

void moe_residency_detach(moe_residency_manager* r) {
  if (r == nullptr) return;
  r->obs.set_sink(nullptr);
  delete r;  // the manager's destructor unlocks and stops its lanes (noexcept)
}

const char* moe_residency_last_error(void) { return last_error.c_str(); }

}  // extern "C"
