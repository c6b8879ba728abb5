// text:DIR — every regular file under a directory is one document of byte
// tokens (docs/data_formats.md). Only paths and sizes are kept; bytes are
// read on demand with pread.
#include <fmt/format.h>
#include <fnmatch.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "data/posix_file.h"
#include "distca/dataset.h"

namespace distca {
namespace {

namespace fs = std::filesystem;

struct TextFile {
  std::string relative;  // '/'-separated, relative to the directory
  std::string path;      // as opened
  int64_t size = 0;      // bytes = tokens
};

class TextDirectorySource final : public DocumentSource {
 public:
  TextDirectorySource(std::string dir, std::string glob, std::vector<TextFile> files)
      : dir_(std::move(dir)), glob_(std::move(glob)), files_(std::move(files)) {
    for (const TextFile& f : files_) total_tokens_ += f.size;
  }

  int64_t num_documents() const override { return static_cast<int64_t>(files_.size()); }
  int64_t DocumentLength(int64_t index) const override { return files_[static_cast<size_t>(index)].size; }

  Status ReadTokens(int64_t index, int64_t begin, int64_t end, std::vector<int32_t>* tokens) const override {
    if (index < 0 || index >= num_documents())
      return Status::InvalidArgument(fmt::format("document {} out of range [0, {})", index, num_documents()));
    const TextFile& f = files_[static_cast<size_t>(index)];
    if (begin < 0 || begin > end || end > f.size)
      return Status::InvalidArgument(
          fmt::format("token range [{}, {}) out of range for '{}' ({} bytes)", begin, end, f.path, f.size));
    if (begin == end) return Status::Ok();
    data::ScopedFd fd;
    DISTCA_RETURN_IF_ERROR(data::OpenForReading(f.path, &fd));
    std::vector<unsigned char> bytes(static_cast<size_t>(end - begin));
    DISTCA_RETURN_IF_ERROR(data::PReadFully(fd.get(), f.path, begin, bytes.size(), bytes.data()));
    tokens->insert(tokens->end(), bytes.begin(), bytes.end());  // 0..255
    return Status::Ok();
  }

  int vocab_size() const override { return 256; }

  std::string Describe() const override {
    return fmt::format("text:{}{} ({} files, {} byte tokens)", dir_, glob_.empty() ? "" : " glob '" + glob_ + "'",
                       files_.size(), total_tokens_);
  }

 private:
  std::string dir_, glob_;
  std::vector<TextFile> files_;
  int64_t total_tokens_ = 0;
};

Status WalkError(const std::string& what, const std::string& path, const std::error_code& ec) {
  return Status::IoError(fmt::format("{} '{}': {}", what, path, ec.message()));
}

}  // namespace

// Walks DIR without following directory symlinks (no cycles, nothing outside
// DIR reached through a linked directory); a symlink to a regular file counts
// as that file. An unreadable file or subdirectory fails the open rather than
// silently shrinking the corpus.
Status OpenTextDirectory(const std::string& dir, const std::string& glob, std::unique_ptr<DocumentSource>* out) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (ec || !fs::exists(st)) {
    if (ec && ec != std::errc::no_such_file_or_directory) return WalkError("cannot access text directory", dir, ec);
    return Status::InvalidArgument(fmt::format("text directory '{}' does not exist", dir));
  }
  if (!fs::is_directory(st)) return Status::InvalidArgument(fmt::format("'{}' is not a directory", dir));

  std::vector<TextFile> files;
  fs::recursive_directory_iterator it(dir, fs::directory_options::none, ec);
  if (ec) return WalkError("cannot list", dir, ec);
  for (const fs::recursive_directory_iterator end; it != end;) {
    const fs::directory_entry& entry = *it;
    const std::string path = entry.path().string();
    // status() follows symlinks: a link to a regular file counts as that file;
    // a dangling link, or one in a loop of links, is skipped; directory links
    // are never descended into.
    const fs::file_status file = entry.status(ec);
    if (ec && file.type() != fs::file_type::not_found && ec != std::errc::too_many_symbolic_link_levels)
      return WalkError("cannot stat", path, ec);
    if (fs::is_regular_file(file)) {
      std::string relative = entry.path().lexically_relative(dir).generic_string();
      // FNM_PATHNAME is off: '*' also matches '/', so "*.h" matches "a/b/c.h".
      if (glob.empty() || ::fnmatch(glob.c_str(), relative.c_str(), 0) == 0) {
        const uintmax_t size = entry.file_size(ec);
        if (ec) return WalkError("cannot stat", path, ec);
        if (size > 0) {          // empty documents carry no tokens
          data::ScopedFd probe;  // an unreadable file fails now, not in the middle of training
          DISTCA_RETURN_IF_ERROR(data::OpenForReading(path, &probe));
          files.push_back({std::move(relative), path, static_cast<int64_t>(size)});
        }
      }
    }
    it.increment(ec);
    if (ec) return WalkError("cannot list", path, ec);
  }
  if (files.empty())
    return Status::InvalidArgument(
        fmt::format("'{}' holds no non-empty regular file{}", dir, glob.empty() ? "" : " matching '" + glob + "'"));
  std::sort(files.begin(), files.end(), [](const TextFile& a, const TextFile& b) { return a.relative < b.relative; });
  *out = std::make_unique<TextDirectorySource>(dir, glob, std::move(files));
  return Status::Ok();
}

}  // namespace distca
