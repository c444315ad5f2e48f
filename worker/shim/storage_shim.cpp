// What tch cannot do, in a few lines against libtorch's own headers:
// * free and re-allocate the storage behind a gathered flat parameter buffer while autograd
//   still holds views of it (FULL_SHARD frees gathered parameters after forward without
//   recomputing the forward in backward);
// * backward of one unit seeded with an upstream gradient (torch::autograd::grad), returning
//   the gradients instead of accumulating them into `.grad`.
// Every entry point catches C++ exceptions and returns them as a malloc'ed message
// (nullptr on success); the caller frees it with shardrun_free_error.
#include <ATen/core/Tensor.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <vector>

namespace {
char* error_message(const char* what) { return strdup(what); }
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
    return error_message(e.what());
  }
}

char* shardrun_storage_allocate(const at::Tensor* tensor, size_t nbytes) {
  try {
    c10::StorageImpl* storage = tensor->storage().unsafeGetStorageImpl();
    c10::Allocator* allocator = storage->allocator();
    if (allocator == nullptr) return error_message("storage has no allocator");
    storage->set_data_ptr_noswap(allocator->allocate(nbytes));
    storage->set_nbytes(nbytes);
    return nullptr;
  } catch (const std::exception& e) {
    return error_message(e.what());
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
    return error_message(e.what());
  }
}

// Peak bytes the CUDA caching allocator handed out on `device` (torch.cuda.max_memory_allocated).
char* shardrun_cuda_peak_allocated(int device, int64_t* peak) {
  try {
    auto stats = c10::getDeviceAllocator(c10::DeviceType::CUDA)
                     ->getDeviceStats(static_cast<c10::DeviceIndex>(device));
    *peak = stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
    return nullptr;
  } catch (const std::exception& e) {
    return error_message(e.what());
  }
}

}  // extern "C"
