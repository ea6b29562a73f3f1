// A host model of the NCCL calls nibble makes (kernels/cuda/nccl_collective.cu), for the CUDA model:
// the ranks of a communicator are host threads of one test process, all on the model's one device,
// so the collective's own code (its schedule of sends, receives, broadcasts and adds, the bucket
// loop, the grouping) runs in CI and is compared with the CPU's tree sums bit for bit.
//
// Semantics kept (NCCL's user guide): point-to-point messages between two ranks match in the order
// they were posted, per (sender, receiver) pair; a receive of another length than its matching send
// is an error; calls between ncclGroupStart and ncclGroupEnd are issued together at the outermost
// ncclGroupEnd, so partners that both send first do not deadlock; a broadcast's root may pass the
// same buffer as input and output. The stream is the CUDA model's (work runs at once, in order), so
// an operation completes in its ncclGroupEnd (or its own call outside a group); sends copy their data
// when issued. ncclAllReduce adds the ranks' values in rank order (one valid order; NCCL's own
// depends on its algorithm). Only ncclFloat32 and ncclSum are modelled.
//
// Threads: the CUDA model is single-threaded, so each rank thread holds the model's one lock for its
// whole life (nccl_model::RankThread) and gives it up only while it waits for another rank's message.
// A wait longer than nccl_model::kWaitSeconds is reported as ncclSystemError naming the two ranks
// (the ranks' schedules disagree), instead of a hang.
#pragma once
#include <cstddef>

#include "cuda_runtime.h"

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
} ncclResult_t;
typedef enum { ncclFloat32 = 7 } ncclDataType_t;
typedef enum { ncclSum = 0 } ncclRedOp_t;
typedef struct {
  char internal[128];
} ncclUniqueId;
struct ncclComm;
typedef struct ncclComm* ncclComm_t;

const char* ncclGetErrorString(ncclResult_t result);
const char* ncclGetLastError(ncclComm_t comm);  // the model's message for this thread's last failure
ncclResult_t ncclGetVersion(int* version);
ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);

namespace nccl_model {

inline constexpr int kWaitSeconds = 20;

// Held by every thread that acts as a rank, for its whole life (see the top of this file).
class RankThread {
 public:
  RankThread();
  ~RankThread();
  RankThread(const RankThread&) = delete;
  RankThread& operator=(const RankThread&) = delete;
};

// Point-to-point messages and broadcasts issued so far (tests check that a path communicated).
size_t messages();

}  // namespace nccl_model
