// The NCCL model (nccl.h): communicators over host threads, mailboxes per (sender, receiver) pair.
#include "nccl.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace nccl_model {
namespace {

using Payload = std::vector<float>;

// One communicator's shared state, found by its unique id.
struct World {
  int nranks = 0, joined = 0;
  std::map<std::pair<int, int>, std::deque<Payload>> p2p;         // (from, to) -> sends not yet received
  std::map<std::pair<int, int>, std::deque<Payload>> broadcasts;  // (root, to) -> broadcasts not yet received
  std::map<size_t, std::vector<Payload>> reductions;              // all-reduce number -> each rank's values
  std::map<size_t, int> reductions_done;                          // all-reduce number -> ranks finished
};

struct Op {
  enum Kind { send, recv, broadcast, all_reduce } kind;
  const void* in;
  void* out;
  size_t count;
  int peer;  // send/recv: the other rank; broadcast: the root
  ncclComm_t comm;
};

std::mutex& model_lock() {
  static std::mutex m;
  return m;
}
std::condition_variable& arrivals() {
  static std::condition_variable cv;
  return cv;
}
std::map<std::string, std::shared_ptr<World>>& worlds() {
  static std::map<std::string, std::shared_ptr<World>> w;
  return w;
}
size_t& message_count() {
  static size_t n = 0;
  return n;
}

thread_local std::unique_lock<std::mutex>* held = nullptr;
thread_local int group_depth = 0;
thread_local std::vector<Op> grouped;
thread_local std::string last_error;

}  // namespace

RankThread::RankThread() { held = new std::unique_lock<std::mutex>(model_lock()); }
RankThread::~RankThread() {
  delete held;
  held = nullptr;
}

size_t messages() { return message_count(); }

}  // namespace nccl_model

struct ncclComm {
  std::shared_ptr<nccl_model::World> world;
  int rank = 0;
  size_t reductions = 0;  // all-reduces this rank has issued
};

namespace nccl_model {
namespace {

ncclResult_t fail(ncclResult_t result, std::string message) {
  last_error = std::move(message);
  return result;
}

// Waits (giving the model's lock to the other ranks) until ready() or the time limit.
template <class Ready>
bool wait_for(Ready ready) {
  return arrivals().wait_for(*held, std::chrono::seconds(kWaitSeconds), ready);
}

Payload read_device(const void* p, size_t count) {
  Payload v(count);
  if (count && cudaMemcpy(v.data(), p, count * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess)
    throw std::runtime_error("a buffer outside the model's device memory");
  return v;
}
void write_device(void* p, const Payload& v) {
  if (!v.empty() && cudaMemcpy(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
    throw std::runtime_error("a buffer outside the model's device memory");
}

std::string pair_text(int a, int b) { return "rank " + std::to_string(a) + " and rank " + std::to_string(b); }

// Issues a group: every send, broadcast root and all-reduce contribution first (they never wait),
// then the receives in the order posted.
ncclResult_t issue(const std::vector<Op>& ops) {
  try {
    for (const Op& op : ops) {
      World& w = *op.comm->world;
      const int me = op.comm->rank;
      if (op.kind == Op::send) {
        w.p2p[{me, op.peer}].push_back(read_device(op.in, op.count));
        ++message_count();
      } else if (op.kind == Op::broadcast && op.peer == me) {
        const Payload data = read_device(op.in, op.count);
        for (int to = 0; to < w.nranks; ++to)
          if (to != me) w.broadcasts[{me, to}].push_back(data);
        if (op.out != op.in) write_device(op.out, data);
        ++message_count();
      } else if (op.kind == Op::all_reduce) {
        auto& slot = w.reductions[op.comm->reductions];
        slot.resize(static_cast<size_t>(w.nranks));
        slot[static_cast<size_t>(me)] = read_device(op.in, op.count);
      }
    }
    arrivals().notify_all();
    for (const Op& op : ops) {
      World& w = *op.comm->world;
      const int me = op.comm->rank;
      if (op.kind == Op::recv || (op.kind == Op::broadcast && op.peer != me)) {
        auto& box = op.kind == Op::recv ? w.p2p[{op.peer, me}] : w.broadcasts[{op.peer, me}];
        if (!wait_for([&] { return !box.empty(); }))
          return fail(ncclSystemError, pair_text(me, op.peer) + ": rank " + std::to_string(me) + " waited " +
                                           std::to_string(kWaitSeconds) + " s for a message that was never sent " +
                                           "(the ranks' schedules disagree)");
        Payload data = std::move(box.front());
        box.pop_front();
        if (data.size() != op.count)
          return fail(ncclInvalidUsage, pair_text(op.peer, me) + ": " + std::to_string(data.size()) +
                                            " values sent, " + std::to_string(op.count) + " received");
        write_device(op.out, data);
      } else if (op.kind == Op::all_reduce) {
        const size_t number = op.comm->reductions++;
        auto& slot = w.reductions[number];
        const auto all_in = [&] {
          for (const Payload& p : slot)
            if (p.size() != op.count) return false;
          return true;
        };
        if (!wait_for(all_in))
          return fail(ncclSystemError, "rank " + std::to_string(me) + " waited for the other ranks' all-reduce");
        Payload sum = slot[0];
        for (size_t r = 1; r < slot.size(); ++r)
          for (size_t i = 0; i < sum.size(); ++i) sum[i] = sum[i] + slot[r][i];
        write_device(op.out, sum);
        if (++w.reductions_done[number] == w.nranks) {
          w.reductions.erase(number);
          w.reductions_done.erase(number);
        }
      }
    }
  } catch (const std::exception& e) {
    return fail(ncclInvalidArgument, e.what());
  }
  return ncclSuccess;
}

ncclResult_t add(Op op) {
  if (!held) return fail(ncclInvalidUsage, "an NCCL call from a thread without nccl_model::RankThread");
  if (!op.comm) return fail(ncclInvalidArgument, "a null communicator");
  if (op.peer < 0 || op.peer >= op.comm->world->nranks)
    return fail(ncclInvalidArgument, "peer or root " + std::to_string(op.peer) + " outside the communicator");
  if (group_depth > 0) {
    grouped.push_back(op);
    return ncclSuccess;
  }
  return issue({op});
}

}  // namespace
}  // namespace nccl_model

using namespace nccl_model;

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
  }
  return "unknown result code";
}
const char* ncclGetLastError(ncclComm_t) { return last_error.c_str(); }
ncclResult_t ncclGetVersion(int* version) {
  *version = 22807;  // reported as 2.28.7
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static int next = 0;
  std::memset(id->internal, 0, sizeof id->internal);
  const std::string name = "model-" + std::to_string(next++);
  std::memcpy(id->internal, name.data(), name.size());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (!held) return fail(ncclInvalidUsage, "ncclCommInitRank from a thread without nccl_model::RankThread");
  if (nranks < 1 || rank < 0 || rank >= nranks) return fail(ncclInvalidArgument, "rank outside [0, nranks)");
  auto& world = worlds()[std::string(id.internal, strnlen(id.internal, sizeof id.internal))];
  if (!world) world = std::make_shared<World>();
  if (world->nranks == 0) world->nranks = nranks;
  if (world->nranks != nranks) return fail(ncclInvalidArgument, "ranks joined with different nranks");
  auto* c = new ncclComm;
  c->world = world;
  c->rank = rank;
  ++world->joined;
  arrivals().notify_all();
  if (!wait_for([&] { return world->joined >= nranks; })) {
    delete c;
    return fail(ncclSystemError, "ncclCommInitRank: not every rank joined");
  }
  *comm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--group_depth > 0) return ncclSuccess;
  const std::vector<Op> ops = std::exchange(grouped, {});
  return issue(ops);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t, int peer, ncclComm_t comm, cudaStream_t) {
  return add({Op::send, sendbuff, nullptr, count, peer, comm});
}
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t, int peer, ncclComm_t comm, cudaStream_t) {
  return add({Op::recv, nullptr, recvbuff, count, peer, comm});
}
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t, int root,
                           ncclComm_t comm, cudaStream_t) {
  return add({Op::broadcast, sendbuff, recvbuff, count, root, comm});
}
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t, ncclRedOp_t,
                           ncclComm_t comm, cudaStream_t) {
  return add({Op::all_reduce, sendbuff, recvbuff, count, 0, comm});
}
