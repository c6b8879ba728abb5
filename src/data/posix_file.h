// POSIX file access for the data layer: descriptors that close themselves,
// positional reads and read-only memory maps. Every system call is checked;
// errors name the path and carry strerror(errno).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "distca/status.h"

namespace distca::data {

// An open file descriptor, closed on destruction. Move-only.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& other) noexcept : fd_(other.release()) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd();

  int get() const { return fd_; }
  int release();

 private:
  int fd_ = -1;
};

// Opens a regular file read-only; anything else (a FIFO, a device, a
// directory) is refused without blocking: a FIFO with no writer would block
// a plain open forever. `size`, when given, receives the file's size.
Status OpenForReading(const std::string& path, ScopedFd* fd, int64_t* size = nullptr);

// Reads exactly `size` bytes at `offset`; a short read (the file shrank) is an IoError.
Status PReadFully(int fd, const std::string& path, int64_t offset, size_t size, void* out);

// A whole file mapped read-only (PROT_READ, MAP_SHARED). An empty file maps
// to {nullptr, 0}. Move-only; unmapped on destruction.
class MappedFile {
 public:
  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  static Status Open(const std::string& path, MappedFile* out);

  const uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  void Reset();
  const uint8_t* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace distca::data
