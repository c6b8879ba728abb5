#include "common/file_util.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace distca {

Status ReadTextFile(const std::string& path, std::string* contents) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IoError("cannot open '" + path + "': " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::IoError("error while reading '" + path + "'");
  *contents = ss.str();
  return Status::Ok();
}

Status WriteTextFile(const std::string& path, std::string_view contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::IoError("cannot create '" + path + "': " + std::strerror(errno));
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  out.close();
  if (!out) return Status::IoError("error while writing '" + path + "'");
  return Status::Ok();
}

}  // namespace distca
