// A piece of a stream's work captured once as a CUDA graph and replayed: one launch for all of its
// kernels, copies and memsets instead of one each. What the captured work depends on besides device
// memory (shapes, buffer pointers, which launches it makes) is its key: a new key captures again.
// When the work cannot be captured (it synchronises, allocates, copies pageable memory, or anything
// else the capture refuses), it runs eagerly for that key and fallback_reason() says why.
//
// The work must be re-runnable and must take every per-run value from device memory (a kernel
// argument is frozen at capture): write per-run inputs (tokens, an SR step hash, scalars) into
// fixed device buffers, e.g. from pinned host memory, before run().
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/context.h"

namespace nibble::cuda {

class StepGraph {
 public:
  using Key = std::vector<uint64_t>;
  StepGraph() = default;
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Runs work's effect on ctx's stream: as the graph captured for key (capturing it first when the
  // key is new), or eagerly when capturing it failed. Returns whether it ran as a graph.
  bool run(Context& ctx, const Key& key, const std::function<void()>& work);

  // Why the current key runs eagerly (one line), or empty.
  const std::string& fallback_reason() const { return reason_; }
  int captures() const { return captures_; }  // capture attempts so far (tests: a new key re-captures)

 private:
  void release();
  // Captures work into exec_; on failure leaves exec_ null and sets reason_.
  void capture(Context& ctx, const std::function<void()>& work);

  cudaGraphExec_t exec_ = nullptr;
  Key key_;
  bool have_key_ = false;
  std::string reason_;
  int captures_ = 0;
};

}  // namespace nibble::cuda
