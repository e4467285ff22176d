// Helpers shared by the data tests (tests/scratch_dir.h's, in this layer's test namespace).
#pragma once

#include "../scratch_dir.h"

namespace astrai::data::testing {

struct ScratchDir : testing_util::ScratchDir {
  ScratchDir() : testing_util::ScratchDir("astrai_data") {}
};
using testing_util::error_of;

}  // namespace astrai::data::testing
