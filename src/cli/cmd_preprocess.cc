// `astrai preprocess`: text / JSONL records into token shards, or an HDF5 import.
//   astrai preprocess --tokenizer DIR --input a.jsonl b.jsonl --output data/ --format jsonl
//                     [--seq-len 1024 --packing simple|bfd|none --add-eos --overwrite]
//   astrai preprocess --tokenizer DIR --input corpus/*.txt --output data/ --format text
//                     [--text-split file|line|blank]
//   astrai preprocess --input old.h5 --output data/ --format hdf5       (reference layout)
// See data/preprocess.h for the record kinds and how assistant spans are found.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/json.h"
#include "base/parallel.h"
#include "base/timer.h"
#include "cli/command.h"
#include "data/hdf5.h"
#include "data/preprocess.h"

namespace astrai::cli {

namespace {

struct PreprocessFlags {
  std::string tokenizer;
  std::vector<std::string> inputs;
  std::string output;
  std::string format = "jsonl";
  std::string text_split = "file";
  int64_t seq_len = 0;
  std::string packing;
  bool add_eos = false;
  bool no_special = false;
  bool no_chat_template = false;
  bool overwrite = false;
  bool quiet = false;
  int threads = 0;
};

void print_summary(const Json& meta, const std::string& out, double seconds) {
  const Json& stats = meta.value("stats", Json::object());
  std::fprintf(stderr, "wrote %s (%s)", out.c_str(), meta.value("kind", std::string("?")).c_str());
  if (!stats.empty()) {
    std::fprintf(stderr, ": %lld records, %lld documents, %lld tokens (%lld trained)",
                 static_cast<long long>(stats.value("records", int64_t{0})),
                 static_cast<long long>(stats.value("documents", int64_t{0})),
                 static_cast<long long>(stats.value("tokens", int64_t{0})),
                 static_cast<long long>(stats.value("loss_tokens", int64_t{0})));
  }
  if (auto p = meta.find("packing"); p != meta.end() && p->contains("seq_len")) {
    const auto rows = p->value("rows", int64_t{0});
    const auto row_len = p->value("row_len", int64_t{1});
    const auto pad = p->value("padding", int64_t{0});
    std::fprintf(stderr, "; %s packing: %lld rows of %lld, %.2f%% padding", p->value("mode", std::string()).c_str(),
                 static_cast<long long>(rows), static_cast<long long>(row_len),
                 rows ? 100.0 * static_cast<double>(pad) / static_cast<double>(rows * row_len) : 0.0);
  }
  std::fprintf(stderr, " in %.1fs\n", seconds);
}

void run(const PreprocessFlags& f) {
  if (f.threads > 0) set_num_threads(f.threads);
  Timer timer;
  if (f.format == "hdf5") {
    ASTRAI_CHECK(f.seq_len == 0 && f.packing.empty(), "preprocess: --seq-len/--packing do not apply to --format hdf5");
    data::Hdf5ImportOptions o;
    o.overwrite = f.overwrite;
    if (!f.quiet) {
      o.progress = [](size_t done, size_t total) { std::fprintf(stderr, "\rimported %zu/%zu files", done, total); };
    }
    const Json meta = data::import_hdf5(f.inputs, f.output, o);
    if (!f.quiet) std::fprintf(stderr, "\n");
    print_summary(meta, f.output, timer.seconds());
    return;
  }
  ASTRAI_CHECK(!f.tokenizer.empty(), "preprocess: --tokenizer is required for --format ", f.format);
  data::PreprocessOptions o;
  o.tokenizer = f.tokenizer;
  o.inputs = f.inputs;
  o.output = f.output;
  o.format = f.format;
  o.text_split = f.text_split;
  o.seq_len = f.seq_len;
  ASTRAI_CHECK(f.packing.empty() || f.packing == "none" || f.seq_len > 0,
               "preprocess: --packing ", f.packing, " needs --seq-len");
  o.packing = f.packing.empty() ? data::Packing::kSimple : data::parse_packing(f.packing);
  if (o.packing == data::Packing::kNone) o.seq_len = 0;
  o.add_eos = f.add_eos;
  o.add_special_tokens = !f.no_special;
  o.chat_template = !f.no_chat_template;
  o.overwrite = f.overwrite;
  if (!f.quiet) {
    auto last = std::make_shared<Timer>();
    auto started = std::make_shared<Timer>();
    o.progress = [last, started](int64_t records, int64_t tokens, int64_t read, int64_t total) {
      if (last->seconds() < 0.5 && read < total) return;
      last->reset();
      const double s = std::max(started->seconds(), 1e-9);
      const double pct = total > 0 ? 100.0 * static_cast<double>(read) / static_cast<double>(total) : 100.0;
      const double eta = read > 0 ? s * static_cast<double>(total - read) / static_cast<double>(read) : 0.0;
      std::fprintf(stderr, "\r%5.1f%%  %lld records  %lld tokens  %.0f tok/s  %.1f/%.1f MB  ETA %.0fs   ", pct,
                   static_cast<long long>(records), static_cast<long long>(tokens), static_cast<double>(tokens) / s,
                   static_cast<double>(read) / 1e6, static_cast<double>(total) / 1e6, eta);
      std::fflush(stderr);
    };
  }
  const Json meta = data::preprocess(o);
  if (!f.quiet) std::fprintf(stderr, "\n");
  print_summary(meta, f.output, timer.seconds());
}

void setup(CLI::App& app) {
  auto flags = std::make_shared<PreprocessFlags>();
  CLI::App* cmd = app.add_subcommand("preprocess", "Tokenize text/JSONL into packed token shards (or import HDF5)");
  cmd->add_option("--tokenizer", flags->tokenizer, "Tokenizer directory (tokenizer.json, tokenizer_config.json)");
  cmd->add_option("--input", flags->inputs, "Input files (JSONL or text; .h5 files or directories for hdf5)")
      ->required()
      ->expected(1, -1);
  cmd->add_option("--output", flags->output, "Output dataset directory")->required();
  cmd->add_option("--format", flags->format, "Input format")->check(CLI::IsMember({"jsonl", "text", "hdf5"}));
  cmd->add_option("--text-split", flags->text_split, "Text documents: whole file, each line, or blank-line paragraphs")
      ->check(CLI::IsMember({"file", "line", "blank"}));
  cmd->add_option("--seq-len", flags->seq_len, "Pack rows of seq_len + 1 tokens (0: one record per document)");
  cmd->add_option("--packing", flags->packing, "Packing with --seq-len: simple (default), bfd or none")
      ->check(CLI::IsMember({"simple", "bfd", "none"}));
  cmd->add_flag("--add-eos", flags->add_eos, "Append EOS to each text document / plain instruction response");
  cmd->add_flag("--no-special", flags->no_special, "Do not add the post-processor's special tokens (BOS) to text");
  cmd->add_flag("--no-chat-template", flags->no_chat_template,
                "Instruction/preference pairs as plain prompt + response text even if a chat template exists");
  cmd->add_flag("--overwrite", flags->overwrite, "Replace an existing dataset at --output");
  cmd->add_flag("--quiet", flags->quiet, "No progress output");
  cmd->add_option("--threads", flags->threads, "Tokenizer threads (default: all cores)");
  cmd->callback([flags] { run(*flags); });
}

const bool kRegistered = register_command(&setup);

}  // namespace

}  // namespace astrai::cli
