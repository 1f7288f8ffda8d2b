// The gpu op tests' device side (tests/gpu/ops_device.cu), unchanged, compiled by the host compiler
// against the CUDA simulator: what runs here runs unchanged on a real GPU.
#include "../gpu/ops_device.cu"

// Attention's wrappers (tests/gpu/ops_device_attention.cu) need WMMA, which the simulator does not
// run yet: until it does, they refuse, so a test that reaches them fails instead of passing.
namespace etude::gpu_test {
attn_fwd_out attention_fwd(dtype, const vec&, index_t, index_t, int, index_t) {
  throw etude::error("cuda_sim: attention is not simulated yet (WMMA)");
}
vec attention_bwd(dtype, const vec&, const vec&, const vec&, const vec&, index_t, index_t, int, index_t) {
  throw etude::error("cuda_sim: attention is not simulated yet (WMMA)");
}
}  // namespace etude::gpu_test
