// Whole-file reads and writes with Status errors.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "distca/status.h"

namespace distca {

// Reads a whole file. A regular file is read to its end; anything else (a
// pipe, a device) up to stream_limit bytes, past which it is refused:
// /dev/zero would otherwise fill memory.
inline constexpr size_t kMaxStreamReadBytes = size_t{1} << 30;
Status ReadTextFile(const std::string& path, std::string* contents, size_t stream_limit = kMaxStreamReadBytes);
// ReadTextFile for a file of at most max_bytes: a larger regular file is
// refused before it is read ("PATH: N bytes, more than the MAX bytes WHAT
// can take"), a stream once it passes max_bytes. Both refuse a stream at
// its first NUL byte, which no text holds.
Status ReadTextFileAtMost(const std::string& path, std::string* contents, uint64_t max_bytes, std::string_view what);
// ReadTextFileAtMost for binary contents (NUL bytes allowed).
Status ReadBinaryFileAtMost(const std::string& path, std::string* contents, uint64_t max_bytes, std::string_view what);
// Writes a whole file: to a new path + ".tmp-PID-N", renamed over `path`
// once complete (a failed write leaves the old file, and no temporary). A
// device, a pipe or a symbolic link is written as it is, and so is a file
// where no temporary can be created beside it. The file standard output
// goes to is written through stdout, after what it already holds. Not
// fsynced (WriteFileAtomic is).
Status WriteTextFile(const std::string& path, std::string_view contents);

// Writes `contents` to path + ".tmp", fsyncs it, renames it over `path` and
// fsyncs the directory: readers see the old file or the whole new one.
Status WriteFileAtomic(const std::string& path, std::string_view contents);
// Where WriteFileAtomic stages `path`: path + ".tmp" (its writers own the
// directory: checkpoints, a grid's results).
std::string StagingPathOf(const std::string& path);
// For writers that replace several files at once: writes and fsyncs
// `contents` to a new file beside `path`, path + ".tmp-PID-N", created
// exclusively (a file, link or FIFO already at a fixed staging name was
// written through, replaced or waited on); its name in *staged. On failure
// nothing is left.
Status WriteStagedSynced(const std::string& path, std::string_view contents, std::string* staged);
// The directory holding `path` ("." for a bare name).
std::string DirectoryOf(const std::string& path);
// Whether a file can be written at `path` (an existing file that is not a
// directory, or a new one in a writable directory): checked before a long run
// whose output goes there.
Status CheckOutputPath(const std::string& path);
// Whether a directory can be created (or written into) at `dir`: `dir`, or
// the nearest of its parents that exists, is a directory in which one can be
// created (tried: permission bits alone mislead as root, or on read-only or
// virtual file systems). Creates nothing that stays. `what` names the
// directory in messages ("checkpoint directory").
Status CheckOutputDirectory(const std::string& dir, std::string_view what);
// Whether two paths name one file: the same file where both exist, else
// the same canonical path.
bool SameFile(const std::string& a, const std::string& b);
// Whether `path` is the directory `dir` or lies under it (canonical paths;
// false when either cannot be resolved).
bool IsSameOrInside(const std::string& path, const std::string& dir);
// fsync on a directory, so that renames inside it are durable.
Status SyncDirectory(const std::string& dir);

}  // namespace distca
