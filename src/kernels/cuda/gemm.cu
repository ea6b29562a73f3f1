// cuBLASLt GEMMs: native NVFP4 (Blackwell), FP8 (Ada/Hopper+), BF16, and the exact BF16 emulation
// of NVFP4/MX on GPUs without FP4 units. See gemm.h.
//
// Layout: cuBLASLt is column-major. A row-major C[M,N] is the column-major C^T[N,M], and
// C^T = B . A^T, so cuBLASLt's "A" is our b (stored [N,K] row-major = column-major [K,N], used
// transposed) and its "B" is our a (column-major [K,M], not transposed): m = N, n = M, "TN".
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "format/gemm_rules.h"
#include "kernels/cuda/device_math.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemm_kernels.cuh"
#include "kernels/cuda/launch.h"

namespace nibble::cuda {

std::string_view to_string(GemmPath p) {
  switch (p) {
    case GemmPath::native_nvfp4: return "native NVFP4 (cuBLASLt, FP4 tensor cores)";
    case GemmPath::fp8_cublaslt: return "FP8 (cuBLASLt)";
    case GemmPath::emulated_bf16: return "emulated (exact BF16 decode + cuBLASLt BF16)";
  }
  return "?";
}

void check_gemm_operands(Format af, int64_t a_rows, int64_t a_cols, Format bf, int64_t b_rows, int64_t b_cols,
                         int64_t ldc, bool a_rht, bool b_rht) {
  const bool compatible = (af == bf && !is_per_tensor_fp8(af)) || (is_per_tensor_fp8(af) && is_per_tensor_fp8(bf));
  if (!compatible)
    throw UsageError("cannot multiply " + std::string(to_string(af)) + " by " + std::string(to_string(bf)) +
                     ": use nvfp4 x nvfp4, mxfp4 x mxfp4, mxfp8 x mxfp8 or fp8 x fp8");
  check_rht_pair(a_rht, b_rht);  // the CPU gemm's rule and message
  if (a_cols != b_cols)
    throw UsageError("GEMM operands disagree on K: a is [" + std::to_string(a_rows) + ", " + std::to_string(a_cols) +
                     "], b is [" + std::to_string(b_rows) + ", " + std::to_string(b_cols) +
                     "] (both must be K-contiguous: C = a . b^T)");
  if (ldc < b_rows)
    throw UsageError("ldc " + std::to_string(ldc) + " is smaller than N = " + std::to_string(b_rows));
  if (a_rows <= 0 || b_rows <= 0 || a_cols <= 0) throw UsageError("GEMM with an empty operand");
}

GemmPath choose_gemm_path(Format a, Format b, GemmShape s, int cc_major, int cc_minor) {
  if (a == Format::nvfp4 && b == Format::nvfp4 && has_native_nvfp4_gemm(cc_major, cc_minor) && s.k % 32 == 0 &&
      s.ldc % 4 == 0)
    return GemmPath::native_nvfp4;
  // cuBLASLt FP8 wants 16-byte aligned leading dimensions and has no e5m2 x e5m2 kernels.
  if (is_per_tensor_fp8(a) && is_per_tensor_fp8(b) && !(a == Format::fp8_e5m2 && b == Format::fp8_e5m2) &&
      has_fp8_gemm(cc_major, cc_minor) && s.k % 16 == 0 && s.ldc % 4 == 0)
    return GemmPath::fp8_cublaslt;
  return GemmPath::emulated_bf16;
}

namespace {

// ------------------------------------------------------------------ cuBLASLt plumbing --------------
struct MatmulDesc {
  cublasLtMatmulDesc_t desc = nullptr;
  MatmulDesc(const MatmulDesc&) = delete;
  MatmulDesc& operator=(const MatmulDesc&) = delete;
  MatmulDesc() { NIBBLE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)); }
  ~MatmulDesc() { cublasLtMatmulDescDestroy(desc); }
  template <typename T>
  void set(cublasLtMatmulDescAttributes_t attr, const T& value) {
    NIBBLE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
  }
};
struct Layout {
  cublasLtMatrixLayout_t layout = nullptr;
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
  Layout(cudaDataType type, int64_t rows, int64_t cols, int64_t ld) {
    NIBBLE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, static_cast<uint64_t>(rows),
                                                   static_cast<uint64_t>(cols), ld));
  }
  ~Layout() { cublasLtMatrixLayoutDestroy(layout); }
};
struct Preference {
  cublasLtMatmulPreference_t pref = nullptr;
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
  explicit Preference(size_t workspace) {
    NIBBLE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    NIBBLE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &workspace, sizeof(workspace)));
  }
  ~Preference() { cublasLtMatmulPreferenceDestroy(pref); }
};

// One cuBLASLt operand as cuBLASLt sees it (column-major, before op).
struct LtOperand {
  cudaDataType type;
  const void* data;
  int64_t rows, cols, ld;
  cublasOperation_t op;
  const void* block_scales = nullptr;  // swizzled, for block-scaled narrow types
  int32_t scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
};

// The problem a cuBLASLt plan serves: everything its descriptor, layouts and algorithm depend on
// (types, transposes, scale modes, shape, leading dimensions, where alpha/beta live). The data and
// block-scale pointers are not part of it: they are given per call.
struct PlanKey {
  int a_type, b_type, a_op, b_op, a_scale_mode, b_scale_mode;
  int64_t m, n, k, a_rows, a_cols, lda, b_rows, b_cols, ldb, ldd;
  bool device_scalars;
  auto operator<=>(const PlanKey&) const = default;
};

// One problem's matmul descriptor, its three layouts (D is also C) and the heuristic's algorithm
// (found == false: cuBLASLt has none, the caller falls back), built once per key.
struct Plan {
  MatmulDesc desc;
  Layout a, b, d;
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
  Plan(const PlanKey& key, const LtOperand& lt_a, const LtOperand& lt_b, Context& ctx)
      : a(lt_a.type, lt_a.rows, lt_a.cols, lt_a.ld), b(lt_b.type, lt_b.rows, lt_b.cols, lt_b.ld), d(CUDA_R_32F, key.m, key.n, key.ldd) {
    desc.set(CUBLASLT_MATMUL_DESC_TRANSA, lt_a.op);
    desc.set(CUBLASLT_MATMUL_DESC_TRANSB, lt_b.op);
    if (key.device_scalars) desc.set(CUBLASLT_MATMUL_DESC_POINTER_MODE, static_cast<int32_t>(CUBLASLT_POINTER_MODE_DEVICE));
    if (lt_a.block_scales) {
      desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, lt_a.scale_mode);
      desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, lt_a.block_scales);
    }
    if (lt_b.block_scales) {
      desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, lt_b.scale_mode);
      desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, lt_b.block_scales);
    }
    const Preference pref(ctx.blas_workspace_bytes());
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(ctx.blas(), desc.desc, a.layout, b.layout, d.layout, d.layout, pref.pref, 1, &result, &count);
    if (status == CUBLAS_STATUS_SUCCESS && count > 0) {
      found = true;
      algo = result.algo;
    } else if (status != CUBLAS_STATUS_NOT_SUPPORTED && status != CUBLAS_STATUS_SUCCESS) {
      NIBBLE_CUBLAS_CHECK(status);
    }
  }
};

// The context's plans (Context::gemm_plans holds it); disabled, every call builds its own plan and
// drops it, as before the cache (set_gemm_plan_cache: the replay tests compare the two).
struct PlanCache {
  bool enabled = true;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
};
PlanCache& plan_cache(Context& ctx) {
  std::shared_ptr<void>& slot = ctx.gemm_plans();
  if (!slot) slot = std::make_shared<PlanCache>();
  return *static_cast<PlanCache*>(slot.get());
}

// Runs D = alpha * opA(A) opB(B) + beta * D (m x n, FP32, ld ldd). alpha_beta points to {alpha, beta}
// in device memory when `device_scalars`, else in host memory. Returns false, having launched
// nothing, when cuBLASLt has no algorithm for this combination (the caller falls back).
bool lt_matmul(Context& ctx, int64_t m, int64_t n, int64_t k, const LtOperand& a, const LtOperand& b, float* d,
               int64_t ldd, const float* alpha_beta, bool device_scalars) {
  const PlanKey key{static_cast<int>(a.type), static_cast<int>(b.type), static_cast<int>(a.op), static_cast<int>(b.op),
                    a.scale_mode, b.scale_mode, m, n, k, a.rows, a.cols, a.ld, b.rows, b.cols, b.ld, ldd,
                    device_scalars};
  PlanCache& cache = plan_cache(ctx);
  std::unique_ptr<Plan> own;
  Plan* plan = nullptr;
  if (cache.enabled) {
    auto it = cache.plans.find(key);
    if (it == cache.plans.end()) it = cache.plans.emplace(key, std::make_unique<Plan>(key, a, b, ctx)).first;
    plan = it->second.get();
    // This call's block scales (the same slots as a rule, but an operand may bring its own).
    if (a.block_scales) plan->desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a.block_scales);
    if (b.block_scales) plan->desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b.block_scales);
  } else {
    own = std::make_unique<Plan>(key, a, b, ctx);
    plan = own.get();
  }
  if (!plan->found) return false;
  NIBBLE_CUBLAS_CHECK(cublasLtMatmul(ctx.blas(), plan->desc.desc, alpha_beta, a.data, plan->a.layout, b.data,
                                     plan->b.layout, alpha_beta + 1, d, plan->d.layout, d, plan->d.layout, &plan->algo,
                                     ctx.blas_workspace(), ctx.blas_workspace_bytes(), ctx.stream()));
  return true;
}

cudaDataType fp8_type(Format f) { return f == Format::fp8_e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

}  // namespace

namespace {
// The BF16 operand of the emulated GEMM: the one the quantize kernel wrote, else decoded into `slot`.
const uint16_t* emulation_operand(const DeviceQuantized& q, Context::Scratch slot, Context& ctx) {
  if (q.bf16.size() == static_cast<size_t>(q.rows * q.cols)) return q.bf16.data();
  auto* out = reinterpret_cast<uint16_t*>(ctx.scratch(slot, static_cast<size_t>(q.rows * q.cols) * 2));
  dequantize_block_scaled_bf16(q, out, ctx);
  return out;
}

GemmPath gemm_per_tensor_factors(const DeviceQuantized& a, const DeviceQuantized& b, float* c, int64_t ldc, float alpha,
                                 Output output, Context& ctx) {
  check_gemm_operands(a.format, a.rows, a.cols, b.format, b.rows, b.cols, ldc, a.rht, b.rht);
  const int64_t M = a.rows, N = b.rows, K = a.cols;
  // A row-scaled operand's globals[1] is 1: the GEMM below runs on the per-tensor factors into a
  // scratch product, and the epilogue applies the per-row ones (cuBLASLt has no per-row alpha).
  const bool row_scaled = a.row_scaled || b.row_scaled;
  if (row_scaled) {
    c = reinterpret_cast<float*>(ctx.scratch(Context::Scratch::product, static_cast<size_t>(M * N) * sizeof(float)));
    ldc = N;
  }
  const bool accumulate_here = output == Output::accumulate && !row_scaled;
  const GemmShape shape{M, N, K, ldc};
  const DeviceInfo& dev = ctx.device();
  GemmPath path = choose_gemm_path(a.format, b.format, shape, dev.cc_major, dev.cc_minor);

  float* alpha_beta = reinterpret_cast<float*>(ctx.scratch(Context::Scratch::scalars, 2 * sizeof(float)));
  NIBBLE_LAUNCH(1, 1, 0, ctx.stream(), gemm_kernels::fold_alpha_kernel)(
      a.globals.data(), b.globals.data(), alpha, accumulate_here ? 1.0f : 0.0f, alpha_beta);
  NIBBLE_CUDA_CHECK_LAUNCH();

  // cuBLASLt may lack kernels that read alpha from the device for some narrow-type combinations:
  // then fetch it (one synchronisation) and retry with host scalars before falling back.
  auto run_lt = [&](const LtOperand& lt_a, const LtOperand& lt_b) {
    if (lt_matmul(ctx, N, M, K, lt_a, lt_b, c, ldc, alpha_beta, true)) return true;
    float host_scalars[2];
    NIBBLE_CUDA_CHECK(cudaMemcpyAsync(host_scalars, alpha_beta, sizeof host_scalars, cudaMemcpyDeviceToHost, ctx.stream()));
    NIBBLE_CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
    return lt_matmul(ctx, N, M, K, lt_a, lt_b, c, ldc, host_scalars, false);
  };
  if (path == GemmPath::native_nvfp4) {
    uint8_t* sa = ctx.scratch(Context::Scratch::scales_a, static_cast<size_t>(dm::swizzled_scale_bytes(M, K / 16)));
    uint8_t* sb = ctx.scratch(Context::Scratch::scales_b, static_cast<size_t>(dm::swizzled_scale_bytes(N, K / 16)));
    swizzle_scales(a, sa, ctx);
    swizzle_scales(b, sb, ctx);
    const LtOperand lt_a{CUDA_R_4F_E2M1, b.codes.data(), K, N, K, CUBLAS_OP_T, sb,
                         CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3};
    const LtOperand lt_b{CUDA_R_4F_E2M1, a.codes.data(), K, M, K, CUBLAS_OP_N, sa,
                         CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3};
    if (run_lt(lt_a, lt_b)) return path;
    path = GemmPath::emulated_bf16;
  } else if (path == GemmPath::fp8_cublaslt) {
    const LtOperand lt_a{fp8_type(b.format), b.codes.data(), K, N, K, CUBLAS_OP_T};
    const LtOperand lt_b{fp8_type(a.format), a.codes.data(), K, M, K, CUBLAS_OP_N};
    if (run_lt(lt_a, lt_b)) return path;
    path = GemmPath::emulated_bf16;
  }

  // Emulation: exact BF16 operands (block scale folded in), global scales in alpha; an operand
  // whose quantization wrote them (KernelOptions::write_bf16_operand) needs no dequantize pass.
  const uint16_t* a16 = emulation_operand(a, Context::Scratch::operand_a, ctx);
  const uint16_t* b16 = emulation_operand(b, Context::Scratch::operand_b, ctx);
  gemm_bf16(Trans::no, Trans::yes, M, N, K, 0.0f, a16, K, b16, K, 0.0f, c, ldc, ctx, alpha_beta);
  return path;
}

}  // namespace

GemmPath gemm(const DeviceQuantized& a, const DeviceQuantized& b, float* c, int64_t ldc, float alpha, Output output,
              Context& ctx) {
  for (const DeviceQuantized* q : {&a, &b})
    if (q->row_scaled && static_cast<int64_t>(q->row_globals.size()) != 2 * q->rows)
      throw UsageError("a row-scaled GEMM operand needs its per-row amax and decode scales (" + std::to_string(q->rows) +
                       " rows)");
  GemmPath path = gemm_per_tensor_factors(a, b, c, ldc, alpha, output, ctx);
  if (a.row_scaled || b.row_scaled) {
    const int64_t M = a.rows, N = b.rows;
    const float* product = reinterpret_cast<const float*>(
        ctx.scratch(Context::Scratch::product, static_cast<size_t>(M * N) * sizeof(float)));  // what it wrote
    const int threads = 256;
    const int64_t blocks = std::min<int64_t>((M * N + threads - 1) / threads, int64_t{65535});
    NIBBLE_LAUNCH(static_cast<unsigned>(blocks), threads, 0, ctx.stream(), gemm_kernels::row_scale_epilogue_kernel)(
        product, M, N, a.row_scaled ? a.row_globals.data() + M : nullptr, b.row_scaled ? b.row_globals.data() + N : nullptr,
        output == Output::accumulate, c, ldc);
    NIBBLE_CUDA_CHECK_LAUNCH();
  }
  return path;
}

namespace {
// C = alpha op(A) op(B) + beta C (row-major) through cuBLASLt on operands of `type`, FP32 compute.
void dense_gemm(cudaDataType type, const char* name, Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                const void* a, int64_t lda, const void* b, int64_t ldb, float beta, float* c, int64_t ldc, Context& ctx,
                const float* alpha_beta_device) {
  if (m <= 0 || n <= 0 || k <= 0) throw UsageError(std::string(name) + " with an empty dimension");
  // C^T[N,M] = op(B)^T . op(A)^T. A row-major matrix is its own transpose in column-major terms:
  // op(B)^T is B's storage as is when tb == no ([N,K] column-major view of row-major [K,N]).
  const LtOperand lt_a = tb == Trans::no ? LtOperand{type, b, n, k, ldb, CUBLAS_OP_N}
                                         : LtOperand{type, b, k, n, ldb, CUBLAS_OP_T};
  const LtOperand lt_b = ta == Trans::no ? LtOperand{type, a, k, m, lda, CUBLAS_OP_N}
                                         : LtOperand{type, a, m, k, lda, CUBLAS_OP_T};
  float host_scalars[2] = {alpha, beta};
  if (alpha_beta_device != nullptr) {
    if (lt_matmul(ctx, n, m, k, lt_a, lt_b, c, ldc, alpha_beta_device, true)) return;
    // No algorithm reads alpha from the device for this shape (an odd ldc, say): fetch the scalars
    // (one synchronisation) and ask again with host scalars, as gemm()'s run_lt does.
    NIBBLE_CUDA_CHECK(cudaMemcpyAsync(host_scalars, alpha_beta_device, sizeof host_scalars, cudaMemcpyDeviceToHost,
                                      ctx.stream()));
    NIBBLE_CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
  }
  if (!lt_matmul(ctx, n, m, k, lt_a, lt_b, c, ldc, host_scalars, false))
    throw CudaError(std::string("cuBLASLt offers no ") + name + " algorithm for m=" + std::to_string(m) +
                    " n=" + std::to_string(n) + " k=" + std::to_string(k) + " on " + ctx.device().name);
}
}  // namespace

void gemm_bf16(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
               const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc, Context& ctx,
               const float* alpha_beta_device) {
  dense_gemm(CUDA_R_16BF, "BF16 GEMM", ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ctx, alpha_beta_device);
}

void gemm_f32(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc, Context& ctx) {
  dense_gemm(CUDA_R_32F, "FP32 GEMM", ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ctx, nullptr);
}

size_t gemm_plan_entries(Context& ctx) { return plan_cache(ctx).plans.size(); }
void set_gemm_plan_cache(Context& ctx, bool enabled) {
  PlanCache& cache = plan_cache(ctx);
  cache.enabled = enabled;
  if (!enabled) cache.plans.clear();
}

}  // namespace nibble::cuda
