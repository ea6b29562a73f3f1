// The CUDA model's execution engine and runtime API (cuda_model.h, cuda_runtime.h).
#include "cuda.h"
#include "cuda_model.h"

#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "cuda_runtime.h"
#include "cublasLt.h"

namespace cuda_model {
namespace {

constexpr int kWarp = 32;
constexpr size_t kStackBytes = size_t{128} << 10;  // per thread; one guard page below it
constexpr size_t kGuardBytes = 256;                // checked after every launch
constexpr uint8_t kGuardByte = 0xA5;
constexpr uint8_t kUnwrittenByte = 0xFF;           // NaN as FP32, 0xFF as codes
constexpr size_t kPoisonedBytes = size_t{4} << 20;  // allocations up to this size start as kUnwrittenByte

enum class State : uint8_t { ready, at_barrier, at_warp, done };

struct Fiber {
  ucontext_t context;
  uint3 index;
  int warp = 0, lane = 0;
  State state = State::ready;
  WarpOp op = WarpOp::sync;
  unsigned mask = 0;
  uint64_t value = 0;  // the lane's contribution, then its result
  int operand = 0, width = kWarp;
  const char* barrier_file = nullptr;  // the __syncthreads it waits at
  unsigned barrier_line = 0;
};

// A stack with a PROT_NONE guard page below it, so that an overflow faults instead of corrupting.
struct Stack {
  void* base = nullptr;
  size_t bytes = 0;
  Stack() {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    bytes = kStackBytes + page;
    base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) throw ModelError("cuda model: cannot map a fiber stack");
    mprotect(base, page, PROT_NONE);
  }
  ~Stack() { munmap(base, bytes); }
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
  char* usable() const { return static_cast<char*>(base) + (bytes - kStackBytes); }
};

struct Engine {
  uint64_t seed = 1;
  int sm_count = 2;
  uint64_t launches = 0;
  std::string kernel_name;
  cudaError_t sticky_error = cudaSuccess;
  // The running block.
  ucontext_t scheduler;
  std::vector<Fiber> fibers;
  std::vector<std::unique_ptr<Stack>> stacks;
  Fiber* current = nullptr;
  uint3 block_index{0, 0, 0};
  dim3 grid, block;
  const std::function<void()>* body = nullptr;
  std::exception_ptr fiber_error;
  // Device allocations: start -> bytes (the guard zone follows them). Each is a mapping of its own,
  // inaccessible to the host except while a kernel or a copy uses it (Access below).
  std::map<const uint8_t*, size_t> allocations;
  // Pinned host allocations (cudaMallocHost): start -> bytes.
  std::map<const uint8_t*, size_t> pinned;
  // The virtual memory API (cuMemAddressReserve, cuMemMap, ...): reserved address ranges (start ->
  // bytes, inaccessible where nothing is mapped), and the chunks mapped into them with access set
  // (start -> bytes; no guard zone: a chunk's neighbour is the next chunk), device memory as above.
  std::map<const uint8_t*, size_t> reservations;
  std::map<const uint8_t*, size_t> mappings;
  // The capturing stream (one at a time), the nodes recorded so far, and why it broke, if it did.
  void* capturing = nullptr;
  bool capture_invalidated = false;
  std::vector<std::function<void()>> nodes;
  std::string invalidation_reason;
  cudaError_t capture_error = cudaSuccess;  // what the last operation a capture took returns
};

// $NIBBLE_CUDA_MODEL_SEED shifts every seed, so a sweep of it reruns the tests under other schedules.
uint64_t seed_shift() {
  const char* env = std::getenv("NIBBLE_CUDA_MODEL_SEED");
  return env ? std::strtoull(env, nullptr, 10) : 0;
}

Engine& engine() {
  static Engine e = [] {
    Engine fresh;
    fresh.seed = 1 + seed_shift();
    return fresh;
  }();
  return e;
}

std::string describe_kernel() { return "kernel " + engine().kernel_name; }
std::string hex(unsigned mask) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", mask);
  return text;
}

void fiber_main() {
  auto& e = engine();
  try {
    (*e.body)();
  } catch (...) {
    if (!e.fiber_error) e.fiber_error = std::current_exception();
  }
  e.current->state = State::done;
  // uc_link returns to the scheduler.
}

// From a kernel thread back to the scheduler.
void yield() {
  auto& e = engine();
  Fiber* self = e.current;
  swapcontext(&self->context, &e.scheduler);
}

Fiber& running_thread(const char* what) {
  Fiber* f = engine().current;
  if (f == nullptr) throw ModelError(std::string("cuda model: ") + what + " called outside a kernel");
  return *f;
}

// The source lane of lane `lane` for a shuffle, or -1 for "keep the own value".
int shuffle_source(WarpOp op, int lane, int operand, int width) {
  const int segment = lane & ~(width - 1), in_segment = lane & (width - 1);
  switch (op) {
    case WarpOp::shfl_idx: return segment + (operand & (width - 1));
    case WarpOp::shfl_up: return in_segment - operand < 0 ? -1 : lane - operand;
    case WarpOp::shfl_down: return in_segment + operand >= width ? -1 : lane + operand;
    case WarpOp::shfl_xor: {
      const int source = lane ^ operand;
      return (source & ~(width - 1)) != segment || source >= kWarp ? -1 : source;
    }
    default: return -1;
  }
}

// One lane's fragments of an mma.sync (its registers, on its fiber's stack while it waits).
struct MmaFragments {
  float* c;
  const uint32_t* a;
  const uint32_t* b;
};
float bf16_half(uint32_t reg, int half) { return from_raw<float>(static_cast<uint64_t>((reg >> (16 * half)) & 0xFFFFu) << 16); }

// The warp's mma.sync m16n8k16: lanes in lane order, each value an MmaFragments*. g = lane / 4,
// t = lane % 4; register r of A holds row g + 8 (r % 2), columns 2t + 8 (r / 2) and the next one;
// register r of B rows 2t + 8 r and the next, column g; C/D element r row g + 8 (r / 2), column
// 2t + r % 2 (the PTX ISA's "Matrix Fragments for mma.m16n8k16 with floating point type").
void multiply_fragments(const std::vector<Fiber*>& lanes) {
  float A[16][16], B[16][8], C[16][8];
  for (const Fiber* f : lanes) {
    const auto* frag = reinterpret_cast<const MmaFragments*>(static_cast<uintptr_t>(f->value));
    const int g = f->lane / 4, t = f->lane % 4;
    for (int r = 0; r < 4; ++r)
      for (int half = 0; half < 2; ++half) A[g + 8 * (r % 2)][2 * t + 8 * (r / 2) + half] = bf16_half(frag->a[r], half);
    for (int r = 0; r < 2; ++r)
      for (int half = 0; half < 2; ++half) B[2 * t + 8 * r + half][g] = bf16_half(frag->b[r], half);
    for (int r = 0; r < 4; ++r) C[g + 8 * (r / 2)][2 * t + r % 2] = frag->c[r];
  }
  for (const Fiber* f : lanes) {
    const auto* frag = reinterpret_cast<const MmaFragments*>(static_cast<uintptr_t>(f->value));
    const int g = f->lane / 4, t = f->lane % 4;
    for (int r = 0; r < 4; ++r) {
      const int i = g + 8 * (r / 2), j = 2 * t + r % 2;
      float d = C[i][j];
      for (int k = 0; k < 16; ++k) d += A[i][k] * B[k][j];  // the product is exact: one rounding, the add
      frag->c[r] = d;
    }
  }
}

// When every lane named by `arrived`'s mask waits at the same warp operation, computes each lane's
// result and releases them. Throws for masks that name absent or exited lanes and for lanes of one
// mask at different operations.
void try_complete_warp(const Fiber& arrived) {
  auto& e = engine();
  const int threads = static_cast<int>(e.fibers.size());
  const int first = arrived.warp * kWarp;
  std::vector<Fiber*> lanes;
  for (int lane = 0; lane < kWarp; ++lane) {
    if (!(arrived.mask >> lane & 1u)) continue;
    if (first + lane >= threads)
      throw ModelError("cuda model: " + describe_kernel() + ": warp operation with mask " + hex(arrived.mask) +
                       " names lane " + std::to_string(lane) + " of warp " + std::to_string(arrived.warp) +
                       ", which does not exist (" + std::to_string(threads) + " threads per block)");
    Fiber& f = e.fibers[static_cast<size_t>(first + lane)];
    if (f.state == State::done)
      throw ModelError("cuda model: " + describe_kernel() + ": warp operation waits for lane " + std::to_string(lane) +
                       " of warp " + std::to_string(arrived.warp) + ", which has exited");
    if (f.state != State::at_warp) return;  // not there yet (or at a barrier: a deadlock, found later)
    if (f.mask != arrived.mask || f.op != arrived.op || f.width != arrived.width)
      throw ModelError("cuda model: " + describe_kernel() + ": lanes of warp " + std::to_string(arrived.warp) +
                       " meet at different warp operations or masks");
    lanes.push_back(&f);
  }
  if (!(arrived.mask >> arrived.lane & 1u))
    throw ModelError("cuda model: " + describe_kernel() + ": a lane calls a warp operation whose mask leaves it out");
  if (arrived.op == WarpOp::mma) {
    if (arrived.mask != 0xFFFFFFFFu)
      throw ModelError("cuda model: " + describe_kernel() + ": mma.sync with mask " + hex(arrived.mask) +
                       ": the instruction needs all 32 lanes of the warp");
    multiply_fragments(lanes);
    for (Fiber* f : lanes) f->state = State::ready;
    return;
  }
  std::vector<uint64_t> in(kWarp, 0);
  for (Fiber* f : lanes) in[static_cast<size_t>(f->lane)] = f->value;
  uint64_t votes = 0;
  for (Fiber* f : lanes) votes |= (f->value != 0 ? 1ull : 0ull) << f->lane;
  for (Fiber* f : lanes) {
    switch (f->op) {
      case WarpOp::ballot: f->value = votes; break;
      case WarpOp::any: f->value = votes != 0; break;
      case WarpOp::all: f->value = votes == arrived.mask; break;
      case WarpOp::sync: break;
      default: {
        const int source = shuffle_source(f->op, f->lane, f->operand, f->width);
        if (source >= 0) {
          if (!(arrived.mask >> source & 1u))
            throw ModelError("cuda model: " + describe_kernel() + ": lane " + std::to_string(f->lane) +
                             " shuffles from lane " + std::to_string(source) + ", which is not in the mask");
          f->value = in[static_cast<size_t>(source)];
        }
      }
    }
  }
  for (Fiber* f : lanes) f->state = State::ready;
}

std::string deadlock_report() {
  auto& e = engine();
  int barrier = 0, warp = 0, done = 0;
  for (const Fiber& f : e.fibers) {
    barrier += f.state == State::at_barrier;
    warp += f.state == State::at_warp;
    done += f.state == State::done;
  }
  return "cuda model: " + describe_kernel() + ": deadlock in block (" + std::to_string(e.block_index.x) + ", " +
         std::to_string(e.block_index.y) + "): " + std::to_string(barrier) + " threads at __syncthreads, " +
         std::to_string(warp) + " at a warp operation whose lanes never all arrive, " + std::to_string(done) +
         " exited";
}

// Every live thread waits at a barrier (exited ones do not count, as on sm_70+): releases them, if it
// is the same __syncthreads for all.
void release_barrier() {
  auto& e = engine();
  const Fiber* first = nullptr;
  for (Fiber& f : e.fibers) {
    if (f.state != State::at_barrier) continue;
    if (first == nullptr) first = &f;
    if (f.barrier_line != first->barrier_line || std::strcmp(f.barrier_file, first->barrier_file) != 0)
      throw ModelError("cuda model: " + describe_kernel() + ": threads of one block wait at different __syncthreads (" +
                       first->barrier_file + ":" + std::to_string(first->barrier_line) + " and " + f.barrier_file + ":" +
                       std::to_string(f.barrier_line) + "): a barrier in divergent code");
    f.state = State::ready;
  }
}

// Runs one block's threads to completion in rounds: each round runs the runnable threads, each
// until it blocks, in a shuffled order. A block draws one of two policies: all runnable threads per
// round (lanes of different warps interleaved), or warp-major: only the runnable threads of the
// first warp in a shuffled warp order (redrawn at each barrier), so one warp runs ahead of the others
// up to the next barrier, as a warp that is scheduled first can on the GPU (this exposes a missing
// barrier between two uses of the same shared memory).
void run_block(std::mt19937_64& rng) {
  auto& e = engine();
  const size_t n = e.fibers.size();
  for (size_t t = 0; t < n; ++t) {
    Fiber& f = e.fibers[t];
    f.state = State::ready;
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = e.stacks[t]->usable();
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = &e.scheduler;
    makecontext(&f.context, fiber_main, 0);
  }
  const bool warp_major = (rng() & 1) != 0;
  std::vector<int> warp_rank((n + kWarp - 1) / kWarp);
  std::iota(warp_rank.begin(), warp_rank.end(), 0);
  std::shuffle(warp_rank.begin(), warp_rank.end(), rng);
  std::vector<size_t> order;
  for (;;) {
    order.clear();
    int first_rank = static_cast<int>(warp_rank.size());
    for (size_t t = 0; t < n; ++t)
      if (e.fibers[t].state == State::ready) {
        order.push_back(t);
        first_rank = std::min(first_rank, warp_rank[t / kWarp]);
      }
    if (warp_major)
      std::erase_if(order, [&](size_t t) { return warp_rank[t / kWarp] != first_rank; });
    if (order.empty()) {
      bool all_done = true, any_warp = false;
      for (const Fiber& f : e.fibers) {
        all_done = all_done && f.state == State::done;
        any_warp = any_warp || f.state == State::at_warp;
      }
      if (all_done) return;
      if (any_warp) throw ModelError(deadlock_report());
      release_barrier();
      std::shuffle(warp_rank.begin(), warp_rank.end(), rng);
      continue;
    }
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t t : order) {
      Fiber& f = e.fibers[t];
      if (f.state != State::ready) continue;
      e.current = &f;
      swapcontext(&e.scheduler, &f.context);
      e.current = nullptr;
      if (e.fiber_error) std::rethrow_exception(e.fiber_error);
      if (f.state == State::at_warp) try_complete_warp(f);
      if (f.state == State::done)  // lanes of its warp may be waiting for it
        for (size_t l = t - t % kWarp; l < std::min(n, t - t % kWarp + kWarp); ++l)
          if (e.fibers[l].state == State::at_warp) try_complete_warp(e.fibers[l]);
    }
  }
}

void check_guards() {
  for (const auto& [start, bytes] : engine().allocations)
    for (size_t k = 0; k < kGuardBytes; ++k)
      if (start[bytes + k] != kGuardByte)
        throw ModelError("cuda model: " + describe_kernel() + " wrote " + std::to_string(k) +
                         " bytes past the end of a device allocation of " + std::to_string(bytes) + " bytes");
}

size_t mapped_bytes(size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + kGuardBytes + page - 1) / page * page;
}
void set_access(const uint8_t* start, size_t bytes, bool open) {
  mprotect(const_cast<uint8_t*>(start), mapped_bytes(bytes), open ? PROT_READ | PROT_WRITE : PROT_NONE);
}

// Opens device memory to this process for the lifetime of the object (a launch: all of it; a copy:
// the allocations it touches), then closes it again: host code that dereferences a device pointer
// faults, and the handler below names the mistake, as the GPU's host would crash on it.
class Access {
 public:
  Access() {
    for (const auto& [start, bytes] : engine().allocations) open(start, bytes);
    open_mappings();
  }
  explicit Access(std::initializer_list<const void*> pointers) {
    for (const void* p : pointers) {
      auto& a = engine().allocations;
      auto it = a.upper_bound(static_cast<const uint8_t*>(p));
      if (it != a.begin() && static_cast<const uint8_t*>(p) < std::prev(it)->first + std::prev(it)->second + kGuardBytes)
        open(std::prev(it)->first, std::prev(it)->second);
    }
    open_mappings();  // a copy may span adjacent chunks
  }
  ~Access() {
    for (const auto& [start, bytes] : opened_) set_access(start, bytes, false);
    for (const auto& [start, bytes] : opened_chunks_) mprotect(const_cast<uint8_t*>(start), bytes, PROT_NONE);
  }
  Access(const Access&) = delete;
  Access& operator=(const Access&) = delete;

 private:
  void open(const uint8_t* start, size_t bytes) {
    set_access(start, bytes, true);
    opened_.emplace_back(start, bytes);
  }
  void open_mappings() {
    for (const auto& [start, bytes] : engine().mappings) {
      mprotect(const_cast<uint8_t*>(start), bytes, PROT_READ | PROT_WRITE);
      opened_chunks_.emplace_back(start, bytes);
    }
  }
  std::vector<std::pair<const uint8_t*, size_t>> opened_, opened_chunks_;
};

void on_segfault(int, siginfo_t* info, void*) {
  const auto* at = static_cast<const uint8_t*>(info->si_addr);
  for (const auto& [start, bytes] : engine().allocations)
    if (at >= start && at < start + mapped_bytes(bytes)) {
      static const char message[] =
          "cuda model: host code touched device memory outside a kernel or a cudaMemcpy (a device pointer "
          "dereferenced on the host, which fails on a GPU)\n";
      (void)!write(2, message, sizeof message - 1);
      _exit(3);
    }
  for (const auto& [start, bytes] : engine().reservations)
    if (at >= start && at < start + bytes) {
      static const char message[] =
          "cuda model: reserved device memory touched where no chunk is mapped (released and not committed "
          "again), or by host code outside a kernel or a cudaMemcpy: an illegal address on a GPU\n";
      (void)!write(2, message, sizeof message - 1);
      _exit(3);
    }
  signal(SIGSEGV, SIG_DFL);  // not device memory: the ordinary crash, at the same instruction
}
void install_segfault_handler() {
  static const bool installed = [] {
    struct sigaction action{};
    action.sa_sigaction = on_segfault;
    action.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &action, nullptr);
    return true;
  }();
  (void)installed;
}

bool bad_configuration(const dim3& grid, const dim3& block) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  return grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7FFFFFFFu || grid.y > 65535 || grid.z > 65535 ||
         threads == 0 || threads > 1024 || block.z > 64;
}

// The allocation holding [p, p + bytes), or none.
bool in_device_memory(const void* p, size_t bytes) {
  const auto* u = static_cast<const uint8_t*>(p);
  auto& a = engine().allocations;
  auto it = a.upper_bound(u);
  if (it != a.begin() && u >= std::prev(it)->first && u + bytes <= std::prev(it)->first + std::prev(it)->second)
    return true;
  // Mapped chunks, adjacent ones joined (one reserved range maps them contiguously).
  auto& m = engine().mappings;
  auto chunk = m.upper_bound(u);
  if (chunk == m.begin()) return false;
  --chunk;
  if (u < chunk->first || u >= chunk->first + chunk->second) return false;
  const uint8_t* end = u + bytes;
  for (const uint8_t* covered = chunk->first + chunk->second; covered < end; covered = chunk->first + chunk->second) {
    chunk = m.find(covered);
    if (chunk == m.end()) return false;
  }
  return true;
}

// Breaks the running capture (its end returns cudaErrorStreamCaptureInvalidated) and makes the
// breaking call's error sticky, as CUDA does; the reason names the operation, for the tests.
cudaError_t invalidate_capture(cudaError_t error, const std::string& operation) {
  auto& e = engine();
  if (!e.capture_invalidated) e.invalidation_reason = operation + " while a stream captures";
  e.capture_invalidated = true;
  e.sticky_error = error;
  e.capture_error = error;
  return error;
}

// [p, p + bytes) inside one pinned host allocation.
bool pinned_host(const void* p, size_t bytes) {
  const auto* u = static_cast<const uint8_t*>(p);
  auto& a = engine().pinned;
  auto it = a.upper_bound(u);
  if (it == a.begin()) return false;
  --it;
  return u >= it->first && u + bytes <= it->first + it->second;
}

}  // namespace

bool valid_launch(const LaunchConfig& c) { return !bad_configuration(c.grid, c.block) && c.shared_bytes <= 48 * 1024; }

const std::string& capture_invalidation_reason() { return engine().invalidation_reason; }

bool captured(void* stream, std::function<void()> node, const char* what, bool valid) {
  auto& e = engine();
  if (e.capturing == nullptr) return false;
  if (stream == nullptr) {  // the legacy stream synchronises with the capturing one: CUDA refuses it
    invalidate_capture(cudaErrorStreamCaptureImplicit, std::string(what) + " on the legacy (null) stream");
    return true;
  }
  if (stream != e.capturing) return false;  // another stream runs its work at once
  if (e.capture_invalidated) {
    e.sticky_error = e.capture_error = cudaErrorStreamCaptureInvalidated;
    return true;
  }
  if (!valid) {
    invalidate_capture(cudaErrorInvalidConfiguration, std::string("a bad launch configuration of ") + what);
    return true;
  }
  e.nodes.push_back(std::move(node));
  e.capture_error = cudaSuccess;
  return true;
}

void check_kernel_pointer(const void* p, int argument, const char* kernel_name) {
  if (p != nullptr && !in_device_memory(p, 1))
    throw ModelError("cuda model: kernel " + std::string(kernel_name) + ": argument " + std::to_string(argument + 1) +
                     " is a pointer outside device memory (a host pointer faults on the GPU)");
}

void set_seed(uint64_t seed) { engine().seed = seed + seed_shift(); }
void set_sm_count(int n) { engine().sm_count = n; }
int sm_count() { return engine().sm_count; }
uint64_t launches() { return engine().launches; }
const std::string& last_kernel_name() { return engine().kernel_name; }

const uint3& thread_idx() { return running_thread("threadIdx").index; }
const uint3& block_idx() {
  running_thread("blockIdx");
  return engine().block_index;
}
const dim3& block_dim() {
  running_thread("blockDim");
  return engine().block;
}
const dim3& grid_dim() {
  running_thread("gridDim");
  return engine().grid;
}

void syncthreads(const std::source_location& where) {
  Fiber& f = running_thread("__syncthreads");
  f.state = State::at_barrier;
  f.barrier_file = where.file_name();
  f.barrier_line = where.line();
  yield();
}

uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int operand, int width) {
  Fiber& f = running_thread("a warp operation");
  if (width <= 0 || width > kWarp || (width & (width - 1)) != 0)
    throw ModelError("cuda model: " + describe_kernel() + ": shuffle width " + std::to_string(width) +
                     " is not a power of two up to 32");
  f.op = op;
  f.mask = mask;
  f.value = value;
  f.operand = operand;
  f.width = width;
  f.state = State::at_warp;
  yield();
  return f.value;
}
void syncwarp(unsigned mask) { warp_collective(WarpOp::sync, mask, 0, 0, kWarp); }
void mma_bf16_m16n8k16(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  MmaFragments frag{c, a, b};
  warp_collective(WarpOp::mma, 0xFFFFFFFFu, static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&frag)), 0, kWarp);
}

void run_grid(const LaunchConfig& c, const std::function<void()>& body) {
  auto& e = engine();
  if (e.current != nullptr) throw ModelError("cuda model: a kernel launched from inside a kernel");
  if (bad_configuration(c.grid, c.block) || c.shared_bytes > 48 * 1024) {
    e.sticky_error = cudaErrorInvalidConfiguration;
    return;
  }
  e.kernel_name = c.kernel_name;
  ++e.launches;
  std::mt19937_64 rng(e.seed * 0x9E3779B97F4A7C15ull + e.launches);
  e.grid = c.grid;
  e.block = c.block;
  e.body = &body;
  e.fiber_error = nullptr;
  const size_t threads = size_t{c.block.x} * c.block.y * c.block.z;
  e.fibers.assign(threads, Fiber{});
  while (e.stacks.size() < threads) e.stacks.push_back(std::make_unique<Stack>());
  for (size_t t = 0; t < threads; ++t) {
    Fiber& f = e.fibers[t];
    f.index = uint3{static_cast<unsigned>(t % c.block.x), static_cast<unsigned>(t / c.block.x % c.block.y),
                    static_cast<unsigned>(t / (size_t{c.block.x} * c.block.y))};
    f.warp = static_cast<int>(t / kWarp);
    f.lane = static_cast<int>(t % kWarp);
  }
  std::vector<uint3> blocks;
  for (unsigned z = 0; z < c.grid.z; ++z)
    for (unsigned y = 0; y < c.grid.y; ++y)
      for (unsigned x = 0; x < c.grid.x; ++x) blocks.push_back(uint3{x, y, z});
  std::shuffle(blocks.begin(), blocks.end(), rng);
  const Access device_memory;
  for (const uint3& b : blocks) {
    e.block_index = b;
    run_block(rng);
  }
  e.body = nullptr;
  check_guards();
}

}  // namespace cuda_model

// ------------------------------------------------------------------ runtime API --------------------
using cuda_model::engine;

namespace {
struct ModelStream {};
cudaError_t record(cudaError_t status) {
  if (status != cudaSuccess) engine().sticky_error = status;
  return status;
}
bool host_side(cudaMemcpyKind kind, bool destination) {
  return kind == cudaMemcpyHostToHost || (destination ? kind == cudaMemcpyDeviceToHost : kind == cudaMemcpyHostToDevice);
}
}  // namespace

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
  }
  return "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
  }
  return "unknown error";
}
cudaError_t cudaGetLastError() { return std::exchange(engine().sticky_error, cudaSuccess); }
cudaError_t cudaPeekAtLastError() { return engine().sticky_error; }
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return record(device == 0 ? cudaSuccess : cudaErrorInvalidDevice); }
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return record(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "nibble CUDA model (sm_90, %d SMs)", engine().sm_count);
  std::memcpy(prop->uuid.bytes, "nibble-cudamodel", 16);
  prop->totalGlobalMem = size_t{16} << 30;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = engine().sm_count;
  prop->maxThreadsPerBlock = 1024;
  prop->warpSize = 32;
  prop->sharedMemPerBlock = 48 * 1024;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  *pool = reinterpret_cast<cudaMemPool_t>(uintptr_t{0x1000});
  return record(device == 0 ? cudaSuccess : cudaErrorInvalidDevice);
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, cudaMemPoolAttr, void*) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize() {
  if (engine().capturing) return cuda_model::invalidate_capture(cudaErrorStreamCaptureUnsupported, "cudaDeviceSynchronize");
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) {
  *stream = reinterpret_cast<cudaStream_t>(new ModelStream);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete reinterpret_cast<ModelStream*>(stream);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {  // its work ran at submission
  const void* c = engine().capturing;
  if (c && (stream == c || stream == nullptr))
    return cuda_model::invalidate_capture(cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize (a host read)");
  return cudaSuccess;
}

cudaError_t cudaMallocAsync(void** ptr, size_t bytes, cudaStream_t stream) {
  const void* c = engine().capturing;
  if (c && (stream == c || stream == nullptr))
    return cuda_model::invalidate_capture(cudaErrorStreamCaptureUnsupported,
                                          "an allocation of " + std::to_string(bytes) +
                                              " bytes (allocate the step's buffers before capture)");
  cuda_model::install_segfault_handler();
  void* mapping = mmap(nullptr, cuda_model::mapped_bytes(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED) return record(cudaErrorMemoryAllocation);
  auto* raw = static_cast<uint8_t*>(mapping);
  // Unwritten memory reads as 0xFF bytes (NaN). Allocations beyond every test tensor's size (the
  // cuBLASLt workspace, which no kernel here reads) stay the mapping's zeros: filling them would
  // cost each context 32 MiB of page faults.
  if (bytes <= cuda_model::kPoisonedBytes) std::memset(raw, cuda_model::kUnwrittenByte, bytes);
  std::memset(raw + bytes, cuda_model::kGuardByte, cuda_model::kGuardBytes);
  cuda_model::set_access(raw, bytes, false);
  engine().allocations[raw] = bytes;
  *ptr = raw;
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** ptr, size_t bytes) { return cudaMallocAsync(ptr, bytes, nullptr); }
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  const void* c = engine().capturing;
  if (c && (stream == c || stream == nullptr))
    return cuda_model::invalidate_capture(cudaErrorStreamCaptureUnsupported, "a device free (keep the step's buffers)");
  auto& a = engine().allocations;
  const auto it = a.find(static_cast<const uint8_t*>(ptr));
  if (it == a.end()) return record(cudaErrorInvalidValue);
  munmap(ptr, cuda_model::mapped_bytes(it->second));
  a.erase(it);
  return cudaSuccess;
}
cudaError_t cudaFree(void* ptr) { return cudaFreeAsync(ptr, nullptr); }
// Copies check that the device side lies inside one allocation (the host side cannot be checked).
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  const bool dst_ok = host_side(kind, true) || kind == cudaMemcpyDefault || cuda_model::in_device_memory(dst, bytes);
  const bool src_ok = host_side(kind, false) || kind == cudaMemcpyDefault || cuda_model::in_device_memory(src, bytes);
  if (!dst_ok || !src_ok) return record(cudaErrorInvalidValue);
  if (stream != nullptr && stream == engine().capturing && !engine().capture_invalidated) {
    // The node copies from and to these addresses at every replay: host memory must be pinned.
    const bool dst_pinned = cuda_model::in_device_memory(dst, bytes) || cuda_model::pinned_host(dst, bytes);
    const bool src_pinned = cuda_model::in_device_memory(src, bytes) || cuda_model::pinned_host(src, bytes);
    if (!dst_pinned || !src_pinned)
      return cuda_model::invalidate_capture(cudaErrorStreamCaptureUnsupported,
                                            "cudaMemcpyAsync with pageable host memory");
  }
  const auto copy = [=] {
    const cuda_model::Access open({dst, src});
    std::memmove(dst, src, bytes);
  };
  if (cuda_model::captured(stream, copy, "cudaMemcpyAsync")) return engine().capture_error;
  copy();
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (!cuda_model::in_device_memory(ptr, bytes)) return record(cudaErrorInvalidValue);
  const auto set = [=] {
    const cuda_model::Access open({ptr});
    std::memset(ptr, value, bytes);
  };
  if (cuda_model::captured(stream, set, "cudaMemsetAsync")) return engine().capture_error;
  set();
  return cudaSuccess;
}
cudaError_t cudaMemset(void* ptr, int value, size_t bytes) { return cudaMemsetAsync(ptr, value, bytes, nullptr); }

cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  if (engine().capturing) return cuda_model::invalidate_capture(cudaErrorStreamCaptureUnsupported, "cudaMallocHost");
  auto* raw = static_cast<uint8_t*>(std::malloc(bytes == 0 ? 1 : bytes));
  if (raw == nullptr) return record(cudaErrorMemoryAllocation);
  engine().pinned[raw] = bytes;
  *ptr = raw;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* ptr) {
  auto& p = engine().pinned;
  const auto it = p.find(static_cast<const uint8_t*>(ptr));
  if (it == p.end()) return record(cudaErrorInvalidValue);
  std::free(ptr);
  p.erase(it);
  return cudaSuccess;
}

// ------------------------------------------------------------------ virtual memory (cuda.h) --------
namespace {
struct Vmm {
  std::map<CUmemGenericAllocationHandle, size_t> created;  // handle -> bytes
  CUmemGenericAllocationHandle next = 1;
  size_t created_bytes = 0, limit = 0;
};
Vmm& vmm() {
  static Vmm v;
  return v;
}
// The reservation holding [p, p + bytes), or reservations.end().
std::map<const uint8_t*, size_t>::iterator reservation_of(const uint8_t* p, size_t bytes) {
  auto& r = engine().reservations;
  auto it = r.upper_bound(p);
  if (it == r.begin()) return r.end();
  --it;
  return p >= it->first && p + bytes <= it->first + it->second ? it : r.end();
}
const uint8_t* at(CUdeviceptr p) { return reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(p)); }
// Mapped chunks (mapped, access not yet set) of the model: start -> (bytes, access set).
std::map<const uint8_t*, std::pair<size_t, bool>>& chunks() {
  static std::map<const uint8_t*, std::pair<size_t, bool>> c;
  return c;
}
}  // namespace

namespace cuda_model {
size_t vmm_mapped_bytes() {
  size_t n = 0;
  for (const auto& [start, chunk] : chunks()) n += chunk.first;
  return n;
}
size_t vmm_created_bytes() { return vmm().created_bytes; }
void vmm_limit_bytes(size_t n) { vmm().limit = n; }
}  // namespace cuda_model

CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  if (device != 0 || attribute != CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) return CUDA_ERROR_INVALID_VALUE;
  *value = 1;
  return CUDA_SUCCESS;
}
CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                       CUmemAllocationGranularity_flags) {
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      prop->location.id != 0)
    return CUDA_ERROR_INVALID_VALUE;
  *granularity = cuda_model::kVmmGranularity;
  return CUDA_SUCCESS;
}
CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long) {
  const size_t g = cuda_model::kVmmGranularity;
  if (size == 0 || size % g != 0 || (alignment != 0 && alignment % g != 0) || addr != 0) return CUDA_ERROR_INVALID_VALUE;
  cuda_model::install_segfault_handler();
  void* range = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (range == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  engine().reservations[static_cast<const uint8_t*>(range)] = size;
  *ptr = reinterpret_cast<uintptr_t>(range);
  return CUDA_SUCCESS;
}
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  auto& r = engine().reservations;
  const auto it = r.find(at(ptr));
  if (it == r.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  // Everything mapped into it must have been unmapped first.
  const auto inside = chunks().lower_bound(at(ptr));
  if (inside != chunks().end() && inside->first < at(ptr) + size) return CUDA_ERROR_INVALID_VALUE;
  munmap(const_cast<uint8_t*>(it->first), size);
  r.erase(it);
  return CUDA_SUCCESS;
}
CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                     unsigned long long flags) {
  if (size == 0 || size % cuda_model::kVmmGranularity != 0 || flags != 0 || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id != 0)
    return CUDA_ERROR_INVALID_VALUE;
  Vmm& v = vmm();
  if (v.limit != 0 && v.created_bytes + size > v.limit) return CUDA_ERROR_OUT_OF_MEMORY;
  *handle = v.next++;
  v.created[*handle] = size;
  v.created_bytes += size;
  return CUDA_SUCCESS;
}
CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  Vmm& v = vmm();
  const auto it = v.created.find(handle);
  if (it == v.created.end()) return CUDA_ERROR_INVALID_VALUE;
  v.created_bytes -= it->second;
  v.created.erase(it);
  return CUDA_SUCCESS;
}
// A chunk's memory starts as unwritten bytes (NaN), like cudaMalloc's here: fresh physical memory
// holds whatever it held.
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long) {
  const auto created = vmm().created.find(handle);
  if (created == vmm().created.end() || created->second != size || offset != 0 ||
      reservation_of(at(ptr), size) == engine().reservations.end())
    return CUDA_ERROR_INVALID_VALUE;
  auto& c = chunks();
  const auto next = c.lower_bound(at(ptr));
  if ((next != c.end() && next->first < at(ptr) + size) ||
      (next != c.begin() && std::prev(next)->first + std::prev(next)->second.first > at(ptr)))
    return CUDA_ERROR_INVALID_VALUE;  // overlaps a mapped chunk
  auto* p = const_cast<uint8_t*>(at(ptr));
  mprotect(p, size, PROT_READ | PROT_WRITE);
  std::memset(p, cuda_model::kUnwrittenByte, size);
  mprotect(p, size, PROT_NONE);
  c[at(ptr)] = {size, false};
  return CUDA_SUCCESS;
}
// Device memory from here on: kernels and copies reach it (engine().mappings).
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  if (count != 1 || desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc->location.id != 0 ||
      desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
    return CUDA_ERROR_INVALID_VALUE;
  auto& c = chunks();
  for (auto it = c.find(at(ptr)); size > 0; it = c.find(at(ptr))) {
    if (it == c.end() || it->second.first > size) return CUDA_ERROR_INVALID_VALUE;  // not whole mapped chunks
    it->second.second = true;
    engine().mappings[it->first] = it->second.first;
    ptr += it->second.first;
    size -= it->second.first;
  }
  return CUDA_SUCCESS;
}
// Unmapped memory is unreachable again (an illegal address) and gives its pages back.
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  auto& c = chunks();
  for (auto it = c.find(at(ptr)); size > 0; it = c.find(at(ptr))) {
    if (it == c.end() || it->second.first > size) return CUDA_ERROR_INVALID_VALUE;
    auto* p = const_cast<uint8_t*>(it->first);
    const size_t n = it->second.first;
    engine().mappings.erase(it->first);
    c.erase(it);
    madvise(p, n, MADV_DONTNEED);
    mprotect(p, n, PROT_NONE);
    ptr += n;
    size -= n;
  }
  return CUDA_SUCCESS;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** function, unsigned int version,
                                             unsigned long long flags, cudaDriverEntryPointQueryResult* status) {
  static const std::map<std::string, void*> functions = {
      {"cuDeviceGetAttribute", reinterpret_cast<void*>(&cuDeviceGetAttribute)},
      {"cuMemGetAllocationGranularity", reinterpret_cast<void*>(&cuMemGetAllocationGranularity)},
      {"cuMemAddressReserve", reinterpret_cast<void*>(&cuMemAddressReserve)},
      {"cuMemAddressFree", reinterpret_cast<void*>(&cuMemAddressFree)},
      {"cuMemCreate", reinterpret_cast<void*>(&cuMemCreate)},
      {"cuMemRelease", reinterpret_cast<void*>(&cuMemRelease)},
      {"cuMemMap", reinterpret_cast<void*>(&cuMemMap)},
      {"cuMemUnmap", reinterpret_cast<void*>(&cuMemUnmap)},
      {"cuMemSetAccess", reinterpret_cast<void*>(&cuMemSetAccess)},
  };
  if (version < 12000 || flags != cudaEnableDefault) return record(cudaErrorInvalidValue);
  const auto it = functions.find(symbol);
  *function = it == functions.end() ? nullptr : it->second;
  if (status) *status = it == functions.end() ? cudaDriverEntryPointSymbolNotFound : cudaDriverEntryPointSuccess;
  return cudaSuccess;
}

// ------------------------------------------------------------------ stream capture and graphs ------
struct CUgraph_st {
  std::vector<std::function<void()>> nodes;
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> nodes;
};

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  auto& e = engine();
  if (stream == nullptr) return record(cudaErrorStreamCaptureUnsupported);  // the legacy stream cannot capture
  if (e.capturing) return record(cudaErrorInvalidValue);  // the model captures one stream at a time
  e.capturing = stream;
  e.capture_invalidated = false;
  e.invalidation_reason.clear();
  e.nodes.clear();
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  auto& e = engine();
  if (stream == nullptr || stream != e.capturing) return record(cudaErrorInvalidValue);
  e.capturing = nullptr;
  *graph = nullptr;
  if (e.capture_invalidated) {
    e.nodes.clear();
    return record(cudaErrorStreamCaptureInvalidated);
  }
  *graph = new CUgraph_st{std::exchange(e.nodes, {})};
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  const auto& e = engine();
  *status = stream == nullptr || stream != e.capturing ? cudaStreamCaptureStatusNone
            : e.capture_invalidated                    ? cudaStreamCaptureStatusInvalidated
                                                       : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (graph == nullptr) return record(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->nodes};
  return cudaSuccess;
}
// The nodes run in capture order (a valid schedule of a graph captured from one stream).
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == nullptr) return record(cudaErrorInvalidValue);
  const auto run = [nodes = exec->nodes] {
    for (const auto& node : nodes) node();
  };
  if (cuda_model::captured(stream, run, "cudaGraphLaunch")) return engine().capture_error;
  run();
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, void* nodes, size_t* count) {
  if (graph == nullptr || nodes != nullptr) return record(cudaErrorInvalidValue);
  *count = graph->nodes.size();
  return cudaSuccess;
}

// ------------------------------------------------------------------ cuBLASLt handles ---------------
cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  *handle = reinterpret_cast<cublasLtHandle_t>(uintptr_t{0x2000});
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
const char* cublasLtGetStatusName(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS"
         : s == CUBLAS_STATUS_INVALID_VALUE ? "CUBLAS_STATUS_INVALID_VALUE"
                                            : "CUBLAS_STATUS_NOT_SUPPORTED";
}
const char* cublasLtGetStatusString(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? "success" : "the CUDA model's cuBLASLt has no algorithm or refused a parameter";
}

// ------------------------------------------------------------------ cuBLASLt descriptors and GEMMs --
struct cublasLtMatmulDescOpaque {
  int transa = CUBLAS_OP_N, transb = CUBLAS_OP_N, pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  int a_scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, b_scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  const void *a_scales = nullptr, *b_scales = nullptr;
};
struct cublasLtMatrixLayoutOpaque {
  cuda_model::LtLayout layout;
};
struct cublasLtMatmulPreferenceOpaque {
  size_t workspace = 0;
};

namespace cuda_model {
LtRecord& lt_record() {
  static LtRecord r;
  return r;
}
}  // namespace cuda_model

namespace {
template <class T>
cublasStatus_t read_attribute(T& field, const void* value, size_t bytes) {
  if (bytes != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&field, value, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}
bool modelled_types(const cublasLtMatrixLayoutOpaque* a, const cublasLtMatrixLayoutOpaque* b,
                    const cublasLtMatrixLayoutOpaque* d) {
  const int t = a->layout.type;
  return t == b->layout.type && (t == CUDA_R_16BF || t == CUDA_R_32F) && d->layout.type == CUDA_R_32F;
}
float element(const cuda_model::LtLayout& l, const void* data, uint64_t row, uint64_t col) {
  const uint64_t at = row + col * static_cast<uint64_t>(l.ld);
  if (l.type == CUDA_R_16BF) return __uint_as_float(static_cast<unsigned>(static_cast<const uint16_t*>(data)[at]) << 16);
  return static_cast<const float*>(data)[at];
}
}  // namespace

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale) {
  if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  *desc = new cublasLtMatmulDescOpaque;
  ++cuda_model::lt_record().descriptors;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void* value, size_t bytes) {
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return read_attribute(d->pointer_mode, value, bytes);
    case CUBLASLT_MATMUL_DESC_TRANSA: return read_attribute(d->transa, value, bytes);
    case CUBLASLT_MATMUL_DESC_TRANSB: return read_attribute(d->transb, value, bytes);
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: return read_attribute(d->a_scales, value, bytes);
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: return read_attribute(d->b_scales, value, bytes);
    case CUBLASLT_MATMUL_DESC_A_SCALE_MODE: return read_attribute(d->a_scale_mode, value, bytes);
    case CUBLASLT_MATMUL_DESC_B_SCALE_MODE: return read_attribute(d->b_scale_mode, value, bytes);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType_t type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (ld < static_cast<int64_t>(rows)) return CUBLAS_STATUS_INVALID_VALUE;  // column-major: ld >= rows
  *layout = new cublasLtMatrixLayoutOpaque{{static_cast<int>(type), rows, cols, ld}};
  ++cuda_model::lt_record().layouts;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = new cublasLtMatmulPreferenceOpaque;
  ++cuda_model::lt_record().preferences;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* value,
                                                    size_t bytes) {
  if (attr != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) return CUBLAS_STATUS_INVALID_VALUE;
  return read_attribute(pref->workspace, value, bytes);
}
// One algorithm per supported problem; its id is a function of the layouts and transposes, so the
// same problem gets the same id whether it was asked once or again.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t* results, int* count) {
  ++cuda_model::lt_record().heuristic_queries;
  *count = 0;
  if (requested < 1 || !modelled_types(a, b, d)) return CUBLAS_STATUS_NOT_SUPPORTED;
  results[0] = {};
  uint64_t id = 1469598103934665603ull;
  for (uint64_t v : {a->layout.rows, a->layout.cols, static_cast<uint64_t>(a->layout.ld), b->layout.rows, b->layout.cols,
                     static_cast<uint64_t>(b->layout.ld), static_cast<uint64_t>(d->layout.ld),
                     static_cast<uint64_t>(desc->transa), static_cast<uint64_t>(desc->transb)})
    id = (id ^ v) * 1099511628211ull;
  results[0].algo.data[0] = id;
  *count = 1;
  return CUBLAS_STATUS_SUCCESS;
}
// D = alpha op(A) op(B) + beta C, column-major; C is not read when beta is 0 (cuBLAS's rule).
namespace {
cublasStatus_t run_matmul(cublasLtMatmulDesc_t desc, const void* alpha, const void* a, cublasLtMatrixLayout_t la,
                          const void* b, cublasLtMatrixLayout_t lb, const void* beta, const void* c,
                          cublasLtMatrixLayout_t lc, void* d, cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t* algo,
                          void* workspace, size_t workspace_bytes);
}  // namespace

// Under capture the node keeps the descriptors' contents and, in host pointer mode, alpha and beta's
// values (cuBLASLt reads host scalars at the call): a replay uses those, whatever the host holds then.
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha, const void* a,
                              cublasLtMatrixLayout_t la, const void* b, cublasLtMatrixLayout_t lb, const void* beta,
                              const void* c, cublasLtMatrixLayout_t lc, void* d, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                              CUstream_st* stream) {
  if (!modelled_types(la, lb, ld) || algo == nullptr) return CUBLAS_STATUS_NOT_SUPPORTED;
  struct Frozen {
    cublasLtMatmulDescOpaque desc;
    cublasLtMatrixLayoutOpaque la, lb, lc, ld;
    cublasLtMatmulAlgo_t algo;
    float alpha, beta;
  };
  auto f = std::make_shared<Frozen>(Frozen{*desc, *la, *lb, *lc, *ld, *algo, 0.0f, 0.0f});
  const bool host_scalars = desc->pointer_mode != CUBLASLT_POINTER_MODE_DEVICE;
  if (host_scalars) {
    f->alpha = *static_cast<const float*>(alpha);
    f->beta = *static_cast<const float*>(beta);
  }
  const auto node = [=] {
    const cublasStatus_t status =
        run_matmul(&f->desc, host_scalars ? &f->alpha : alpha, a, &f->la, b, &f->lb, host_scalars ? &f->beta : beta, c,
                   &f->lc, d, &f->ld, &f->algo, workspace, workspace_bytes);
    if (status != CUBLAS_STATUS_SUCCESS) throw cuda_model::ModelError("cuda model: a captured cublasLtMatmul failed at replay");
  };
  if (cuda_model::captured(stream, node, "cublasLtMatmul"))
    return engine().capture_error == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
  return run_matmul(desc, alpha, a, la, b, lb, beta, c, lc, d, ld, algo, workspace, workspace_bytes);
}

namespace {
cublasStatus_t run_matmul(cublasLtMatmulDesc_t desc, const void* alpha, const void* a, cublasLtMatrixLayout_t la,
                          const void* b, cublasLtMatrixLayout_t lb, const void* beta, const void* c,
                          cublasLtMatrixLayout_t lc, void* d, cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t* algo,
                          void* workspace, size_t workspace_bytes) {
  const cuda_model::Access open;  // the whole device memory, as a kernel has it
  cuda_model::LtMatmulCall call{desc->transa,  desc->transb,  desc->pointer_mode, desc->a_scale_mode,
                                desc->b_scale_mode, desc->a_scales, desc->b_scales, la->layout,
                                lb->layout,    lc->layout,    ld->layout,        a,
                                b,             c,             d,                 0.0f,
                                0.0f,          algo->data[0], workspace,         workspace_bytes};
  const bool on_device = desc->pointer_mode == CUBLASLT_POINTER_MODE_DEVICE;
  if (on_device && (!cuda_model::in_device_memory(alpha, 4) || !cuda_model::in_device_memory(beta, 4)))
    return CUBLAS_STATUS_INVALID_VALUE;
  call.alpha = *static_cast<const float*>(alpha);
  call.beta = *static_cast<const float*>(beta);
  const uint64_t m = ld->layout.rows, n = ld->layout.cols;
  const uint64_t k = desc->transa == CUBLAS_OP_N ? la->layout.cols : la->layout.rows;
  const bool a_ok = (desc->transa == CUBLAS_OP_N ? la->layout.rows : la->layout.cols) == m;
  const bool b_ok = (desc->transb == CUBLAS_OP_N ? lb->layout.rows : lb->layout.cols) == k &&
                    (desc->transb == CUBLAS_OP_N ? lb->layout.cols : lb->layout.rows) == n;
  if (!a_ok || !b_ok || lc->layout != ld->layout) return CUBLAS_STATUS_INVALID_VALUE;
  std::vector<float> out(m * n);
  for (uint64_t j = 0; j < n; ++j)
    for (uint64_t i = 0; i < m; ++i) {
      float sum = 0.0f;
      for (uint64_t p = 0; p < k; ++p) {
        const float x = desc->transa == CUBLAS_OP_N ? element(la->layout, a, i, p) : element(la->layout, a, p, i);
        const float y = desc->transb == CUBLAS_OP_N ? element(lb->layout, b, p, j) : element(lb->layout, b, j, p);
        sum += x * y;
      }
      const float prior = call.beta == 0.0f ? 0.0f : call.beta * element(lc->layout, c, i, j);
      out[i + j * m] = call.alpha * sum + prior;
    }
  for (uint64_t j = 0; j < n; ++j)
    for (uint64_t i = 0; i < m; ++i) static_cast<float*>(d)[i + j * static_cast<uint64_t>(ld->layout.ld)] = out[i + j * m];
  cuda_model::lt_record().calls.push_back(call);
  return CUBLAS_STATUS_SUCCESS;
}
}  // namespace
