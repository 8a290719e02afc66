// libFuzzer target: the session's event stream. The input picks a model shape
// (dense layers included), a router per MoE layer, the anomaly mode, and then a
// sequence of begin_batch / gate_input / routed (three forms) / layer_loaded /
// end_batch events with random layers, shapes, strides and values (NaN and
// infinities included). Every buffer is exactly as large as the view it is
// passed through says, so AddressSanitizer reports any read past a row.
//
// What must hold:
//  - throw mode: every refusal is a moe_residency::error whose text starts with
//    "session:"; the session stays usable after it;
//  - count mode: nothing throws; an event returns false exactly when it counted
//    one anomaly, and a batch boundary counts one per layer whose gate input came
//    without its routing — recounted here by a slow model of the layers' states;
//  - both: the token counters equal a recount of the batches that began, and the
//    report can be built and formatted at the end.
#include <fuzzer/FuzzedDataProvider.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_check.hpp"
#include "moe_residency/session.hpp"

using namespace moe_residency;
using moe_residency_fuzz::check;

namespace {

float any_float(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: return std::numeric_limits<float>::quiet_NaN();
    case 1: return std::numeric_limits<float>::infinity();
    case 2: {
      const std::uint32_t bits = in.ConsumeIntegral<std::uint32_t>();
      float f;
      std::memcpy(&f, &bits, sizeof f);
      return f;
    }
    default: return in.ConsumeFloatingPointInRange<float>(-4.0f, 4.0f);
  }
}

/// A stride in bytes for rows of `row_bytes`: packed (0), exact, padded, or bad.
std::size_t any_stride(FuzzedDataProvider& in, std::size_t row_bytes) {
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: return 0;
    case 1: return row_bytes;
    case 2: return row_bytes + 4 * in.ConsumeIntegralInRange<std::size_t>(1, 8);
    case 3: return row_bytes > 4 ? row_bytes - 4 : 2;  // too short
    case 4: return row_bytes + 2;                      // not a multiple of 4
    default: return in.ConsumeIntegralInRange<std::size_t>(0, 4 * row_bytes + 8);
  }
}

/// Bytes a correct reader touches: rows 0..n-1 at `stride`, `row_bytes` each.
std::size_t extent(std::size_t n, std::size_t stride, std::size_t row_bytes) {
  const std::size_t s = stride ? stride : row_bytes;
  if (n == 0) return 0;
  // A stride the session must refuse (short, or misaligned) is never used to
  // read; size the buffer generously so a refusal is what is tested, not ASan.
  const bool refused = s < row_bytes || s % 4 != 0;
  return refused ? n * (row_bytes + s) : (n - 1) * s + row_bytes;
}

template <class T>
std::vector<T> buffer_of(std::size_t bytes) {
  return std::vector<T>((bytes + sizeof(T) - 1) / sizeof(T));
}

struct layer_model {  // the slow model's view of one layer in the open batch
  bool gate = false, routed = false;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  const bool count_mode = in.ConsumeBool();
  const std::size_t n_layers = in.ConsumeIntegralInRange<std::size_t>(1, 6);
  const std::size_t n_experts = in.ConsumeIntegralInRange<std::size_t>(1, 40);
  const std::size_t k = in.ConsumeIntegralInRange<std::size_t>(1, std::min<std::size_t>(8, n_experts));
  const std::size_t n_embd = in.ConsumeIntegralInRange<std::size_t>(1, 12);
  std::vector<std::uint64_t> bytes(n_layers, 1000);
  std::vector<bool> moe(n_layers, true);
  for (std::size_t l = 0; l < n_layers; ++l)
    if (n_layers > 1 && in.ConsumeIntegralInRange<int>(0, 4) == 0) {
      moe[l] = false;
      bytes[l] = 0;
    }
  if (std::find(moe.begin(), moe.end(), true) == moe.end()) {
    moe[0] = true;
    bytes[0] = 1000;
  }
  session_options opt;
  opt.on_anomaly = count_mode ? anomaly_action::count : anomaly_action::throw_error;
  opt.max_batch_tokens = in.ConsumeIntegralInRange<std::size_t>(0, 3);
  opt.check_gate_inputs = in.ConsumeIntegralInRange<int>(0, 7) != 0;
  standard_session s(model_shape("fuzz", n_experts, k, bytes, moe), opt);
  std::vector<std::vector<float>> routers(n_layers);
  for (std::size_t l = 0; l < n_layers; ++l) {
    if (!moe[l] || in.ConsumeIntegralInRange<int>(0, 5) == 0) continue;  // some MoE layers lack a router
    routers[l].resize(n_experts * n_embd);
    for (float& w : routers[l]) w = in.ConsumeFloatingPointInRange<float>(-1.0f, 1.0f);
    s.set_router(layer_id(static_cast<std::uint16_t>(l)), matrix_view::f32(routers[l].data(), n_experts, n_embd),
                 router_spec::qwen3moe(n_experts, k));
  }

  // The slow model (count mode) and the recounts (both modes).
  std::vector<layer_model> model(n_layers);
  bool in_batch = false;
  std::uint64_t decode_tokens = 0, prefill_tokens = 0;
  run_phase phase = run_phase::decode;
  std::size_t batch_tokens = 0;
  auto mid_layer_count = [&] {
    std::uint64_t n = 0;
    for (layer_model& m : model)
      if (m.gate && !m.routed) {
        ++n;
        m.routed = true;  // the session reports each such layer once
      }
    return n;
  };

  for (int step = 0; step < 64 && in.remaining_bytes() > 0; ++step) {
    const int op = in.ConsumeIntegralInRange<int>(0, 6);
    const std::size_t li = in.ConsumeIntegralInRange<std::size_t>(0, n_layers + 1);  // sometimes out of range
    const layer_id l = layer_id(static_cast<std::uint16_t>(li));
    const anomaly_counts before = s.anomalies();
    const bool batch_before = in_batch;
    bool ok = false;
    std::uint64_t expected_extra = 0;  // mid-layer anomalies a batch boundary adds
    try {
      switch (op) {
        case 0: {  // begin_batch
          const run_phase p = in.ConsumeBool() ? run_phase::decode : run_phase::prefill;
          const std::size_t n = in.ConsumeIntegralInRange<std::size_t>(0, 5);
          const std::uint32_t first = in.ConsumeIntegral<std::uint32_t>();
          if (count_mode && in_batch) expected_extra = mid_layer_count();
          ok = s.begin_batch(p, first, n);
          if (count_mode || ok) in_batch = false;
          if (ok) {
            in_batch = true;
            phase = p;
            batch_tokens = n;
            (p == run_phase::decode ? decode_tokens : prefill_tokens) += n;
            for (layer_model& m : model) m = layer_model{};
          }
          break;
        }
        case 1: {  // gate_input, a view
          const std::size_t length = in.ConsumeBool() ? n_embd : in.ConsumeIntegralInRange<std::size_t>(0, n_embd + 2);
          const std::size_t n = in.ConsumeIntegralInRange<std::size_t>(0, 5);
          const std::size_t stride = any_stride(in, length * 4);
          std::vector<float> x = buffer_of<float>(extent(n, stride, length * 4));
          for (float& v : x) v = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? any_float(in) : 0.25f;
          const bool null_data = in.ConsumeIntegralInRange<int>(0, 15) == 0;
          const std::size_t nan_before = before[anomaly_kind::nan_gate_input];
          ok = s.gate_input(l, gate_input_view{null_data || x.empty() ? nullptr : x.data(), length, n, stride});
          if (li < n_layers && (ok || s.anomalies()[anomaly_kind::nan_gate_input] > nan_before)) model[li].gate = true;
          break;
        }
        case 2: {  // routed, an engine's batch view
          const std::size_t kk = in.ConsumeBool() ? k : in.ConsumeIntegralInRange<std::size_t>(0, 34);
          const std::size_t n = in.ConsumeIntegralInRange<std::size_t>(0, 5);
          const std::size_t is = any_stride(in, kk * 4), ws = any_stride(in, kk * 4);
          std::vector<std::int32_t> ids = buffer_of<std::int32_t>(extent(n, is, kk * 4));
          for (std::int32_t& id : ids)
            id = in.ConsumeIntegralInRange<std::int32_t>(-2, static_cast<std::int32_t>(n_experts) + 1);
          std::vector<float> w;
          if (in.ConsumeBool()) {
            w = buffer_of<float>(extent(n, ws, kk * 4));
            for (float& v : w) v = any_float(in);
          }
          routing_batch_view b;
          b.ids = ids.empty() ? nullptr : ids.data();
          b.k = kk;
          b.n_tokens = n;
          b.ids_row_stride_bytes = is;
          b.weights = w.empty() ? nullptr : w.data();
          b.weights_row_stride_bytes = ws;
          ok = s.routed(l, b);
          if (ok && li < n_layers) model[li].routed = true;
          break;
        }
        case 3: {  // routed, one token's ids and weights
          const std::size_t kk = in.ConsumeBool() ? k : in.ConsumeIntegralInRange<std::size_t>(0, 34);
          std::vector<expert_id> ids(kk);
          std::vector<float> w(kk);
          for (std::size_t i = 0; i < kk; ++i) {
            ids[i] = expert_id(in.ConsumeIntegralInRange<std::uint16_t>(0, static_cast<std::uint16_t>(n_experts + 1)));
            w[i] = any_float(in);
          }
          ok = s.routed(l, kk ? ids.data() : nullptr, in.ConsumeBool() && kk ? w.data() : nullptr, kk);
          if (ok && li < n_layers) model[li].routed = true;
          break;
        }
        case 4: {  // routed, routing objects
          const std::size_t n = in.ConsumeIntegralInRange<std::size_t>(0, 5);
          std::vector<routing> rs(n);
          for (routing& r : rs) {
            r.layer = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? layer_id(static_cast<std::uint16_t>(li + 1)) : l;
            const std::size_t kk = in.ConsumeBool() ? k : in.ConsumeIntegralInRange<std::size_t>(0, 32);
            for (std::size_t i = 0; i < kk; ++i)
              r.push_back(expert_id(in.ConsumeIntegralInRange<std::uint16_t>(0, static_cast<std::uint16_t>(n_experts))),
                          any_float(in));
          }
          ok = s.routed(l, span<const routing>(rs.data(), rs.size()));
          if (ok && li < n_layers) model[li].routed = true;
          break;
        }
        case 5:  // layer_loaded
          ok = s.layer_loaded(l);
          break;
        default: {  // end_batch: false for a missing batch, or when the batch ended mid-layer
          const bool had_batch = in_batch;
          if (count_mode && in_batch) expected_extra = mid_layer_count();
          ok = s.end_batch();
          if (count_mode) {
            in_batch = false;
            check(ok == (had_batch && expected_extra == 0), "end_batch's result disagrees with the model");
            if (had_batch && !ok) expected_extra -= 1;  // the false return is one of the mid-layer anomalies
          }
          break;
        }
      }
    } catch (const error& e) {
      check(!count_mode, "count mode threw", e.what());
      check(std::string(e.what()).rfind("session:", 0) == 0, "an anomaly's message does not start with 'session:'",
            e.what());
      // Throw mode: the model follows only what the session reports about itself.
      in_batch = s.in_batch();
      continue;
    }
    (void)batch_before;
    if (!count_mode) {
      check(ok || op == 0, "throw mode returned false without throwing");
      in_batch = s.in_batch();
      continue;
    }
    const std::uint64_t delta = s.anomalies().total() - before.total();
    check(delta == expected_extra + (ok ? 0 : 1), "anomaly count disagrees with the slow recount",
          "event " + std::to_string(op) + " returned " + (ok ? "true" : "false") + ", counted " +
              std::to_string(delta) + ", expected " + std::to_string(expected_extra + (ok ? 0 : 1)));
    check(s.in_batch() == in_batch, "in_batch disagrees with the model");
  }

  check(s.decode_tokens() == decode_tokens, "decode_tokens disagrees with a recount of the batches begun");
  check(s.prefill_tokens() == prefill_tokens, "prefill_tokens disagrees with a recount of the batches begun");
  if (count_mode && s.anomalies().total() > 0)
    check(s.anomalies().first_message.rfind("session:", 0) == 0, "the first anomaly's message",
          s.anomalies().first_message);
  const std::string text = format_text(s.report());
  check(!text.empty(), "an empty report");
  (void)phase;
  (void)batch_tokens;
  return 0;
}
