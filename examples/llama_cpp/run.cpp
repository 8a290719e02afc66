// moe-run: generates text from a MoE GGUF (a single file or the first of its
// splits) through an unmodified llama.cpp with the residency manager on, on
// every core. The text streams to stdout; what it manages (before) and what
// the run did (after) go to stderr, one line each.
//
//   moe-run -m Qwen3-30B-A3B-Q4_K_M.gguf -p "Why is the sky blue?" -n 128 --chat
//   moe-run -m model-00001-of-00003.gguf -p "Hello" --compare     # off, then on: both lines and the ratio
//
// docs/moe-run.md is its page.

#include <CLI/CLI.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "moe_residency/adapters/llama_cpp.hpp"
#include "moe_residency/adapters/llama_cpp/residency.hpp"
#include "moe_residency/adapters/llama_cpp/residency/policies.hpp"
#include "checked_options.hpp"
#include "proc_counters.hpp"

namespace {

using namespace moe_residency;
namespace mrl = moe_residency::llama_cpp;
namespace mre = moe_residency::llama_cpp::examples;

struct run_args {
  std::string model, prompt;
  int n_predict = 128;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::string budget = "auto";
  std::string residency = mrl::residency_parts_name(mrl::residency_options{});  // dense,exact,cache
  std::string policy = "lru";  // the cache policy (live_cache_policies())
  bool policy_given = false;   // --policy on the command line: refused without the cache
  bool chat = false, compare = false, ignore_eos = false, no_mmap = false, quiet = false, pool = false, repack = false;
  int n_gpu_layers = 0;
  float temp = 0.0f, top_p = 0.95f;
  int top_k = 40;
  std::uint32_t seed = 42;
  int batch = 512;
};

struct model_deleter {
  void operator()(llama_model* m) const noexcept { llama_model_free(m); }
};
struct context_deleter {
  void operator()(llama_context* c) const noexcept { llama_free(c); }
};
struct sampler_deleter {
  void operator()(llama_sampler* s) const noexcept { llama_sampler_free(s); }
};

double mib(std::uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

std::uint64_t major_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<std::uint64_t>(u.ru_majflt);
}

/// What one generation did: the figures of the summary line, and the text.
struct outcome {
  std::string label;  // "residency all", "residency off", …
  std::vector<llama_token> tokens;
  std::string text;
  std::size_t prompt_tokens = 0;
  double prompt_s = 0, decode_s = 0;
  std::vector<double> decode_ms;
  std::uint64_t read_bytes = 0, majflt = 0;  // decode tokens only (the process's)
  bool managed = false;
  double hit_pct = -1;
  double pinned_mib = 0;
};

std::string summary_line(const outcome& o) {
  const double n = static_cast<double>(o.decode_ms.size());
  char line[512];
  char hit[32] = "n/a";
  if (o.hit_pct >= 0) std::snprintf(hit, sizeof hit, "%.1f%%", o.hit_pct);
  std::snprintf(line, sizeof line,
                "moe-run: %s: prompt %zu tokens %.2f tok/s, decode %zu tokens %.3f tok/s, p50 %.1f ms, p90 %.1f ms, "
                "%.1f MiB read/token, expert hit %s, pinned %.0f MiB, %.2f major faults/token",
                o.label.c_str(), o.prompt_tokens,
                o.prompt_s > 0 ? static_cast<double>(o.prompt_tokens) / o.prompt_s : 0.0, o.decode_ms.size(),
                o.decode_s > 0 ? n / o.decode_s : 0.0, percentile(o.decode_ms, 0.5), percentile(o.decode_ms, 0.9),
                n > 0 ? mib(o.read_bytes) / n : 0.0, hit, o.pinned_mib,
                n > 0 ? static_cast<double>(o.majflt) / n : 0.0);
  return line;
}

std::vector<llama_token> tokenize(const llama_vocab* vocab, const std::string& text) {
  std::vector<llama_token> t(text.size() + 16);
  int n = llama_tokenize(vocab, text.c_str(), static_cast<int32_t>(text.size()), t.data(),
                         static_cast<int32_t>(t.size()), true, true);
  if (n < 0) {
    t.resize(static_cast<std::size_t>(-n));
    n = llama_tokenize(vocab, text.c_str(), static_cast<int32_t>(text.size()), t.data(), static_cast<int32_t>(t.size()),
                       true, true);
  }
  if (n <= 0) throw error("-p: the model's vocabulary produced no tokens for the prompt");
  t.resize(static_cast<std::size_t>(n));
  return t;
}

std::string prompt_text(const run_args& a, const llama_model* m) {
  if (!a.chat) return a.prompt;
  const char* tmpl = llama_model_chat_template(m, nullptr);
  if (tmpl == nullptr)
    throw error("--chat: " + a.model + " has no chat template (tokenizer.chat_template); drop --chat");
  llama_chat_message msg{"user", a.prompt.c_str()};
  std::vector<char> buf(a.prompt.size() * 2 + 512);
  int n = llama_chat_apply_template(tmpl, &msg, 1, true, buf.data(), static_cast<int32_t>(buf.size()));
  if (n > static_cast<int>(buf.size())) {
    buf.resize(static_cast<std::size_t>(n));
    n = llama_chat_apply_template(tmpl, &msg, 1, true, buf.data(), static_cast<int32_t>(buf.size()));
  }
  if (n < 0) throw error("--chat: llama.cpp does not know the chat template of " + a.model);
  return std::string(buf.data(), static_cast<std::size_t>(n));
}

llama_sampler* make_sampler(const run_args& a) {
  llama_sampler* s = llama_sampler_chain_init(llama_sampler_chain_default_params());
  if (a.temp <= 0) {
    llama_sampler_chain_add(s, llama_sampler_init_greedy());
    return s;
  }
  llama_sampler_chain_add(s, llama_sampler_init_top_k(a.top_k));
  llama_sampler_chain_add(s, llama_sampler_init_top_p(a.top_p, 1));
  llama_sampler_chain_add(s, llama_sampler_init_temp(a.temp));
  llama_sampler_chain_add(s, llama_sampler_init_dist(a.seed));
  return s;
}

/// The model's files' bytes on storage (every split).
std::uint64_t model_bytes(const std::string& path) {
  std::uint64_t n = 0;
  const mrl::gguf_expert_map map = mrl::gguf_expert_map::by_name(path);
  for (const std::string& p : map.paths()) n += mrl::detail::file_size(p, "moe-run");
  return n;
}

/// Drops the model's pages from the page cache: the whole cache when root
/// (drop_caches), else the files' own clean pages (POSIX_FADV_DONTNEED).
/// Returns what it did, for the --compare line.
std::string drop_page_cache(const std::string& path) {
  ::sync();
  if (std::FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w")) {
    const bool ok = std::fputs("3\n", f) >= 0;
    if (std::fclose(f) == 0 && ok) return "page cache dropped (drop_caches)";
  }
  bool all = true;
  const mrl::gguf_expert_map map = mrl::gguf_expert_map::by_name(path);
  for (const std::string& p : map.paths()) {
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    all = all && fd >= 0 && ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
    if (fd >= 0) ::close(fd);
  }
  return all ? "the model's pages dropped from the page cache (fadvise; not root, so not the whole cache)"
             : "the page cache could not be dropped (not root, and fadvise failed): the second run may start warm";
}

/// The block device's read-ahead (read_ahead_kb) of the disk holding a file:
/// what a fault on a memory-mapped model reads around it. The stock baselines
/// of --compare run at the device's and at the kernel's default (128 KiB).
class read_ahead {
 public:
  explicit read_ahead(const std::string& file) {
    struct stat st {};
    if (::stat(file.c_str(), &st) != 0) return;
    const std::string dev =
        "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
    // A partition's queue is its disk's.
    for (const std::string& q : {dev + "/queue/read_ahead_kb", dev + "/../queue/read_ahead_kb"}) {
      std::FILE* f = std::fopen(q.c_str(), "r");
      if (f == nullptr) continue;
      unsigned long kb = 0;
      const bool ok = std::fscanf(f, "%lu", &kb) == 1;
      std::fclose(f);
      if (ok) {
        path_ = q;
        device_kb_ = kb;
        return;
      }
    }
  }
  read_ahead(const read_ahead&) = delete;
  read_ahead& operator=(const read_ahead&) = delete;
  ~read_ahead() { set(device_kb_); }

  bool known() const noexcept { return !path_.empty(); }
  unsigned long device_kb() const noexcept { return device_kb_; }
  /// Sets it (root only); false when it could not. Restored by the destructor,
  /// and by SIGINT/SIGTERM (restore_on_signal).
  bool set(unsigned long kb) {
    if (path_.empty()) return false;
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const std::string v = std::to_string(kb) + "\n";
    const bool ok = ::write(fd, v.data(), v.size()) == static_cast<ssize_t>(v.size());
    ::close(fd);
    if (ok && kb != device_kb_) restore_on_signal(path_, device_kb_);
    return ok;
  }

 private:
  // What a signal handler restores: async-signal-safe state only.
  static inline char sig_path_[256] = {};
  static inline char sig_value_[32] = {};
  static void restore_on_signal(const std::string& path, unsigned long kb) {
    std::snprintf(sig_path_, sizeof sig_path_, "%s", path.c_str());
    std::snprintf(sig_value_, sizeof sig_value_, "%lu\n", kb);
    struct sigaction sa {};
    sa.sa_handler = [](int sig) {
      const int fd = ::open(sig_path_, O_WRONLY | O_CLOEXEC);
      if (fd >= 0) {
        ssize_t n = ::write(fd, sig_value_, std::strlen(sig_value_));
        (void)n;
        ::close(fd);
      }
      ::_exit(128 + sig);
    };
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
  }
  std::string path_;
  unsigned long device_kb_ = 0;
};

/// A GGUF moe-run can run: a text vocabulary (the prompt tokenizes, tokens
/// print), checked in its metadata before anything is changed on the machine
/// (the page cache dropped, the read-ahead set). Throws `error` naming the file.
void check_runnable(const std::string& path) {
  const auto g = mrl::detail::open_gguf(path, "moe-run");
  const std::int64_t k = gguf_find_key(g.get(), "tokenizer.ggml.model");
  const std::string model =
      k >= 0 && gguf_get_kv_type(g.get(), k) == GGUF_TYPE_STRING ? gguf_get_val_str(g.get(), k) : "";
  if (model.empty() || model == "none" || model == "no_vocab")
    throw error("-m: " + path + " has no text vocabulary (tokenizer.ggml.model is " +
                (model.empty() ? std::string("absent") : "'" + model + "'") +
                "): moe-run tokenizes a prompt and prints text; expected a model with a tokenizer");
  if (gguf_find_key(g.get(), "general.architecture") < 0)
    throw error("-m: " + path + " has no general.architecture; expected a llama.cpp GGUF model");
}

/// One generation: load, (manage), prompt, decode. `managed` false: stock.
outcome generate(const run_args& a, bool want_managed) {
  outcome o;
  mrl::residency_options ro;
  const bool parts = mrl::parse_residency_parts(want_managed ? a.residency : std::string("off"), ro);
  const bool tty = isatty(fileno(stderr)) != 0 && !a.quiet;

  llama_model_params mp = llama_model_default_params();
  // Repacking (llama.cpp's extra CPU buffer types) copies quantised weights out
  // of the mapping into anonymous memory: nothing left to page or pin, and a
  // model larger than memory would not load. Off unless --repack; the same
  // both ways, so --compare's runs multiply the same bytes with the same
  // kernels (identical text). Offloaded layers (--ngl) likewise.
  mp.use_extra_bufts = a.repack;
  mp.load_mode = a.no_mmap ? LLAMA_LOAD_MODE_NONE : LLAMA_LOAD_MODE_MMAP;
  mp.n_gpu_layers = a.n_gpu_layers;
  static bool progress_tty = false;
  progress_tty = tty;
  mp.progress_callback = [](float p, void*) {
    if (progress_tty) std::fprintf(stderr, "\rmoe-run: loading %3d%%%s", static_cast<int>(100 * p), p >= 1 ? "\n" : "");
    return true;
  };
  std::unique_ptr<llama_model, model_deleter> model(llama_model_load_from_file(a.model.c_str(), mp));
  if (!model) throw error("-m: llama.cpp could not load '" + a.model + "'");
  const llama_vocab* vocab = llama_model_get_vocab(model.get());
  const std::vector<llama_token> prompt = tokenize(vocab, prompt_text(a, model.get()));
  o.prompt_tokens = prompt.size();

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<std::uint32_t>(prompt.size() + static_cast<std::size_t>(a.n_predict) + 16);
  cp.n_batch = cp.n_ubatch =
      static_cast<std::uint32_t>(std::min<std::size_t>(cp.n_ctx, static_cast<std::size_t>(a.batch)));
  cp.n_threads = cp.n_threads_batch = a.threads;
  cp.no_perf = true;

  mrl::observer obs(model.get());
  std::unique_ptr<mrl::residency_manager> res;
  bool managed = parts && want_managed;
  if (managed && a.no_mmap) {
    std::fprintf(stderr,
                 "moe-run: --no-mmap: llama.cpp copies the weights into memory, so there are no file pages to "
                 "manage; running stock\n");
    managed = false;
  }
  if (managed) obs.install(cp);
  std::unique_ptr<llama_context, context_deleter> ctx(llama_init_from_model(model.get(), cp));
  if (!ctx) throw error("llama_init_from_model failed (context of " + std::to_string(cp.n_ctx) + " tokens)");
  std::uint64_t experts = 0, total = 0;
  const mrl::memory_limit lim = mrl::detail::process_memory_limit();
  if (managed) {
    if (a.budget != "auto") ro.cache_budget_bytes = static_cast<std::uint64_t>(std::stod(a.budget) * 1024 * 1024);
    if (a.pool) ro.use_pool();
    total = model_bytes(a.model);
    res = mrl::make_residency_manager(a.policy, obs, a.model, ro);
    try {
      // The warm-up, the structure, the activation: every refusal before any advice.
      mrl::start(ctx.get(), obs, *res, a.model, prompt.front());
    } catch (const refusal& e) {
      // An explicit budget is the user's request: refuse it. Otherwise (a dense
      // model, a limit the manager cannot work in) run stock, saying why.
      if (a.budget != "auto" && obs.structure_known()) throw;
      std::fprintf(stderr, "moe-run: residency off: %s; running stock\n", e.what());
      res.reset();
      managed = false;
    }
  }
  model_shape shape;
  if (res) {
    obs.set_sink(res.get());
    // What it counts: the expert tensors in the mapping (a repacked or
    // offloaded one is llama.cpp's, said below).
    const model_shape& ms = res->managed_shape();
    experts = 0;
    for (std::size_t l = 0; l < ms.n_layers(); ++l)
      experts += ms.expert_bytes(layer_id(static_cast<std::uint16_t>(l))) * ms.n_experts();
    shape = ms;
    if (!res->unmanaged_note().empty())
      std::fprintf(stderr, "moe-run: left to llama.cpp, not in the file's mapping: %s\n",
                   res->unmanaged_note().c_str());
    std::string what;
    if (res->standing_down()) what = "the model fits: nothing advised (" + res->fit_note() + ")";
    else if (ro.cache)
      what = "budget " + std::string(a.budget == "auto" ? "auto " : "") +
             std::to_string(static_cast<long long>(mib(res->budget_bytes()))) + " MiB" +
             (res->budget_note().empty() ? std::string() : " (" + res->budget_note() + ")") + ", policy " +
             res->policy_name();
    else what = "no pinned cache";
    std::fprintf(stderr,
                 "moe-run: managing %zu MoE layers x %zu experts (top-%zu) of %s: experts %.0f MiB, %s %.0f MiB; "
                 "memory limit %.0f MiB (%s); %s; parts %s; %d threads\n",
                 shape.n_moe_layers(), shape.n_experts(), shape.top_k(), a.model.c_str(), mib(experts),
                 res->unmanaged_note().empty() ? "dense" : "the rest (dense and left to llama.cpp)",
                 mib(total > experts ? total - experts : 0), mib(lim.bytes),
                 lim.source.empty() ? "unknown" : lim.source.c_str(), what.c_str(), a.residency.c_str(), a.threads);
  }
  o.managed = res != nullptr;
  o.label = !res                   ? "residency off"
            : res->standing_down() ? "residency " + a.residency + " (stood down: the model fits)"
                                   : "residency " + a.residency + (a.pool ? " in the expert pool" : "");

  // The prompt, in batches of n_batch; a progress line when it takes more than one.
  auto t0 = std::chrono::steady_clock::now();
  for (std::size_t at = 0; at < prompt.size(); at += cp.n_batch) {
    const std::size_t n = std::min<std::size_t>(cp.n_batch, prompt.size() - at);
    if (prompt.size() > cp.n_batch && !a.quiet)
      std::fprintf(stderr, "%smoe-run: prompt %zu / %zu tokens%s", tty ? "\r" : "", at + n, prompt.size(),
                   tty && at + n < prompt.size() ? "" : "\n");
    if (llama_decode(ctx.get(),
                     llama_batch_get_one(const_cast<llama_token*>(prompt.data() + at), static_cast<int32_t>(n))) != 0)
      throw error("llama_decode failed on the prompt (tokens " + std::to_string(at) + "..)");
    if (res) res->settle();
  }
  o.prompt_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::unique_ptr<llama_sampler, sampler_deleter> smpl(make_sampler(a));
  const mrl::residency_stats s0 = res ? res->stats() : mrl::residency_stats{};
  const std::uint64_t read0 = mre::proc_read_bytes(), flt0 = major_faults();
  char piece[256];
  for (int i = 0; i < a.n_predict; ++i) {
    llama_token next = llama_sampler_sample(smpl.get(), ctx.get(), -1);
    if (!a.ignore_eos && llama_vocab_is_eog(vocab, next)) break;
    o.tokens.push_back(next);
    const int n = llama_token_to_piece(vocab, next, piece, sizeof piece, 0, false);
    if (n > 0) {
      o.text.append(piece, static_cast<std::size_t>(n));
      if (!a.quiet) {
        std::fwrite(piece, 1, static_cast<std::size_t>(n), stdout);
        std::fflush(stdout);
      }
    }
    if (i + 1 == a.n_predict) break;  // the last token needs no logits
    const auto d0 = std::chrono::steady_clock::now();
    if (llama_decode(ctx.get(), llama_batch_get_one(&next, 1)) != 0) throw error("llama_decode failed");
    if (res) res->settle();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - d0).count();
    o.decode_s += s;
    o.decode_ms.push_back(1e3 * s);
  }
  if (!a.quiet) std::fputc('\n', stdout);
  o.read_bytes = mre::proc_read_bytes() - read0;
  o.majflt = major_faults() - flt0;
  if (res) {
    const mrl::residency_stats s1 = res->stats();
    // The cache's own hit rate over the decode (lookups: hits + misses).
    const std::uint64_t routed = (s1.cache_hits - s0.cache_hits) + (s1.cache_misses - s0.cache_misses);
    if (routed) o.hit_pct = 100.0 * static_cast<double>(s1.cache_hits - s0.cache_hits) / static_cast<double>(routed);
    o.pinned_mib = mib(s1.pinned_bytes + s1.dense_bytes);
    obs.set_sink(nullptr);
  }
  return o;
}

int run(run_args a) {
  if (a.prompt.empty()) throw error("-p: an empty prompt; expected the text to continue");
  mrl::residency_options probe;
  const bool manages = mrl::parse_residency_parts(a.residency, probe);  // refuse a bad list before loading anything
  (void)mrl::live_cache_policy(a.policy);
  if (a.policy_given && (!manages || !probe.cache))
    throw error(
        "--policy " + a.policy + " with --residency " + a.residency +
        ": the policy is the cache's, and the cache is not on; expected --residency with cache (all, or a list)");
  if (a.budget != "auto") {
    (void)moe_residency::detail::parse_real(a.budget, "--budget (auto, or MiB)",
                                            moe_residency::detail::real_domain::open_closed(0, 1e9));
    if (!manages || !probe.cache)
      throw error(
          "--budget " + a.budget + " with --residency " + a.residency +
          ": the budget is the cache's, and the cache is not on; expected --residency with cache (all, or a list)");
  }
  if (a.pool && (!manages || !probe.cache))
    throw error("--pool with --residency " + a.residency +
                ": the pool holds the cache's experts, and the cache is not on; expected --residency with cache (all, "
                "or a list)");
  // The files first (a later split, a missing or misnamed split, a truncated
  // file), with the file named, before llama.cpp's own messages; then what
  // moe-run needs of the model, before anything is changed on the machine.
  (void)model_bytes(a.model);
  check_runnable(a.model);
  llama_log_set(
      [](ggml_log_level level, const char* text, void*) {
        if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
      },
      nullptr);
  llama_backend_init();
  if (!a.compare) {
    const outcome o = generate(a, true);
    std::fprintf(stderr, "%s\n", summary_line(o).c_str());
    return 0;
  }
  // Stock at the device's read-ahead and, when it is not the kernel's default
  // (128 KiB, what most NVMe drives have) and root may set it, stock at that
  // too: the best of them is the baseline a user could have picked. Every run
  // starts cold: the page cache dropped before each.
  read_ahead ra(a.model);
  struct stock_run {
    outcome o;
    std::string label;
  };
  std::vector<stock_run> stock;
  auto run_stock = [&](const std::string& label) {
    std::fprintf(stderr, "moe-run: %s\n", drop_page_cache(a.model).c_str());
    stock.push_back({generate(a, false), label});
    stock.back().o.label = "residency off, " + label;
    std::fprintf(stderr, "%s\n", summary_line(stock.back().o).c_str());
  };
  const std::string device = ra.known() ? "read-ahead " + std::to_string(ra.device_kb()) + " KiB (the device's)"
                                        : std::string("the device's read-ahead");
  run_stock(device);
  constexpr unsigned long kernel_default_kb = 128;
  if (ra.known() && ra.device_kb() != kernel_default_kb) {
    if (ra.set(kernel_default_kb)) {
      run_stock("read-ahead 128 KiB (the kernel's default)");
      ra.set(ra.device_kb());
    } else {
      std::fprintf(stderr,
                   "moe-run: compare: stock at the kernel's default read-ahead (128 KiB) not run: setting "
                   "read_ahead_kb needs root; the device's is %lu KiB\n",
                   ra.device_kb());
    }
  }
  std::fprintf(stderr, "moe-run: %s\n", drop_page_cache(a.model).c_str());
  const outcome managed = generate(a, true);
  std::fprintf(stderr, "%s\n", summary_line(managed).c_str());
  auto tok_s = [](const outcome& o) {
    return o.decode_s > 0 ? static_cast<double>(o.decode_ms.size()) / o.decode_s : 0.0;
  };
  std::size_t best = 0;
  bool same = true;
  for (std::size_t i = 0; i < stock.size(); ++i) {
    if (tok_s(stock[i].o) > tok_s(stock[best].o)) best = i;
    same = same && stock[i].o.tokens == managed.tokens;
  }
  const double r = tok_s(stock[best].o) > 0 ? tok_s(managed) / tok_s(stock[best].o) : 0.0;
  std::string others;
  for (std::size_t i = 0; i < stock.size(); ++i)
    if (i != best && tok_s(stock[i].o) > 0) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "; %.2fx stock at %s", tok_s(managed) / tok_s(stock[i].o), stock[i].label.c_str());
      others += buf;
    }
  std::fprintf(
      stderr,
      "moe-run: compare: decode %.2fx with residency %s against the best stock run (%s)%s; texts %s (%zu tokens)\n", r,
      a.residency.c_str(), stock[best].label.c_str(), others.c_str(), same ? "identical" : "DIFFER",
      managed.tokens.size());
  return same ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  // ggml's OpenMP workers spin between graphs for ~300k iterations (libgomp's
  // default) on the cores the manager's read lanes and the kernel's reads
  // need; told to sleep at once (OMP_WAIT_POLICY=PASSIVE) they wake late and
  // every token pays for it (docs/llama-cpp-residency.md, "Threads"). A short
  // spin keeps both: GOMP_SPINCOUNT=1000 (libgomp), KMP_BLOCKTIME=1 (LLVM's
  // libomp, ms). The runtime reads them when it loads, before main: so moe-run
  // sets them and runs itself again, once; any of them the user set is kept.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr &&
      std::getenv("KMP_BLOCKTIME") == nullptr && ::setenv("GOMP_SPINCOUNT", "1000", 1) == 0 &&
      ::setenv("KMP_BLOCKTIME", "1", 1) == 0) {
    ::execv("/proc/self/exe", argv);
    // exec failed (no /proc): go on with the runtime's own policy; the variables stay set for children.
  }
  namespace opt = moe_residency_cli;  // checked_options.hpp: the numbers every option takes
  using moe_residency::detail::real_domain;
  run_args a;
  CLI::App app{"moe-run: generate text from a MoE GGUF with expert residency on"};
  app.add_option("-m,--model", a.model, "The GGUF model (a split model: its first file, ...-00001-of-0000N.gguf)")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("-p,--prompt", a.prompt, "The prompt")->required();
  app.add_option("-n,--n-predict", a.n_predict, "Tokens to generate")
      ->check(opt::whole(1, 1 << 20))
      ->capture_default_str();
  app.add_option("-t,--threads", a.threads, "Threads (default: every core)")
      ->check(opt::whole(1, 1024))
      ->capture_default_str();
  app.add_option("--budget", a.budget, "Pinned expert cache in MiB, or auto (from the memory limit)")
      ->capture_default_str();
  app.add_option("--residency", a.residency,
                 "all, off, or a comma list of dense, exact, predicted, cache (the default: the library's "
                 "defaults, predicted reads off)")
      ->capture_default_str();
  app.add_option("--policy", a.policy, "The expert cache's policy: " + mrl::live_cache_policy_names())
      ->capture_default_str();
  app.add_flag("--chat", a.chat, "Apply the model's chat template to the prompt (one user turn)");
  app.add_flag("--pool", a.pool,
               "Keep the cache's experts in an expert pool (read past the page cache into memory allocated once, "
               "the next layer's predicted experts placed ahead) instead of locked page cache; Linux");
  app.add_option("--temp", a.temp, "Temperature; 0: greedy")
      ->check(opt::real(real_domain::closed(0, 100)))
      ->capture_default_str();
  app.add_option("--top-k", a.top_k, "Top-k (with --temp)")->check(opt::whole(1, 1 << 30))->capture_default_str();
  app.add_option("--top-p", a.top_p, "Top-p (with --temp)")
      ->check(opt::real(real_domain::closed(0, 1)))
      ->capture_default_str();
  app.add_option("--seed", a.seed, "Sampler seed (with --temp)")
      ->check(opt::whole(0, UINT32_MAX))
      ->capture_default_str();
  app.add_flag(
      "--compare", a.compare,
      "Run residency off, drop the page cache, run it on: both summaries, the ratio, and whether the texts match");
  app.add_flag("--ignore-eos", a.ignore_eos, "Do not stop at an end-of-generation token");
  app.add_flag("--repack", a.repack,
               "Let llama.cpp's CPU backend repack quantised weights (its extra buffer types, llama.cpp's default): "
               "the repacked experts are copies outside the file's mapping, left to llama.cpp; the rest managed");
  app.add_option("--n-gpu-layers,--ngl", a.n_gpu_layers,
                 "Layers to offload to a GPU (a llama.cpp built with one): their experts are left to llama.cpp, the "
                 "rest managed")
      ->check(opt::whole(0, 1 << 20))
      ->capture_default_str();
  app.add_flag("--no-mmap", a.no_mmap,
               "Load the weights into memory (llama.cpp's --no-mmap): nothing to manage, runs stock");
  app.add_option("--batch", a.batch, "Prompt batch (tokens per graph)")
      ->check(opt::whole(1, 1 << 16))
      ->capture_default_str();
  app.add_flag("-q,--quiet", a.quiet, "No text to stdout (the summary lines only)");
  CLI11_PARSE(app, argc, argv);
  a.policy_given = app.count("--policy") != 0;
  try {
    // The sampler's options act only when sampling: greedy decoding ignores them.
    if (!(a.temp > 0))
      for (const char* o : {"--top-k", "--top-p", "--seed"})
        if (app.count(o) != 0)
          throw error(std::string(o) +
                      " has no effect without --temp above 0 (greedy decoding); give --temp, or drop " + o);
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-run: %s\n", e.what());
    return 1;
  }
}
