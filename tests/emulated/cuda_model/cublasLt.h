// <cublasLt.h> for the CUDA model: only the handle and status calls that the context and the error
// policy make. cuBLASLt's GEMMs are not modelled (the host replay tests check their parameters).
#pragma once

enum cublasStatus_t : int { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_SUPPORTED = 15 };
struct cublasLtContext;
typedef cublasLtContext* cublasLtHandle_t;

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle);
const char* cublasLtGetStatusName(cublasStatus_t status);
const char* cublasLtGetStatusString(cublasStatus_t status);
