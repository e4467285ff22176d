// Minimal safetensors reading and writing for the trainer (weights, gradients, optimizer
// moments). Writes are atomic (temporary file + rename).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "base/json.h"
#include "tensor/tensor.h"

namespace astrai::train {

struct NamedBlob {
  std::string name;
  Shape shape;
  const float* data = nullptr;  // f32, numel(shape) values
};

// Writes an F32 safetensors file with the given optional __metadata__ (string values).
void write_safetensors_f32(const std::string& path, const std::vector<NamedBlob>& tensors,
                           const std::map<std::string, std::string>& metadata = {});

// Maps a safetensors file; tensors borrow the mapping. Throws astrai::Error on malformed files.
std::map<std::string, Tensor> read_safetensors(const std::string& path);

// Reads every *.safetensors file of a directory (sharded HF checkpoints).
std::map<std::string, Tensor> read_safetensors_dir(const std::string& dir);

}  // namespace astrai::train
