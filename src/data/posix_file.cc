#include "data/posix_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace distca::data {
namespace {

Status Errno(const std::string& what, const std::string& path) {
  return Status::IoError(fmt::format("{} '{}': {}", what, path, std::strerror(errno)));
}

}  // namespace

ScopedFd& ScopedFd::operator=(ScopedFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) ::close(fd_);
}

int ScopedFd::release() { return std::exchange(fd_, -1); }

Status OpenForReading(const std::string& path, ScopedFd* fd, int64_t* size) {
  // O_NONBLOCK makes opening a FIFO return at once (it has no effect on
  // reads of a regular file).
  ScopedFd opened(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (opened.get() < 0) return Errno("cannot open", path);
  struct stat st {};
  if (::fstat(opened.get(), &st) != 0) return Errno("cannot stat", path);
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(fmt::format("'{}' is not a regular file", path));
  if (size != nullptr) *size = st.st_size;
  *fd = std::move(opened);
  return Status::Ok();
}

Status PReadFully(int fd, const std::string& path, int64_t offset, size_t size, void* out) {
  auto* dst = static_cast<char*>(out);
  while (size > 0) {
    const ssize_t n = ::pread(fd, dst, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot read", path);
    }
    if (n == 0)
      return Status::IoError(
          fmt::format("'{}' ended at byte {} while {} more bytes were expected (did it change?)", path, offset, size));
    dst += n;
    offset += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() { Reset(); }

void MappedFile::Reset() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
  data_ = nullptr;
  size_ = 0;
}

Status MappedFile::Open(const std::string& path, MappedFile* out) {
  ScopedFd fd;
  int64_t size = 0;
  DISTCA_RETURN_IF_ERROR(OpenForReading(path, &fd, &size));
  MappedFile mapped;
  if (size > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) return Errno("cannot mmap", path);
    mapped.data_ = static_cast<const uint8_t*>(p);
    mapped.size_ = size;
  }
  *out = std::move(mapped);
  return Status::Ok();  // the mapping outlives the descriptor
}

}  // namespace distca::data
