// distca-make-indexed: convert a directory of text files (one document per
// file, byte tokens) into a Megatron-LM indexed dataset PREFIX.bin/PREFIX.idx
// (docs/data_formats.md). Holds the corpus in memory (4 bytes per token).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/cli_checks.h"
#include "common/file_util.h"
#include "common/memory_info.h"
#include "distca/dataset.h"

namespace {

int Fail(const std::string& message) { return distca::cli::Fail("distca-make-indexed", message); }

}  // namespace

int Run(int argc, char** argv) {
  CLI::App app{"distca-make-indexed: convert a text directory (byte tokens) into a Megatron indexed dataset"};
  std::string input, glob, output;
  app.add_option("--input", input, "directory whose regular files are the documents (recursively)")
      ->required()
      ->check(distca::cli::kPath);
  app.add_option("--glob", glob, "only files whose path relative to --input matches (fnmatch; '*' crosses '/')");
  app.add_option("--output", output, "writes OUTPUT.bin and OUTPUT.idx")->required()->check(distca::cli::kPath);
  if (int rc = 0; !distca::cli::Parse(app, argc, argv, &rc)) return rc;
  // OUTPUT is a prefix: it needs a file name, and its files must not land
  // among the documents they are made from (a second run would read them).
  const std::filesystem::path prefix(output);
  if (output.empty() || !prefix.has_filename() || prefix.filename() == "." || prefix.filename() == "..")
    return Fail(fmt::format("--output '{}' names no file: give a prefix such as DIR/corpus", output));
  if (distca::IsSameOrInside(std::filesystem::absolute(prefix).parent_path().string(), input))
    return Fail(fmt::format("--output '{}' is inside --input '{}': its files would become documents", output, input));
  // "--output corpus.bin" would write corpus.bin.bin and corpus.bin.idx.
  if (const std::string ext = prefix.extension().string(); ext == ".bin" || ext == ".idx")
    return Fail(fmt::format("--output '{}' is a prefix: {}.bin and {}.idx are written; drop '{}'", output, output,
                            output, ext));
  if (app.count("--glob") > 0 && glob.empty())
    return Fail("--glob: the pattern is empty (leave it out for every file)");

  std::unique_ptr<distca::DocumentSource> source;
  distca::Status s = distca::OpenTextDirectory(input, glob, &source);
  if (!s.ok()) return Fail(s.message());
  // The documents are held in memory as 4-byte ids before they are written:
  // check the sizes first, so that a file too large for a sequence, or a
  // corpus too large for this machine, is named instead of failing to
  // allocate.
  int64_t total = 0;
  for (int64_t d = 0; d < source->num_documents(); ++d) {
    const int64_t length = source->DocumentLength(d);
    if (length > std::numeric_limits<int32_t>::max())
      return Fail(fmt::format("document {} of {} holds {} tokens; an indexed sequence holds at most 2^31 - 1", d,
                              source->Describe(), length));
    total += length;
  }
  // Ids in memory, and the .bin (2 bytes a token) the writer builds.
  const double need = 6.0 * double(total), ram = distca::PhysicalMemoryBytes();
  if (ram > 0 && need > ram)
    return Fail(
        fmt::format("{} holds {} tokens, which need about {:.1f} GB in memory to convert; this machine has "
                    "{:.1f} GB (split the directory with --glob)",
                    source->Describe(), total, need * 1e-9, ram * 1e-9));
  std::vector<std::vector<int32_t>> docs(static_cast<size_t>(source->num_documents()));
  int64_t tokens = 0;
  for (int64_t d = 0; d < source->num_documents(); ++d) {
    s = source->ReadTokens(d, 0, source->DocumentLength(d), &docs[static_cast<size_t>(d)]);
    if (!s.ok()) return Fail(s.message());
    tokens += source->DocumentLength(d);
  }
  s = distca::WriteIndexedDataset(output, docs);
  if (!s.ok()) return Fail(s.message());
  fmt::print("wrote {}.bin and {}.idx: {} documents, {} tokens (uint16) from {}\n", output, output, docs.size(), tokens,
             source->Describe());
  return 0;
}

int main(int argc, char** argv) { return distca::cli::GuardedMain(argc, argv, Run, Fail); }
