// A host model of the CUDA features nibble's kernels use, so that the kernels' own source (launch
// geometry, indexing, shared memory, barriers, warp shuffles, atomics) runs in CI on any CPU, as
// tests/emulated/*_intrinsics.h do for AVX-512 and AMX. The production .cu files compile unchanged
// against it with g++: this folder shadows <cuda_runtime.h>, <cuda_bf16.h> and <cublasLt.h>, and
// the targets that use it define NIBBLE_CUDA_MODEL and __CUDA_ARCH__ (the device code paths run).
//
// Execution (cuda_model.cpp): a launch runs every block of the grid, one block at a time, in an
// order drawn from the launch's seed; a block's threads are fibers (ucontext) on one host thread,
// switching only at __syncthreads and at warp-synchronous operations. Between two such points the
// runnable threads run one after another in a freshly shuffled order, so a missing barrier or a
// race between threads gives seed-dependent results (a block either interleaves the lanes of all
// its warps or lets one warp run ahead to the next barrier). A warp operation completes when every
// lane of its mask has reached one of the same kind with the same mask. Reported as ModelError: a
// mask naming a lane that exited or does not exist, a deadlock, threads of a block at different
// __syncthreads, a write past an allocation's end, a kernel argument pointing outside device memory;
// a bad launch configuration is reported as CUDA does (cudaErrorInvalidConfiguration from
// cudaGetLastError, nothing runs).
//
// Device memory is host memory from cudaMallocAsync: filled with 0xFF bytes (NaN as floats) so
// unwritten outputs show (up to 4 MiB, every test tensor), followed by a guard zone checked after
// every launch, and closed to the host outside kernels and copies (a host dereference is named). Streams run
// their work at once, in order (a valid schedule of one stream). cuBLASLt is not modelled.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <source_location>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

// ------------------------------------------------------------------ the kernel language ------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Blocks run one at a time on one host thread, so one static instance per declaration is exactly
// one per running block (contents at block start are unspecified, as on the GPU).
#define __shared__ static

struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
};
struct uint2 {
  unsigned int x, y;
};
struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
inline uint2 make_uint2(unsigned int x, unsigned int y) { return {x, y}; }
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return {x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

namespace cuda_model {

// A model violation (deadlock, bad warp mask, out-of-bounds write...): the launch throws it.
struct ModelError : std::logic_error {
  using std::logic_error::logic_error;
};

// Knobs of the model, for tests. The seed decides block orders and thread interleavings (each
// launch draws its own from it and a launch counter); sm_count is the device's multiprocessor
// count, which the kernels' grid sizes are capped by (small: grid-stride loops take several turns).
// $NIBBLE_CUDA_MODEL_SEED, when set, is added to every seed (a sweep of it tries other schedules).
void set_seed(uint64_t seed);
void set_sm_count(int sm_count);
int sm_count();
uint64_t launches();  // kernels run so far (tests check that a path ran under the model)
const std::string& last_kernel_name();

// The running thread's indices (inside a kernel only).
const uint3& thread_idx();
const uint3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();

// where: the __syncthreads call; every thread a barrier releases must have reached the same one
// (a barrier inside code that threads take differently is undefined behaviour on the GPU).
void syncthreads(const std::source_location& where);
void syncwarp(unsigned mask);
enum class WarpOp : int { shfl_idx, shfl_up, shfl_down, shfl_xor, ballot, any, all, sync, mma };
// Lane's contribution in, the lane's result out (values as up to 8 raw bytes).
uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int operand, int width);

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (kernels/cuda/mma.h): a warp collective of
// all 32 lanes. When every lane has arrived, the model gathers the lanes' fragments into A [16x16],
// B [16x8] and C [16x8] by the PTX ISA's fragment layout (mma.h spells it out), computes
// D[i][j] = C[i][j] + A[i][0] B[0][j] + ... + A[i][15] B[15][j] in FP32, adding the exact products
// in k order (one rounding per addition; a BF16 x BF16 product is exact in FP32), and returns each
// lane its D fragment in c. The hardware's order of additions is not documented: tests bound the
// difference instead of relying on this order.
void mma_bf16_m16n8k16(float c[4], const uint32_t a[4], const uint32_t b[2]);

struct LaunchConfig {
  dim3 grid, block;
  size_t shared_bytes;
  void* stream;
  const char* kernel_name;
};
// Runs body once per thread of the grid (body reads the indices above). A bad configuration runs
// nothing and becomes the launch error that cudaGetLastError returns, as on the GPU.
void run_grid(const LaunchConfig& config, const std::function<void()>& body);

// Stream capture (CUDA graphs, cuda_runtime.h): while a stream captures, its kernel launches, async
// copies, memsets and cuBLASLt GEMMs are recorded as nodes instead of running; a graph launch runs a
// graph's nodes in capture order. A node keeps what CUDA's keeps: the kernel's arguments by value
// (a host-derived argument is frozen at capture), pointers (a copy reads its source at replay).
// Returns whether the operation on `stream` was taken by a capture (recorded, or refused because the
// capture is invalidated: the caller then returns capture_status()).
// A launch with a bad configuration (valid false) invalidates the capture with the launch's error.
bool captured(void* stream, std::function<void()> node, const char* what, bool valid = true);
// The reason the last capture was invalidated (empty while none was): the operation that broke it.
const std::string& capture_invalidation_reason();
// Whether run_grid would accept the configuration (else cudaErrorInvalidConfiguration).
bool valid_launch(const LaunchConfig& config);

// Throws unless p is null or points into a live device allocation: a kernel given a host pointer
// faults on the GPU (argument: its position, for the message).
void check_kernel_pointer(const void* p, int argument, const char* kernel_name);

template <class... Params>
struct Launcher {
  LaunchConfig config;
  void (*kernel)(Params...);
  template <class... Args>
  void operator()(Args&&... args) const {
    static_assert(sizeof...(Args) == sizeof...(Params), "kernel launched with the wrong number of arguments");
    // Kernel parameters are copied at the launch, converted to the parameter types.
    const std::tuple<std::decay_t<Params>...> params(static_cast<std::decay_t<Params>>(std::forward<Args>(args))...);
    std::apply([&](const auto&... p) { check_pointers(p...); }, params);
    if (captured(config.stream, [c = config, k = kernel, params] { run_grid(c, [&] { std::apply(k, params); }); },
                 config.kernel_name, valid_launch(config)))
      return;
    run_grid(config, [&] { std::apply(kernel, params); });  // each thread gets its own copy
  }
  template <class... P>
  void check_pointers(const P&... p) const {
    int argument = 0;
    const auto check = [&](const auto& value) {
      if constexpr (std::is_pointer_v<std::decay_t<decltype(value)>>)
        check_kernel_pointer(static_cast<const void*>(value), argument, config.kernel_name);
      ++argument;
    };
    (check(p), ...);
  }
};
template <class... Params>
Launcher<Params...> launch(dim3 grid, dim3 block, size_t shared_bytes, void* stream, void (*kernel)(Params...),
                           const char* name) {
  return Launcher<Params...>{LaunchConfig{grid, block, shared_bytes, stream, name}, kernel};
}

template <class T>
uint64_t to_raw(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  uint64_t raw = 0;
  std::memcpy(&raw, &v, sizeof(T));
  return raw;
}
template <class T>
T from_raw(uint64_t raw) {
  T v;
  std::memcpy(&v, &raw, sizeof(T));
  return v;
}

}  // namespace cuda_model

// kernel<<<grid, block, shared, stream>>>(args) is written NIBBLE_LAUNCH(grid, block, shared, stream, kernel)(args)
// in the production source (kernels/cuda/launch.h); under the model it is this launcher.
#define NIBBLE_MODEL_LAUNCH(grid, block, shared, stream, ...) \
  ::cuda_model::launch(grid, block, shared, stream, __VA_ARGS__, #__VA_ARGS__)

#define threadIdx (::cuda_model::thread_idx())
#define blockIdx (::cuda_model::block_idx())
#define blockDim (::cuda_model::block_dim())
#define gridDim (::cuda_model::grid_dim())

inline void __syncthreads(std::source_location where = std::source_location::current()) {
  cuda_model::syncthreads(where);
}
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu) { cuda_model::syncwarp(mask); }

template <class T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  using cuda_model::WarpOp;
  return cuda_model::from_raw<T>(cuda_model::warp_collective(WarpOp::shfl_idx, mask, cuda_model::to_raw(v), src_lane, width));
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  using cuda_model::WarpOp;
  return cuda_model::from_raw<T>(
      cuda_model::warp_collective(WarpOp::shfl_up, mask, cuda_model::to_raw(v), static_cast<int>(delta), width));
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  using cuda_model::WarpOp;
  return cuda_model::from_raw<T>(
      cuda_model::warp_collective(WarpOp::shfl_down, mask, cuda_model::to_raw(v), static_cast<int>(delta), width));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  using cuda_model::WarpOp;
  return cuda_model::from_raw<T>(cuda_model::warp_collective(WarpOp::shfl_xor, mask, cuda_model::to_raw(v), lane_mask, width));
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return static_cast<unsigned>(cuda_model::warp_collective(cuda_model::WarpOp::ballot, mask, predicate != 0, 0, 32));
}
inline int __any_sync(unsigned mask, int predicate) {
  return static_cast<int>(cuda_model::warp_collective(cuda_model::WarpOp::any, mask, predicate != 0, 0, 32));
}
inline int __all_sync(unsigned mask, int predicate) {
  return static_cast<int>(cuda_model::warp_collective(cuda_model::WarpOp::all, mask, predicate != 0, 0, 32));
}

// Atomics: the threads of the model never run at the same time, so a plain read-modify-write is
// atomic. Each returns the old value, as CUDA's do.
template <class T>
T nibble_model_atomic_update(T* address, T value, T (*combine)(T, T)) {
  const T old = *address;
  *address = combine(old, value);
  return old;
}
inline unsigned atomicMax(unsigned* a, unsigned v) {
  return nibble_model_atomic_update<unsigned>(a, v, [](unsigned o, unsigned n) { return o < n ? n : o; });
}
inline int atomicMax(int* a, int v) {
  return nibble_model_atomic_update<int>(a, v, [](int o, int n) { return o < n ? n : o; });
}
inline unsigned long long atomicMin(unsigned long long* a, unsigned long long v) {
  return nibble_model_atomic_update<unsigned long long>(a, v, [](unsigned long long o, unsigned long long n) { return n < o ? n : o; });
}
inline unsigned atomicMin(unsigned* a, unsigned v) {
  return nibble_model_atomic_update<unsigned>(a, v, [](unsigned o, unsigned n) { return n < o ? n : o; });
}
inline float atomicAdd(float* a, float v) {
  return nibble_model_atomic_update<float>(a, v, [](float o, float n) { return o + n; });
}
inline unsigned atomicAdd(unsigned* a, unsigned v) {
  return nibble_model_atomic_update<unsigned>(a, v, [](unsigned o, unsigned n) { return o + n; });
}
// ((old >= v) ? 0 : old + 1), as CUDA's: a counter that wraps to 0 after v.
inline unsigned atomicInc(unsigned* a, unsigned v) {
  const unsigned old = *a;
  *a = old >= v ? 0u : old + 1u;
  return old;
}
// Every write of the model is visible to every thread at once: the fence orders nothing more here.
// (A missing fence is not observable in the model; the GPU needs it before a last-block handoff.)
inline void __threadfence() {}

// ------------------------------------------------------------------ math intrinsics ---------------
// The _rn intrinsics are IEEE operations in round-to-nearest-even without flush-to-zero (nibble's
// device code is built with -ftz=false -prec-div=true -prec-sqrt=true -fmad=false): exactly the
// host's SSE arithmetic.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline unsigned __float_as_uint(float x) { return cuda_model::from_raw<unsigned>(cuda_model::to_raw(x)); }
inline float __uint_as_float(unsigned u) { return cuda_model::from_raw<float>(u); }
inline float __int_as_float(int u) { return cuda_model::from_raw<float>(static_cast<unsigned>(u)); }
inline int __float_as_int(float x) { return static_cast<int>(__float_as_uint(x)); }
// Nearest integer, ties to even; NaN and negatives give 0, values past 2^32 - 1 saturate (PTX
// cvt.rni.sat.u32.f32).
inline unsigned __float2uint_rn(float a) {
  if (std::isnan(a)) return 0;
  const double r = std::nearbyint(static_cast<double>(a));
  return r <= 0.0 ? 0u : (r >= 4294967295.0 ? 4294967295u : static_cast<unsigned>(r));
}
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
}
using std::isfinite;
using std::isinf;
using std::isnan;
