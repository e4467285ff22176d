#include "backend/ops.h"
#include "base/error.h"

namespace astrai::backend {

namespace {
OpsFactory& cuda_factory() {
  static OpsFactory f = nullptr;
  return f;
}
}  // namespace

void register_backend(Device device, OpsFactory factory) {
  ASTRAI_CHECK(device == Device::kCuda, "only a CUDA backend can be registered");
  cuda_factory() = factory;
}

const Ops& ops_for(Device device) {
  if (device == Device::kCpu) return cpu_ops();
  if (cuda_factory() == nullptr)
    fail("no backend for CUDA memory in this program: it was built without the CUDA backend (no CUDA toolkit at "
         "configure time) or does not link it");
  return cuda_factory()();  // an error saying what is missing when there is no usable GPU
}

}  // namespace astrai::backend
