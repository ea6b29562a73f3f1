// <cublasLt.h> for the CUDA model: the handle, status, descriptor, layout, preference, heuristic and
// matmul calls that nibble's gemm.cu makes, with cuBLASLt's names (values are the model's own). The
// model records every descriptor it builds and every matmul with the parameters it was given (the
// host replay: tests compare these call parameters, as no tensor core runs here), and computes
// BF16 x BF16 and FP32 x FP32 products into FP32 (sums in k order) so that code around the GEMMs
// runs. Other types have no algorithm (CUBLAS_STATUS_NOT_SUPPORTED from the heuristic): Hopper
// without FP4, and the callers' fallbacks run.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

enum cublasStatus_t : int {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_NOT_SUPPORTED = 15
};
struct cublasLtContext;
typedef cublasLtContext* cublasLtHandle_t;
struct CUstream_st;

enum cudaDataType_t : int {
  CUDA_R_32F = 0,
  CUDA_R_16BF = 14,
  CUDA_R_8F_E4M3 = 28,
  CUDA_R_8F_E5M2 = 29,
  CUDA_R_4F_E2M1 = 33
};
typedef cudaDataType_t cudaDataType;
enum cublasComputeType_t : int { CUBLAS_COMPUTE_32F = 68 };
enum cublasOperation_t : int { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasLtPointerMode_t : int { CUBLASLT_POINTER_MODE_HOST = 0, CUBLASLT_POINTER_MODE_DEVICE = 1 };
enum cublasLtMatmulMatrixScale_t : int {
  CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F = 0,
  CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 = 1
};
enum cublasLtMatmulDescAttributes_t : int {
  CUBLASLT_MATMUL_DESC_POINTER_MODE = 2,
  CUBLASLT_MATMUL_DESC_TRANSA = 3,
  CUBLASLT_MATMUL_DESC_TRANSB = 4,
  CUBLASLT_MATMUL_DESC_A_SCALE_POINTER = 17,
  CUBLASLT_MATMUL_DESC_B_SCALE_POINTER = 18,
  CUBLASLT_MATMUL_DESC_A_SCALE_MODE = 31,
  CUBLASLT_MATMUL_DESC_B_SCALE_MODE = 32
};
enum cublasLtMatmulPreferenceAttributes_t : int { CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1 };

struct cublasLtMatmulDescOpaque;
typedef cublasLtMatmulDescOpaque* cublasLtMatmulDesc_t;
struct cublasLtMatrixLayoutOpaque;
typedef cublasLtMatrixLayoutOpaque* cublasLtMatrixLayout_t;
struct cublasLtMatmulPreferenceOpaque;
typedef cublasLtMatmulPreferenceOpaque* cublasLtMatmulPreference_t;
struct cublasLtMatmulAlgo_t {
  uint64_t data[8];
};
struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle);
const char* cublasLtGetStatusName(cublasStatus_t status);
const char* cublasLtGetStatusString(cublasStatus_t status);

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* value, size_t bytes);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType_t type, uint64_t rows,
                                          uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* value,
                                                    size_t bytes);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results, int* count);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* a,
                              cublasLtMatrixLayout_t la, const void* b, cublasLtMatrixLayout_t lb, const void* beta,
                              const void* c, cublasLtMatrixLayout_t lc, void* d, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                              CUstream_st* stream);

namespace cuda_model {
// What the model recorded: descriptors built, heuristic queries, and each matmul's parameters.
struct LtLayout {
  int type = -1;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  bool operator==(const LtLayout&) const = default;
};
struct LtMatmulCall {
  int transa = 0, transb = 0, pointer_mode = 0, a_scale_mode = 0, b_scale_mode = 0;
  const void *a_scales = nullptr, *b_scales = nullptr;
  LtLayout a, b, c, d;
  const void *a_data = nullptr, *b_data = nullptr, *c_data = nullptr, *d_data = nullptr;
  float alpha = 0, beta = 0;  // the values it read (host or device per pointer mode)
  uint64_t algo = 0;          // the heuristic's algorithm id (a function of the problem in the model)
  const void* workspace = nullptr;
  size_t workspace_bytes = 0;
  bool operator==(const LtMatmulCall&) const = default;
};
struct LtRecord {
  uint64_t descriptors = 0, layouts = 0, preferences = 0, heuristic_queries = 0;
  std::vector<LtMatmulCall> calls;
};
LtRecord& lt_record();  // tests may clear it
}  // namespace cuda_model
