// A training-state tensor in the backend's memory with its host view. On a host-resident backend
// the view is the storage itself; on a device, a host mirror that is downloaded when the device
// copy is newer and uploaded before the next pass when the host wrote it. A span handed out stays
// valid until the next step, evaluation or restore.
// Not for: workspaces (the arena) or anything inside a step.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "etude/core/types.hpp"

namespace etude::detail {

template <class Exec, class T>
class mirrored {
 public:
  void allocate(Exec&, index_t n) {
    dev_ = typename Exec::template buffer<T>(n);
    if constexpr (!Exec::host_resident) host_.assign(static_cast<std::size_t>(n), T{});
    state_ = in_sync;  // both zero
  }
  index_t size() const { return dev_.size(); }
  T* device() { return dev_.data(); }
  const T* device() const { return dev_.data(); }
  index_t bytes() const { return static_cast<index_t>(dev_.size()) * static_cast<index_t>(sizeof(T)); }

  // The device copy was written (by a step, an op, a restore).
  void device_changed() {
    if constexpr (!Exec::host_resident) state_ = device_newer;
  }
  std::span<const T> host(Exec& e) const {
    if constexpr (Exec::host_resident) {
      return {dev_.data(), static_cast<std::size_t>(dev_.size())};
    } else {
      if (state_ == device_newer) {
        e.download(host_.data(), dev_.data(), dev_.size());
        state_ = in_sync;
      }
      return {host_.data(), host_.size()};
    }
  }
  // A writable host view; what is written reaches the device before the next pass.
  std::span<T> host_mutable(Exec& e) {
    ++host_writes_;
    if constexpr (Exec::host_resident) {
      return {dev_.data(), static_cast<std::size_t>(dev_.size())};
    } else {
      host(e);
      state_ = host_newer;
      return {host_.data(), host_.size()};
    }
  }
  // How many writable host views were handed out: what the trainer knows of the values from its
  // own writes holds while this count stands.
  std::uint64_t host_writes() const { return host_writes_; }
  void sync_to_device(Exec& e) {
    if constexpr (!Exec::host_resident) {
      if (state_ != host_newer) return;
      e.upload(dev_.data(), host_.data(), dev_.size());
      state_ = in_sync;
    }
  }

 private:
  enum sync_state { in_sync, device_newer, host_newer };
  typename Exec::template buffer<T> dev_;
  mutable std::vector<T> host_;  // device backends only
  mutable sync_state state_ = in_sync;
  std::uint64_t host_writes_ = 0;
};

}  // namespace etude::detail
