// Whole-file reads and writes with Status errors.
#pragma once

#include <string>
#include <string_view>

#include "distca/status.h"

namespace distca {

Status ReadTextFile(const std::string& path, std::string* contents);
Status WriteTextFile(const std::string& path, std::string_view contents);

// Writes `contents` to path + ".tmp", fsyncs it, renames it over `path` and
// fsyncs the directory: readers see the old file or the whole new one.
Status WriteFileAtomic(const std::string& path, std::string_view contents);
// fsync on a directory, so that renames inside it are durable.
Status SyncDirectory(const std::string& dir);

}  // namespace distca
