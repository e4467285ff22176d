#include "train/communicator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

namespace astrai::train {
namespace {

TEST(Communicator, RankOrderedSumAddsRankAfterRank) {
  // Rank r's values are gathered[r * n .. r * n + n). Element 0 depends on the order: in rank
  // order (1e8 - 1e8) + 1 = 1, while 1e8 + (-1e8 + 1) rounds to 0 in float.
  const size_t n = 3;
  const std::vector<float> gathered{1e8f, 1.0f, 2.0f,    // rank 0
                                    -1e8f, 2.0f, 3.0f,   // rank 1
                                    1.0f, 3.0f, -5.0f};  // rank 2
  std::vector<float> out(n, -7.0f);
  sum_in_rank_order(gathered.data(), 3, n, out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 6.0f);
  EXPECT_EQ(out[2], 0.0f);
  // One rank: a copy.
  std::vector<double> one{0.1, -2.5}, copy(2);
  sum_in_rank_order(one.data(), 1, 2, copy.data());
  EXPECT_EQ(copy, one);
}

TEST(Communicator, LaunchedWorldSizeFromTheLauncher) {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}) ::unsetenv(name);
  EXPECT_EQ(launched_world_size(), 1);
  auto comm = make_communicator({});  // a plain process: no MPI
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->rank(), 0);
  ::setenv("PMI_SIZE", "3", 1);
  EXPECT_EQ(launched_world_size(), 3);
  ::setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  EXPECT_EQ(launched_world_size(), 4);
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  ::unsetenv("PMI_SIZE");
}

}  // namespace
}  // namespace astrai::train
