#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "base/error.h"

namespace astrai::backend {

namespace {

OpsFactory& cuda_factory() {
  static OpsFactory f = nullptr;
  return f;
}

std::string program_dir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}

// Loads the CUDA backend module (its static initializer registers the factory): from
// $ASTRAI_CUDA_MODULE, else next to the program or in ../lib. Returns why it could not.
std::string load_cuda_module() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("ASTRAI_CUDA_MODULE")) candidates.emplace_back(env);
  const std::string dir = program_dir();
  candidates.push_back(dir + "/libastrai_cuda.so");
  candidates.push_back(dir + "/../lib/libastrai_cuda.so");
  std::string why;
  for (const std::string& path : candidates) {
    if (access(path.c_str(), F_OK) != 0) continue;
    if (dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) != nullptr) return "";
    why += std::string(why.empty() ? "" : "; ") + dlerror();
  }
  return why.empty() ? "libastrai_cuda.so is not next to the program: it was built without the CUDA backend (no CUDA "
                       "toolkit at configure time)"
                     : why;
}

}  // namespace

void register_backend(Device device, OpsFactory factory) {
  ASTRAI_CHECK(device == Device::kCuda, "only a CUDA backend can be registered");
  cuda_factory() = factory;
}

const Ops& ops_for(Device device) {
  if (device == Device::kCpu) return cpu_ops();
  if (cuda_factory() == nullptr) {
    const std::string why = load_cuda_module();
    if (cuda_factory() == nullptr) fail("no CUDA backend: ", why.empty() ? "the module did not register" : why);
  }
  return cuda_factory()();  // an error saying what is missing when there is no usable GPU
}

}  // namespace astrai::backend
