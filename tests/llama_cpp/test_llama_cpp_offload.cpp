// Layers offloaded to another device, for real: llama.cpp's RPC backend (a
// device of type GPU whose buffers are not host memory) served by this
// process on a local port, backed by the CPU. llama.cpp offloads the last
// layers and the output (n_gpu_layers) there; the residency manager must leave those
// layers' experts and dense weights to llama.cpp, name them, manage the
// layers that stayed in the file's mapping, and leave the logits
// bit-identical to the same offloaded model without it.
//
// Needs llama.cpp built with GGML_RPC (scripts/fetch-llama-cpp.sh does); a
// llama.cpp without it skips loudly, and fails with CI=true.

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "llama_support.hpp"
#include "moe_residency/adapters/llama_cpp/residency.hpp"

#if MOE_RESIDENCY_TEST_RPC
#include "ggml-rpc.h"
#endif

using namespace moe_residency;
using namespace moe_residency_test;

#if MOE_RESIDENCY_TEST_RPC
namespace {

// True once something accepts connections on 127.0.0.1:port.
bool listening(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// An RPC server in this process (a thread that serves until the process
// exits) on a free local port, backed by the CPU device; its device.
ggml_backend_dev_t rpc_device(std::string& endpoint) {
  static std::string ep;
  static ggml_backend_dev_t dev = nullptr;
  if (dev != nullptr) {
    endpoint = ep;
    return dev;
  }
  int port = 0;
  for (int p = 20000 + static_cast<int>(::getpid() % 20000), tries = 0; tries < 50; ++p, ++tries)
    if (!listening(p)) {
      port = p;
      break;
    }
  REQUIRE_MESSAGE(port != 0, "no free local port for the RPC server");
  ep = "127.0.0.1:" + std::to_string(port);
  static ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
  REQUIRE(cpu != nullptr);
  std::thread([] { ggml_backend_rpc_start_server(ep.c_str(), nullptr, 1, 1, &cpu); }).detach();
  for (int i = 0; i < 200 && !listening(port); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  REQUIRE_MESSAGE(listening(port), "the RPC server did not start on " << ep);
  ggml_backend_reg_t reg = ggml_backend_rpc_add_server(ep.c_str());
  REQUIRE(reg != nullptr);
  REQUIRE(ggml_backend_reg_dev_count(reg) >= 1);
  dev = ggml_backend_reg_dev_get(reg, 0);
  REQUIRE(ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU);
  endpoint = ep;
  return dev;
}

mre::model_ptr load_offloaded(const std::string& path, ggml_backend_dev_t dev, int n_gpu_layers) {
  llama_model_params mp = llama_model_default_params();
  mp.load_mode = LLAMA_LOAD_MODE_MMAP;
  mp.use_extra_bufts = false;
  static ggml_backend_dev_t devices[2];
  devices[0] = dev;
  devices[1] = nullptr;
  mp.devices = devices;
  mp.n_gpu_layers = n_gpu_layers;
  mre::model_ptr m(llama_model_load_from_file(path.c_str(), mp));
  REQUIRE_MESSAGE(m != nullptr,
                  "llama_model_load_from_file failed on " << path << " with " << n_gpu_layers << " layers offloaded");
  return m;
}

}  // namespace

TEST_CASE("mmap residency: layers offloaded to another device are left to llama.cpp, the rest managed") {
  llama_init_once();
  std::string endpoint;
  ggml_backend_dev_t dev = rpc_device(endpoint);
  mre::random_model_spec spec = small_moe_spec();
  spec.expert_type = GGML_TYPE_F16;
  temp_file file("offload");
  mre::save_random_gguf(spec, file.path);

  std::vector<float> plain;
  {
    auto model = load_offloaded(file.path, dev, 3);
    auto ctx = make_context(model.get(), test_context_params());
    plain = run_tokens(ctx.get(), model.get(), 6, 8).logits;
  }
  // n_gpu_layers 3: the output layer and the last two (llama.cpp counts the output as one).
  observed_model om(load_offloaded(file.path, dev, 3));
  om.warm_up();
  const mrl::observer& obs = om.obs;
  // Where llama.cpp put each layer's experts: 0-1 in the mapping, 2-3 on the device.
  for (std::size_t l = 0; l < 4; ++l) {
    CAPTURE(l);
    REQUIRE(obs.layers()[l].experts.size() == 3);
    for (const auto& t : obs.layers()[l].experts) CHECK(ggml_backend_buffer_is_host(t.tensor->buffer) == (l < 2));
  }
  const std::string device_buft =
      ggml_backend_buft_name(ggml_backend_buffer_get_type(obs.layers()[3].experts[0].tensor->buffer));

  mrl::residency_options o = mrl::residency_options::none();
  o.fits = mrl::when_fits::act;  // the tiny model fits: act anyway
  o.pin_dense = o.exact = o.predicted = o.cache = true;
  o.cache_budget_bytes = 4ull << 20;
  mrl::mmap_residency<> res(obs, file.path, o);
  om.obs.set_sink(&res);
  const auto got = om.run(6, 8).logits;
  om.obs.set_sink(nullptr);
  res.settle();
  MESSAGE(res.summary());
  CHECK(res.active());
  CHECK(res.status() == "");
  CHECK(res.stats().advice_errors() == 0);
  const std::string note = res.unmanaged_note();
  CHECK(note.find("6 expert tensors (") == 0);
  CHECK(note.find(") of layers 2-3 offloaded to " + device_buft) != std::string::npos);
  CHECK(note.find(" dense tensors (") != std::string::npos);
  const model_shape& ms = res.managed_shape();
  for (std::size_t l = 0; l < 4; ++l) CHECK(ms.is_moe(layer_id(static_cast<std::uint16_t>(l))) == (l < 2));
  CHECK(res.stats().exact_reads > 0);
  CHECK(res.stats().dense_bytes > 0);
  REQUIRE(got.size() == plain.size());
  CHECK(std::memcmp(got.data(), plain.data(), got.size() * sizeof(float)) == 0);
}

#else

TEST_CASE("mmap residency: layers offloaded to another device (skipped: llama.cpp without GGML_RPC)") {
  const char* ci = std::getenv("CI");
  if (ci != nullptr && std::string(ci) == "true")
    FAIL(
        "CI=true but this llama.cpp has no RPC backend (GGML_RPC): the offload test cannot run; "
        "build llama.cpp with scripts/fetch-llama-cpp.sh --install");
  MESSAGE("####### SKIPPED: llama.cpp was built without GGML_RPC: no device to offload layers to #######");
}

#endif
