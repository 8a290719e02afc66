/* moe_residency's C ABI: the llama.cpp residency manager (mmap_residency) for
 * engines that embed llama.cpp from C, Go (cgo), Rust (bindgen), Swift, ...
 * Plain C99. No C++ exception crosses it: every call that can fail returns a
 * moe_residency_status, and moe_residency_last_error() says what and why.
 *
 * The order of calls (docs/moe-run.md, "From C"):
 *
 *   llama_context_params cp = llama_context_default_params();
 *   moe_residency_options o;  moe_residency_options_default(&o);
 *   moe_residency_manager* r = NULL;
 *   if (moe_residency_attach(model, "model.gguf", &o, &cp, &r) != MOE_RESIDENCY_OK) { ...error... }
 *   llama_context* ctx = llama_init_from_model(model, cp);    // cp now carries the observer's callback
 *   if (moe_residency_start(r, ctx) != MOE_RESIDENCY_OK) { ...error: r stays valid, inactive... }
 *   ... llama_decode(ctx, ...); moe_residency_settle(r); ...  // settle between decode calls
 *   moe_residency_stats s;  moe_residency_get_stats(r, &s);
 *   llama_free(ctx);                                          // the context first: its callback points at r
 *   moe_residency_detach(r);
 *
 * The model must be loaded memory-mapped (LLAMA_LOAD_MODE_MMAP): the manager
 * advises and locks the file's pages. Expert tensors that are not in the
 * mapping (repacked into copies by use_extra_bufts = true, llama.cpp's
 * default, or offloaded to a GPU) are left to llama.cpp and named in
 * moe_residency_summary(); the rest are managed. Load with
 * use_extra_bufts = false to keep quantised experts in the file's pages.
 * A handle is used from one thread (the one calling llama_decode).
 */
#ifndef MOE_RESIDENCY_C_MOE_RESIDENCY_H
#define MOE_RESIDENCY_C_MOE_RESIDENCY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct llama_model;
struct llama_context;
struct llama_context_params;

/** The manager and its observer; opaque. */
typedef struct moe_residency_manager moe_residency_manager;

typedef enum moe_residency_status {
  MOE_RESIDENCY_OK = 0,
  MOE_RESIDENCY_INVALID_ARGUMENT = 1, /**< a null pointer, a bad option (the message names it) */
  MOE_RESIDENCY_BAD_STATE = 2,        /**< a call out of order (start twice, stats of a detached handle) */
  MOE_RESIDENCY_REFUSED = 3,          /**< the manager refused: the message says why (a dense model, a
                                           memory or locking limit, weights not in the file mapping) */
  MOE_RESIDENCY_FAILED = 4            /**< anything else (llama.cpp's decode failed, out of memory) */
} moe_residency_status;

/** The manager's parts and levers (residency_options in C++). Booleans are 0 or 1. */
typedef struct moe_residency_options {
  int pin_dense;               /**< lock the non-expert weights once */
  int exact;                   /**< read each layer's routed experts at its routing, on the lanes */
  int predicted;               /**< read the next layer's predicted experts ahead */
  int cache;                   /**< keep a budget of experts locked (an LRU of experts) */
  uint64_t cache_budget_bytes; /**< the cache's budget; 0: auto, from the memory limit */
  uint32_t lanes;              /**< read lanes (threads), >= 1 */
  int overlap;                 /**< a layer's matmuls start while its reads are in flight */
  int act_when_fits;           /**< 0: stand down (advise nothing) when the model fits the limit */
  int measure;                 /**< mincore the routed experts at routing: the hit figure of the stats */
  int pool;                    /**< the cache's experts in an expert pool (read past the page cache into
                                    memory allocated once; the predicted top-k placed ahead); needs cache;
                                    Linux (docs/llama-cpp-residency.md, "The expert pool") */
} moe_residency_options;

/** What the manager did so far (a subset of residency_stats). */
typedef struct moe_residency_stats {
  int active;                               /**< 1 once started and managing */
  int standing_down;                        /**< 1 when it found the model fits and advises nothing */
  uint64_t routed_experts, routed_resident; /**< decode routings; those fully resident (measure) */
  uint64_t exact_reads, exact_bytes;
  uint64_t predicted_issued, predicted_useful;
  uint64_t cache_hits, cache_misses, evictions;
  uint64_t pinned_bytes; /**< experts locked by the cache now */
  uint64_t dense_bytes;  /**< non-expert bytes locked */
  uint64_t budget_bytes; /**< the cache's budget (auto's choice) */
  uint64_t read_wait_ns; /**< the eval thread waiting for the manager's reads */
  uint64_t advice_errors;
} moe_residency_stats;

/** The defaults (the C++ residency_options{}): dense, exact and cache on, predicted off, auto budget,
 *  2 lanes, overlap, stand down when the model fits, no pool. */
void moe_residency_options_default(moe_residency_options* options);

/** Creates a handle for `model` (loaded from `gguf_path`, the first split of a split model)
 *  and installs the observer's eval callback into `*cparams`, before llama_init_from_model.
 *  `options` null: the defaults. On failure *out is null. */
moe_residency_status moe_residency_attach(const struct llama_model* model, const char* gguf_path,
                                          const moe_residency_options* options, struct llama_context_params* cparams,
                                          moe_residency_manager** out);

/** After llama_init_from_model(model, *cparams): decodes one warm-up token (so the observer
 *  learns the graph; the context's memory is cleared after it) and activates the manager.
 *  REFUSED with the reason when it cannot manage this model here; the handle stays valid and
 *  inactive, and decoding goes on as stock llama.cpp. */
moe_residency_status moe_residency_start(moe_residency_manager* r, struct llama_context* ctx);

/** Between llama_decode calls: accounts (and waits for) the last layer's reads. */
moe_residency_status moe_residency_settle(moe_residency_manager* r);

moe_residency_status moe_residency_get_stats(const moe_residency_manager* r, moe_residency_stats* out);

/** One line: what each part did (the probe's residency line). Valid until the next call on r. */
const char* moe_residency_summary(moe_residency_manager* r);

/** Unlocks every page it locked, stops its lanes, frees the handle. Call after llama_free of
 *  the context it was attached to. Null is a no-op. */
void moe_residency_detach(moe_residency_manager* r);

/** The message of the last failed call on this thread ("" when none failed). */
const char* moe_residency_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* MOE_RESIDENCY_C_MOE_RESIDENCY_H */
