#include "common/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>

#include "common/excerpt.h"

namespace distca {

namespace {

// A whole file (see ReadTextFile); `text` refuses a stream at its first NUL
// byte.
Status ReadWholeFile(const std::string& path, std::string* contents, size_t stream_limit, bool text) {
  // POSIX reads, so that every failure is seen (a stream's rdbuf copy swallows
  // read errors: a directory would read as an empty file).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IoError("cannot open '" + path + "': " + std::strerror(errno));
  std::string out;
  // A regular file's size, reserved up front: the string holds the file once,
  // not up to twice as it grows (the size is a hint; the loop reads to EOF).
  struct stat st {};
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (regular && st.st_size > 0) {
    try {
      out.reserve(static_cast<size_t>(st.st_size));
    } catch (const std::exception&) {
      ::close(fd);
      return Status::IoError("cannot hold '" + path + "' in memory: " + std::to_string(st.st_size) + " bytes");
    }
  }
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return Status::IoError("error while reading '" + path + "': " + std::strerror(err));
    }
    // A stream may never end (/dev/zero, /dev/urandom): a NUL byte, which no
    // text holds, refuses it at once rather than after stream_limit bytes.
    if (text && !regular && std::memchr(buf, 0, static_cast<size_t>(n)) != nullptr) {
      ::close(fd);
      return Status::InvalidArgument("'" + path + "' is not a regular file and gives a NUL byte: not a text file");
    }
    out.append(buf, static_cast<size_t>(n));
    if (!regular && out.size() > stream_limit) {
      ::close(fd);
      return Status::OutOfRange("'" + path + "' is not a regular file and gives more than " +
                                std::to_string(stream_limit) + " bytes");
    }
  }
  ::close(fd);
  *contents = std::move(out);
  return Status::Ok();
}

// ReadWholeFile of at most max_bytes.
Status ReadWholeFileAtMost(const std::string& path, std::string* contents, uint64_t max_bytes, std::string_view what,
                           bool text) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) {
    const uintmax_t size = std::filesystem::file_size(path, ec);
    if (!ec && size > max_bytes)
      return Status::InvalidArgument(path + ": " + std::to_string(size) + " bytes, more than the " +
                                     std::to_string(max_bytes) + " bytes " + std::string(what) + " can take");
  }
  return ReadWholeFile(path, contents, static_cast<size_t>(std::min<uint64_t>(max_bytes, kMaxStreamReadBytes)), text);
}

}  // namespace

Status ReadTextFile(const std::string& path, std::string* contents, size_t stream_limit) {
  return ReadWholeFile(path, contents, stream_limit, /*text=*/true);
}

Status ReadTextFileAtMost(const std::string& path, std::string* contents, uint64_t max_bytes, std::string_view what) {
  return ReadWholeFileAtMost(path, contents, max_bytes, what, /*text=*/true);
}

Status ReadBinaryFileAtMost(const std::string& path, std::string* contents, uint64_t max_bytes, std::string_view what) {
  return ReadWholeFileAtMost(path, contents, max_bytes, what, /*text=*/false);
}

namespace {

// `path` made absolute, then weakly canonical (absolute first:
// weakly_canonical leaves a relative path with no existing part relative,
// "t.json" against "$PWD/t.json").
std::filesystem::path AbsoluteCanonical(const std::string& path, std::error_code& ec) {
  const std::filesystem::path absolute = std::filesystem::absolute(path, ec);
  return ec ? absolute : std::filesystem::weakly_canonical(absolute, ec);
}

}  // namespace

bool SameFile(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (std::filesystem::equivalent(a, b, ec) && !ec) return true;
  const std::filesystem::path pa = AbsoluteCanonical(a, ec);
  if (ec) return false;
  const std::filesystem::path pb = AbsoluteCanonical(b, ec);
  return !ec && pa == pb;
}

bool IsSameOrInside(const std::string& path, const std::string& dir) {
  std::error_code ec;
  const std::filesystem::path p = AbsoluteCanonical(path, ec);
  if (ec) return false;
  const std::filesystem::path d = AbsoluteCanonical(dir, ec);
  if (ec) return false;
  // (A path that does not exist keeps a trailing separator as an empty last
  // element.)
  const auto d_end = std::mismatch(d.begin(), d.end(), p.begin(), p.end()).first;
  return d_end == d.end() || (std::next(d_end) == d.end() && d_end->empty());
}

namespace {

// Writes `contents` through an open stream and closes it.
Status WriteOpened(std::ofstream& out, const std::string& path, std::string_view contents) {
  errno = 0;
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  out.close();
  if (!out) {
    const int err = errno;  // the failed write's, where the stream kept it
    return Status::IoError("error while writing '" + path + "'" +
                           (err != 0 ? std::string(": ") + std::strerror(err) : ""));
  }
  return Status::Ok();
}

Status WriteInPlace(const std::string& path, std::string_view contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::IoError("cannot create '" + path + "': " + std::strerror(errno));
  return WriteOpened(out, path, contents);
}

// Writes all of `contents` to fd (named `path` in messages), fsyncs it if
// `sync`, and closes it; on a failure fd is closed and `path` removed.
Status WriteAllAndClose(int fd, const std::string& path, std::string_view contents, bool sync) {
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      std::remove(path.c_str());
      return Status::IoError("error while writing '" + path + "': " + std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  const int sync_rc = sync ? ::fsync(fd) : 0;
  const int sync_err = errno;
  const int close_rc = ::close(fd);
  if (sync_rc != 0 || close_rc != 0) {
    const int err = sync_rc != 0 ? sync_err : errno;
    std::remove(path.c_str());
    return Status::IoError("cannot flush '" + path + "': " + std::strerror(err));
  }
  return Status::Ok();
}

// Writes and fsyncs `path` (removed again on failure): WriteFileAtomic's
// staging file.
Status WriteFileSynced(const std::string& path, std::string_view contents) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IoError("cannot create '" + path + "': " + std::strerror(errno));
  return WriteAllAndClose(fd, path, contents, /*sync=*/true);
}

// Opens a new file path + ".tmp-PID-N" for writing, created exclusively
// (O_EXCL: nothing already there is followed, replaced or waited on, as a
// fixed path + ".tmp" was), mode 0666 under the umask; its name in *tmp.
// -1 with errno set when it cannot.
int CreateStagingFile(const std::string& path, std::string* tmp) {
  static std::atomic<uint64_t> next{0};
  for (int attempt = 0; attempt < 100; ++attempt) {
    *tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(next++);
    const int fd = ::open(tmp->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  return -1;  // errno: EEXIST
}

// Renames a complete temporary over `path`; on failure the temporary goes.
Status RenameOver(const std::string& tmp, const std::string& path) {
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return Status::IoError("cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(err));
  }
  return Status::Ok();
}

}  // namespace

Status WriteTextFile(const std::string& path, std::string_view contents) {
  // The file standard output goes to (`/dev/stdout`, or its name): written
  // through stdout, after what was printed before. Opened again, it would
  // be truncated and written from its start, and stdout's buffer would
  // then land over it.
  struct stat target {
  }, stdout_file{};
  if (::stat(path.c_str(), &target) == 0 && ::fstat(STDOUT_FILENO, &stdout_file) == 0 &&
      target.st_dev == stdout_file.st_dev && target.st_ino == stdout_file.st_ino) {
    if (std::fflush(stdout) != 0 || std::fwrite(contents.data(), 1, contents.size(), stdout) != contents.size() ||
        std::fflush(stdout) != 0)
      return Status::IoError("cannot write '" + path + "' (standard output): " + std::strerror(errno));
    return Status::Ok();
  }
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::symlink_status(path, ec);
  // A device, a pipe or a link (/dev/stdout is one) is written as it is: a
  // rename would replace the link, not what it points to.
  if (!ec && std::filesystem::exists(st) && !std::filesystem::is_regular_file(st)) return WriteInPlace(path, contents);
  // Staged under a name of its own: a fixed path + ".tmp" replaced
  // whatever file of the user's had that name.
  std::string tmp;
  const int fd = CreateStagingFile(path, &tmp);
  if (fd < 0) {
    const int err = errno;
    // No temporary may be made beside it (a directory this user cannot
    // write, holding a file it can): write in place. Any other failure (no
    // space, no inodes, a name too long) would fail there too, after
    // truncating the old file: reported instead.
    if (err == EACCES || err == EPERM) return WriteInPlace(path, contents);
    return Status::IoError("cannot create '" + tmp + "': " + std::strerror(err)).WithContext("writing '" + path + "'");
  }
  DISTCA_RETURN_IF_ERROR(WriteAllAndClose(fd, tmp, contents, /*sync=*/false).WithContext("writing '" + path + "'"));
  return RenameOver(tmp, path);
}

Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return Status::IoError("cannot open directory '" + dir + "': " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return Status::IoError("fsync of directory '" + dir + "' failed: " + std::strerror(err));
  return Status::Ok();
}

Status WriteStagedSynced(const std::string& path, std::string_view contents, std::string* staged) {
  const int fd = CreateStagingFile(path, staged);
  if (fd < 0) return Status::IoError("cannot create '" + *staged + "': " + std::strerror(errno));
  return WriteAllAndClose(fd, *staged, contents, /*sync=*/true);
}

std::string DirectoryOf(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

Status CheckOutputPath(const std::string& path) {
  if (path.empty()) return Status::InvalidArgument("the output path is empty");
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::is_directory(st))
    return Status::IoError("cannot write '" + path + "': it is a directory");
  // An existing file other than a directory (a device such as /dev/null, or
  // a file) is written in place if need be.
  if (!ec && std::filesystem::exists(st)) return Status::Ok();
  const std::string dir = DirectoryOf(path);
  if (!std::filesystem::is_directory(dir, ec))
    return Status::IoError("cannot write '" + path + "': '" + dir + "' is not a directory");
  // A file made there and removed: access(W_OK) says yes to root for /proc
  // and /sys, where no file can be created (found after the run).
  std::string probe = (std::filesystem::path(dir) / ".distca-probe-XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  if (fd < 0)
    return Status::IoError("cannot write '" + path + "': '" + dir + "' is not writable: " + std::strerror(errno));
  ::close(fd);
  if (::unlink(probe.c_str()) != 0)
    return Status::IoError("cannot remove the probe file '" + probe + "': " + std::strerror(errno));
  return Status::Ok();
}

Status CheckOutputDirectory(const std::string& dir, std::string_view what) {
  const std::string name(what);
  if (dir.empty()) return Status::InvalidArgument("the " + name + " is empty");
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(dir, ec);
  if (ec) return Status::IoError(name + " '" + dir + "': " + ec.message());
  while (!std::filesystem::exists(std::filesystem::symlink_status(p, ec)) && p.has_relative_path()) p = p.parent_path();
  const std::string cannot = "cannot create " + name + " '" + dir + "': '" + p.string() + "' ";
  if (!std::filesystem::is_directory(p, ec)) return Status::IoError(cannot + "is not a directory");
  // The names still to be created must fit the file system (a 300-byte
  // name passed the probe below, and the run failed at its first save).
  const long name_max = ::pathconf(p.c_str(), _PC_NAME_MAX);
  const std::filesystem::path whole = std::filesystem::absolute(dir, ec);
  for (auto it = std::next(whole.begin(), std::distance(p.begin(), p.end())); !ec && it != whole.end(); ++it)
    if (name_max > 0 && it->native().size() > static_cast<size_t>(name_max))
      return Status::InvalidArgument("cannot create " + name + " '" + Excerpt(dir) + "': the name '" +
                                     Excerpt(it->native()) + "' is longer than the " + std::to_string(name_max) +
                                     " bytes the file system allows");
  std::string probe = (p / ".distca-probe-XXXXXX").string();
  if (::mkdtemp(probe.data()) == nullptr)
    return Status::IoError("cannot create " + name + " '" + dir + "': cannot write into '" + p.string() +
                           "': " + std::strerror(errno));
  if (::rmdir(probe.c_str()) != 0)
    return Status::IoError("cannot remove the probe directory '" + probe + "': " + std::strerror(errno));
  return Status::Ok();
}

std::string StagingPathOf(const std::string& path) { return path + ".tmp"; }

Status WriteFileAtomic(const std::string& path, std::string_view contents) {
  const std::string tmp = StagingPathOf(path);
  DISTCA_RETURN_IF_ERROR(WriteFileSynced(tmp, contents));
  DISTCA_RETURN_IF_ERROR(RenameOver(tmp, path));
  return SyncDirectory(DirectoryOf(path));
}

}  // namespace distca
