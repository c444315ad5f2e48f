// What tch cannot do, in a few lines against libtorch's own headers:
// * free and re-allocate the storage behind a gathered flat parameter buffer while autograd
//   still holds views of it (FULL_SHARD frees gathered parameters after forward without
//   recomputing the forward in backward);
// * backward of one unit seeded with an upstream gradient (torch::autograd::grad), returning
//   the gradients instead of accumulating them into `.grad`;
// * AdamW over all units at once (`_fused_adamw_`, which tch does not generate);
// * the CUDA caching allocator's statistics;
// * causal attention within packed documents by flash attention's variable-length kernel
//   (`_flash_attention_forward` with sequence offsets), which tch does not generate;
// * page-locked copies of host tensors without tch's deprecated device argument (libtorch
//   prints two warnings for every call that passes one);
// * whether SDPA may choose cuDNN's kernel.
// Every entry point catches C++ exceptions and returns them as a malloc'ed message
// (nullptr on success); the caller frees it with shardrun_free_error.
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/_flash_attention_forward.h>
#include <ATen/ops/_fused_adamw.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <vector>

namespace {
char* error_message(const char* what) { return strdup(what); }

// libtorch's errors without the C++ stack trace their what() appends: a message for people.
char* error_message(const std::exception& e) {
  if (auto* error = dynamic_cast<const c10::Error*>(&e)) {
    return strdup(error->what_without_backtrace());
  }
  return strdup(e.what());
}
}  // namespace

extern "C" {

void shardrun_free_error(char* message) { free(message); }

char* shardrun_storage_release(const at::Tensor* tensor) {
  try {
    c10::StorageImpl* storage = tensor->storage().unsafeGetStorageImpl();
    storage->set_data_ptr_noswap(c10::DataPtr(nullptr, storage->device()));
    storage->set_nbytes(0);
    return nullptr;
  } catch (const std::exception& e) {
    return error_message(e);
  }
}

char* shardrun_storage_allocate(const at::Tensor* tensor, size_t nbytes) {
  try {
    c10::StorageImpl* storage = tensor->storage().unsafeGetStorageImpl();
    c10::Allocator* allocator = storage->allocator();
    if (allocator == nullptr) return error_message("storage has no allocator");
    // The CUDA caching allocator allocates on the *current* device: make it the storage's.
    c10::DeviceGuard guard(storage->device());
    storage->set_data_ptr_noswap(allocator->allocate(nbytes));
    storage->set_nbytes(nbytes);
    return nullptr;
  } catch (const std::exception& e) {
    return error_message(e);
  }
}

size_t shardrun_storage_nbytes(const at::Tensor* tensor) {
  return tensor->storage().nbytes();
}

// grads[i] = d(sum(output * upstream))/d inputs[i]; upstream may be null (output is a scalar
// loss). Unused inputs give undefined tensors.
char* shardrun_grad(const at::Tensor* output, const at::Tensor* upstream,
                    const at::Tensor* const* inputs, int n_inputs, at::Tensor** grads) {
  try {
    std::vector<at::Tensor> in;
    in.reserve(n_inputs);
    for (int i = 0; i < n_inputs; ++i) in.push_back(*inputs[i]);
    std::vector<at::Tensor> seed;
    if (upstream != nullptr) seed.push_back(*upstream);
    auto result = torch::autograd::grad({*output}, in, seed, /*retain_graph=*/false,
                                        /*create_graph=*/false, /*allow_unused=*/true);
    for (int i = 0; i < n_inputs; ++i) grads[i] = new at::Tensor(result[i]);
    return nullptr;
  } catch (const std::exception& e) {
    return error_message(e);
  }
}

// AdamW (torch.optim.AdamW(fused=True)) on n flat tensors in one call: one multi-tensor
// kernel launch on CUDA instead of ~10 kernels per tensor. `step` is the step count (a float
// tensor on the tensors' device) shared by all of them.
char* shardrun_fused_adamw(const at::Tensor* const* params, const at::Tensor* const* grads,
                           const at::Tensor* const* exp_avgs,
                           const at::Tensor* const* exp_avg_sqs, int n, const at::Tensor* step,
                           double lr, double beta1, double beta2, double weight_decay,
                           double eps) {
  try {
    std::vector<at::Tensor> p, g, m, v, steps, unused;
    for (int i = 0; i < n; ++i) {
      p.push_back(*params[i]);
      g.push_back(*grads[i]);
      m.push_back(*exp_avgs[i]);
      v.push_back(*exp_avg_sqs[i]);
      steps.push_back(*step);
    }
    at::NoGradGuard no_grad;
    at::_fused_adamw_(p, g, m, v, unused, steps, lr, beta1, beta2, weight_decay, eps,
                      /*amsgrad=*/false, /*maximize=*/false);
    return nullptr;
  } catch (const std::exception& e) {
    return error_message(e);
  }
}

// The CUDA caching allocator on `device`: bytes allocated (handed to tensors) and reserved
// (taken from the device), now and at their peak (torch.cuda.memory_allocated,
// max_memory_allocated, memory_reserved, max_memory_reserved).
char* shardrun_cuda_memory(int device, int64_t* allocated, int64_t* peak_allocated,
                           int64_t* reserved, int64_t* peak_reserved) {
  try {
    auto stats = c10::getDeviceAllocator(c10::DeviceType::CUDA)
                     ->getDeviceStats(static_cast<c10::DeviceIndex>(device));
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    *allocated = stats.allocated_bytes[all].current;
    *peak_allocated = stats.allocated_bytes[all].peak;
    *reserved = stats.reserved_bytes[all].current;
    *peak_reserved = stats.reserved_bytes[all].peak;
    return nullptr;
  } catch (const std::exception& e) {
    return error_message(e);
  }
}

// Causal attention of every document with itself: q (tokens, heads, head_dim), k and v
// (tokens, kv_heads, head_dim), fp16 or bf16 on a CUDA device; `offsets` (int32, on that
// device) the first token of each document and then the token count, `longest` the longest
// document. Autograd records the kernel's own backward (FlashAttentionBackward0). What
// torch.nn.attention.varlen.varlen_attn computes, with its default scale 1/sqrt(head_dim).
// `*refused` is 1 when the kernel refused these inputs (its checks, before any launch), 0
// when it failed otherwise (out of memory, a CUDA error): only a refusal may fall back.
char* shardrun_flash_varlen(const at::Tensor* q, const at::Tensor* k, const at::Tensor* v,
                            const at::Tensor* offsets, int64_t longest, at::Tensor** out,
                            int* refused) {
  *refused = 0;
  try {
    auto result = at::_flash_attention_forward(*q, *k, *v, *offsets, *offsets, longest, longest,
                                               /*dropout_p=*/0.0, /*is_causal=*/true,
                                               /*return_debug_mask=*/false);
    *out = new at::Tensor(std::get<0>(result));
    return nullptr;
  } catch (const c10::OutOfMemoryError& e) {
    return error_message(e);
  } catch (const c10::AcceleratorError& e) {
    return error_message(e);
  } catch (const c10::Error& e) {
    *refused = 1;
    return error_message(e);
  } catch (const std::exception& e) {
    return error_message(e);
  }
}

// A page-locked copy of a host tensor, for copies to the GPU that do not block the host.
char* shardrun_pin_memory(const at::Tensor* tensor, at::Tensor** out) {
  try {
    *out = new at::Tensor(tensor->pin_memory());
    return nullptr;
  } catch (const std::exception& e) {
    return error_message(e);
  }
}

// Whether SDPA may choose cuDNN's attention kernel (torch.backends.cuda.enable_cudnn_sdp).
void shardrun_sdp_use_cudnn(bool enabled) { at::globalContext().setSDPUseCuDNN(enabled); }

bool shardrun_sdp_cudnn_enabled() { return at::globalContext().userEnabledCuDNNSDP(); }

}  // extern "C"
