#!/usr/bin/env bash
# Fetches the pinned llama.cpp that the llama.cpp adapter is built and tested
# against, and optionally builds and installs it (CPU and RPC backends) — once: both the
# checkout and the install are cached between runs.
#
# llama.cpp comes from the npm registry: node-llama-cpp@3.21.1 ships the
# llama.cpp release it builds against as a git bundle (llama/gitRelease.bundle).
# The tarball's SHA-256 and the bundle's commit are pinned below and verified.
#
#   scripts/fetch-llama-cpp.sh             prints the source checkout
#                                          (for -DMOE_RESIDENCY_LLAMA_CPP_DIR=...)
#   scripts/fetch-llama-cpp.sh --install   also builds and installs it; prints the
#                                          prefix (for -DCMAKE_PREFIX_PATH=...)
#   MOE_RESIDENCY_LLAMA_NATIVE=ON ...       build with -march=native instead of the
#                                          portable x86-64 AVX2 baseline
#
# Only the path goes to stdout; progress goes to stderr. The cache is
# $MOE_RESIDENCY_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/moe-residency.
# Needs npm, git, tar, sha256sum; --install also needs cmake and ninja.
set -euo pipefail

readonly npm_package="node-llama-cpp@3.21.1"
readonly tarball_sha256="7a231d6bafa14142a1cbed9893d4ec5bc6041b2a5f5939a623accaab4203c11f"
readonly llama_commit="80fb11ac73e66d89eae2c6a91d8a77428fa733ed"   # llama.cpp v0.4.0 as bundled
readonly jobs="${MOE_RESIDENCY_LLAMA_JOBS:-2}"
# OFF: the portable x86-64 build (AVX2, FMA, F16C), the same kernels on every CI
# machine. ON (-march=native) is faster, but on a CPU with AVX512-FP16 ggml then
# accumulates single-token f16 dot products in f16, which the fresh-gate control
# does not reproduce (see docs/llama-cpp.md).
readonly native="${MOE_RESIDENCY_LLAMA_NATIVE:-OFF}"

install=0
for arg in "$@"; do
  case "$arg" in
    --install) install=1 ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fetch-llama-cpp: unknown argument '$arg' (expected --install or --help)" >&2; exit 2 ;;
  esac
done

cache="${MOE_RESIDENCY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/moe-residency}"
src="$cache/llama.cpp-${llama_commit:0:12}/src"
variant="$([[ "$native" == ON ]] && echo native || echo portable)"
build="$cache/llama.cpp-${llama_commit:0:12}/build-$variant"
prefix="$cache/llama.cpp-${llama_commit:0:12}/install-$variant"
log() { echo "fetch-llama-cpp: $*" >&2; }

checkout_ok() {
  [[ -d "$src/.git" ]] && [[ "$(git -C "$src" rev-parse HEAD 2>/dev/null)" == "$llama_commit" ]]
}

if checkout_ok; then
  log "cached checkout $src (commit $llama_commit)"
else
  mkdir -p "$cache"
  tmp="$(mktemp -d "$cache/fetch.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  log "npm pack $npm_package"
  (cd "$tmp" && npm pack "$npm_package" --silent >/dev/null)
  tgz="$(ls "$tmp"/node-llama-cpp-*.tgz)"
  actual="$(sha256sum "$tgz" | cut -d' ' -f1)"
  if [[ "$actual" != "$tarball_sha256" ]]; then
    log "SHA-256 of $(basename "$tgz") is $actual; expected $tarball_sha256"
    exit 1
  fi
  tar -xzf "$tgz" -C "$tmp" package/llama/gitRelease.bundle
  rm -rf "$src" "$cache/llama.cpp-${llama_commit:0:12}"/{build,install}-*
  mkdir -p "$(dirname "$src")"
  git clone --quiet --no-checkout "$tmp/package/llama/gitRelease.bundle" "$src"
  git -C "$src" -c advice.detachedHead=false checkout --quiet "$llama_commit"
  if ! checkout_ok; then
    log "checkout in $src is not at commit $llama_commit"
    exit 1
  fi
  log "checked out llama.cpp $llama_commit into $src"
fi

if ((install == 0)); then
  echo "$src"
  exit 0
fi

# -rpc: built with the RPC backend (an install from before it is rebuilt).
stamp="$prefix/.moe-residency-installed-$llama_commit-rpc"
if [[ -f "$stamp" ]]; then
  log "cached install $prefix"
  echo "$prefix"
  exit 0
fi

# The same flags cmake/llama_cpp.cmake uses for add_subdirectory: the library,
# ggml's CPU backend and its RPC backend (a device that is not the host, for
# the offload test: its server listens on 127.0.0.1 in that test only),
# static, no ccache.
log "building llama.cpp (CPU and RPC backends, $variant, -j$jobs) in $build; this takes a few minutes"
start=$SECONDS
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_INSTALL_PREFIX="$prefix" -DBUILD_SHARED_LIBS=OFF \
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
  -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_OPENSSL=OFF -DGGML_CCACHE=OFF -DGGML_NATIVE="$native" -DGGML_RPC=ON >&2
cmake --build "$build" -j "$jobs" >&2
cmake --install "$build" >&2
touch "$stamp"
log "built and installed in $((SECONDS - start)) s: $prefix"
echo "$prefix"
