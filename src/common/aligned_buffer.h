// AlignedBuffer: an owning, zero-initialized, 64-byte aligned array of T.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

namespace distca {

template <class T>
class AlignedBuffer {
 public:
  static constexpr std::size_t kAlignment = 64;  // one cache line, one zmm register

  AlignedBuffer() = default;
  explicit AlignedBuffer(std::size_t count) { Resize(count); }

  // Discards the contents; the new elements are zero. Throws std::bad_alloc.
  void Resize(std::size_t count) {
    data_.reset();
    size_ = 0;
    if (count == 0) return;
    std::size_t bytes = (count * sizeof(T) + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, bytes);
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    data_.reset(static_cast<T*>(p));
    size_ = count;
  }

  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  std::size_t size() const { return size_; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T[], Free> data_;
  std::size_t size_ = 0;
};

}  // namespace distca
