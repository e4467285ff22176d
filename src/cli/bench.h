// `astrai bench <what>`: each benchmark registers itself as a sub-subcommand, e.g.
//   namespace { const bool kReg = astrai::cli::register_bench(&setup_bench_serve); }
// where setup_bench_serve(CLI::App& bench) adds `bench->add_subcommand("serve", ...)`.
#pragma once

#include <CLI/CLI.hpp>
#include <vector>

namespace astrai::cli {

using BenchSetup = void (*)(CLI::App& bench);
bool register_bench(BenchSetup setup);
const std::vector<BenchSetup>& registered_benches();

}  // namespace astrai::cli
