#pragma once
/// A simulated storage device for demos and tests: a `read_callback` for the
/// read scheduler that sleeps in proportion to bytes over a configured
/// bandwidth. Not needed by an engine, which reads its own storage.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>
#include <thread>

#include "moe_residency/core.hpp"
#include "moe_residency/detail/format.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/io.hpp"
#include "moe_residency/plan.hpp"

namespace moe_residency {

/// How a simulated flash device behaves. Defaults: the phone in
/// shared/traces/flash-lanes.csv (4 MiB random reads, cold): one lane alone
/// reads 1809.9 MiB/s; two or more saturate the device at ~2459.8 MiB/s, and
/// more lanes only add latency.
struct simulated_flash_options {
  double device_mib_per_s = 2459.8;  ///< aggregate bandwidth of the device
  double lane_mib_per_s = 1809.9;    ///< the most one read stream gets alone
  double time_scale = 1.0;           ///< multiply every delay (e.g. 0.1 to run 10× faster)
};

/// A read callback that sleeps in proportion to bytes over the configured
/// bandwidth: each read takes at least bytes / lane bandwidth, and all reads
/// share the device's bandwidth (a device timeline reserved under a mutex),
/// which is the lane ceiling. Thread-safe. Keep it alive while a scheduler
/// uses `callback()`.
class simulated_flash {
 public:
  /// Throws `error` naming the value on a bandwidth or time scale that is not
  /// a finite number > 0.
  simulated_flash(const model_shape& shape, simulated_flash_options o = {}) : shape_(shape), o_(o) {
    check_positive("device_mib_per_s", o_.device_mib_per_s, " MiB/s");
    check_positive("lane_mib_per_s", o_.lane_mib_per_s, " MiB/s");
    check_positive("time_scale", o_.time_scale, "");
  }
  simulated_flash(const simulated_flash&) = delete;
  simulated_flash& operator=(const simulated_flash&) = delete;

  read_status read(layer_id l, expert_id, read_reason why) {
    const std::uint64_t bytes = shape_.expert_bytes(l);
    if (bytes == 0) return read_status::failed;
    using namespace std::chrono;
    const auto device_time = duration<double>(to_mib(bytes) / o_.device_mib_per_s * o_.time_scale);
    const auto lane_time = duration<double>(to_mib(bytes) / o_.lane_mib_per_s * o_.time_scale);
    clock::time_point done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const clock::time_point now = clock::now();
      free_at_ = std::max(free_at_, now) + duration_cast<clock::duration>(device_time);
      done = std::max(free_at_, now + duration_cast<clock::duration>(lane_time));
      (why == read_reason::demanded ? demanded_bytes_ : speculative_bytes_) += bytes;
    }
    std::this_thread::sleep_until(done);
    return read_status::ok;
  }
  /// A callback bound to this device.
  read_callback callback() {
    return [this](layer_id l, expert_id e, read_reason why) { return read(l, e, why); };
  }
  std::uint64_t demanded_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return demanded_bytes_;
  }
  std::uint64_t speculative_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return speculative_bytes_;
  }

 private:
  using clock = std::chrono::steady_clock;
  // "simulated_flash: lane_mib_per_s = 0 MiB/s; expected a finite value > 0"
  static void check_positive(const char* name, double v, const char* unit) {
    if (v > 0 && v <= std::numeric_limits<double>::max()) return;
    throw error(std::string("simulated_flash: ") + name + " = " + detail::format_number(v) + unit +
                "; expected a finite value > 0");
  }
  model_shape shape_;
  simulated_flash_options o_;
  mutable std::mutex mu_;
  clock::time_point free_at_{};
  std::uint64_t demanded_bytes_ = 0, speculative_bytes_ = 0;
};

}  // namespace moe_residency
