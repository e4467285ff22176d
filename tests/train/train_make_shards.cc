// Writes a small synthetic token dataset for the train CLI tests:
//   train_make_shards DIR NUM_DOCS VOCAB [MAX_ID]
// Documents follow a learnable rule (each token is a fixed function of the previous one,
// with occasional resets), packed as records of `sequence` with per-document position_ids.
// MAX_ID, when given, is written as one token (to test the out-of-vocabulary check).
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "data/shard.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s DIR NUM_DOCS VOCAB [MAX_ID]\n", argv[0]);
    return 2;
  }
  try {
    const int docs = std::atoi(argv[2]);
    const int vocab = std::atoi(argv[3]);
    astrai::data::ShardWriter w(argv[1], true);
    w.add_key("sequence", astrai::DType::kI32, true);
    w.add_key("position_ids", astrai::DType::kI32);
    w.add_group({"sequence", "position_ids"});
    uint64_t state = 12345;
    auto next = [&]() {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      return static_cast<uint32_t>(state >> 33);
    };
    for (int d = 0; d < docs; ++d) {
      const int len = 20 + static_cast<int>(next() % 60);
      std::vector<int32_t> seq, pos;
      int32_t tok = static_cast<int32_t>(next() % vocab);
      for (int i = 0; i < len; ++i) {
        seq.push_back(tok);
        pos.push_back(i);
        tok = (next() % 8 == 0) ? static_cast<int32_t>(next() % vocab) : (tok * 7 + 3) % vocab;
      }
      if (argc > 4 && d == docs / 2) seq[len / 2] = std::atoi(argv[4]);
      w.add_record("sequence", seq);
      w.add_record("position_ids", pos);
    }
    w.finish();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
