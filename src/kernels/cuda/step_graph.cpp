#include "kernels/cuda/step_graph.h"

#include <exception>
#include <utility>

#include "kernels/cuda/cuda_error.h"

namespace nibble::cuda {

StepGraph::~StepGraph() { release(); }

void StepGraph::release() {
  if (exec_) cudaGraphExecDestroy(exec_);
  exec_ = nullptr;
}

void StepGraph::capture(Context& ctx, const std::function<void()>& work) {
  ++captures_;
  reason_.clear();
  NIBBLE_CUDA_CHECK(cudaStreamBeginCapture(ctx.stream(), cudaStreamCaptureModeGlobal));
  // A call the capture refuses fails (NIBBLE_CUDA_CHECK throws naming it); the capture must still be
  // ended, or the stream stays in capture mode.
  std::string thrown;
  try {
    work();
  } catch (const std::exception& e) {
    thrown = e.what();
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(ctx.stream(), &graph);
  cudaGetLastError();  // the refused call's error is the capture's, not the next launch's
  cudaGraphExec_t exec = nullptr;
  cudaError_t made = ended;
  if (ended == cudaSuccess && thrown.empty()) made = cudaGraphInstantiate(&exec, graph, 0);
  if (graph) cudaGraphDestroy(graph);
  if (made == cudaSuccess && thrown.empty()) {
    exec_ = exec;
    return;
  }
  if (exec) cudaGraphExecDestroy(exec);
  reason_ = !thrown.empty() ? thrown : std::string("capture failed: ") + cudaGetErrorString(made);
}

bool StepGraph::run(Context& ctx, const Key& key, const std::function<void()>& work) {
  if (!have_key_ || key != key_) {
    release();
    key_ = key;
    have_key_ = true;
    capture(ctx, work);  // records, runs nothing
  }
  if (!exec_) {
    work();
    return false;
  }
  NIBBLE_CUDA_CHECK(cudaGraphLaunch(exec_, ctx.stream()));
  return true;
}

}  // namespace nibble::cuda
