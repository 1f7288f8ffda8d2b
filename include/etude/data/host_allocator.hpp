// Where the loader puts the host copy of a batch that a device will read: an allocator interface
// the CUDA backend implements with pinned (page-locked) memory so host-to-device copies run
// asynchronously, and a default on the ordinary heap. host_block owns one allocation and keeps
// its allocator alive, so a batch may outlive the loader that made it.
// Not for: the trainer's own buffers (core/buffer.hpp), or device memory.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <utility>

namespace etude::data {

class host_allocator {
 public:
  virtual ~host_allocator() = default;
  // `bytes` > 0; `alignment` a power of two. Throws on failure (std::bad_alloc or an etude::error).
  virtual void* allocate(std::size_t bytes, std::size_t alignment) = 0;
  virtual void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept = 0;
};

// The ordinary heap, aligned. Pinned allocators cache their blocks (pinning is slow), since the
// loader asks for one block per batch.
class heap_host_allocator final : public host_allocator {
 public:
  void* allocate(std::size_t bytes, std::size_t alignment) override {
    return ::operator new(bytes, std::align_val_t{alignment});
  }
  void deallocate(void* p, std::size_t, std::size_t alignment) noexcept override {
    ::operator delete(p, std::align_val_t{alignment});
  }
};

class host_block {
 public:
  static constexpr std::size_t alignment = 256;  // enough for any DMA engine and vector width

  host_block() = default;
  host_block(std::shared_ptr<host_allocator> allocator, std::size_t bytes)
      : allocator_(std::move(allocator)), bytes_(bytes) {
    if (bytes_ != 0) data_ = allocator_->allocate(bytes_, alignment);
  }
  host_block(host_block&& o) noexcept
      : allocator_(std::move(o.allocator_)), data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  host_block& operator=(host_block&& o) noexcept {
    if (this != &o) {
      release();
      allocator_ = std::move(o.allocator_);
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  host_block(const host_block&) = delete;
  host_block& operator=(const host_block&) = delete;
  ~host_block() { release(); }

  void* data() const noexcept { return data_; }
  std::size_t bytes() const noexcept { return bytes_; }
  bool empty() const noexcept { return data_ == nullptr; }

 private:
  void release() noexcept {
    if (data_ != nullptr) allocator_->deallocate(data_, bytes_, alignment);
    data_ = nullptr;
    bytes_ = 0;
  }

  std::shared_ptr<host_allocator> allocator_;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace etude::data
