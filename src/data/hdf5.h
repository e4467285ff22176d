// The reference project's HDF5 dataset layout, as an import (and export) path.
//
// Reference layout (its save_h5/load_h5): one HDF5 file holds, for each data key, a group
// named after the key ("sequence", "loss_mask", "chosen", ...) containing a list of 1-D
// datasets "data_0", "data_1", ... (usually gzip-compressed; integer, float or bool
// elements), and an attribute num_tensors. A dataset directory may hold several such files;
// load_h5 concatenates the lists key by key.
//
// Import maps each key to a shard key and each 1-D dataset to one record of it, files in
// sorted path order, datasets in natural name order (data_2 before data_10). Element types:
//   float                          -> F32
//   integer or bool, key *mask(s)  -> U8 (values must be 0..255)
//   integer, token key             -> I32, marked token ids (checked against the vocabulary)
//   other integers                 -> I32
// Token keys: sequence, chosen, rejected, prompt(s), response(s), input_ids, tokens.
// Known aligned pairs (sequence/loss_mask/position_ids, chosen/chosen_mask,
// rejected/rejected_mask) become groups, so mismatched lengths fail the import.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "base/json.h"
#include "data/shard.h"

namespace astrai::data {

struct Hdf5ImportOptions {
  bool overwrite = false;
  // Extra keys to treat as token ids (besides the built-in names).
  std::vector<std::string> token_keys;
  // Called after each file with (files done, files total); may be empty.
  std::function<void(size_t, size_t)> progress;
};

// Imports the files (directories are searched recursively for *.h5 / *.hdf5) into a new
// dataset directory. Returns the meta.json written. Errors name the file and object.
Json import_hdf5(const std::vector<std::string>& inputs, const std::string& out_dir,
                 const Hdf5ImportOptions& options = {});

// Writes a dataset in the reference layout (one group per key, one gzip-compressed 1-D
// dataset per record, native element types), atomically.
void export_hdf5(const Shards& shards, const std::string& path);

}  // namespace astrai::data
