// Whether a memory plan fits a device, at compile time and at run time:
//
//   constexpr etude::memory_plan plan = etude::plan_memory<cfg, etude::backend::device_plan>(4, 1500);
//   static_assert(etude::fits<plan, etude::hw::h100_80gb>);   // fails to compile when it does not fit
//   if constexpr (etude::would_fit<plan, etude::hw::rtx_4090>) ...   // asks, never fails
//   std::cout << etude::fit_report(plan, etude::hw::rtx_4090{});   // fits or not, and by how much
//
// A static_assert message cannot be computed in C++20, so when a plan does not fit, `fits`
// instantiates detail::memory_plan_does_not_fit<OverflowBytes, OverflowMiB, PlanBytes,
// UsableBytes>, whose assertion fails: the compiler prints the numbers as its template
// arguments ("[with long int OverflowBytes = 1234; ...]") next to the advice in the message.
// Also: the largest microbatch that fits (a search over plans) and the accumulation steps that
// make up a global batch, for planners such as examples/will_it_fit.cpp.
// Not for: the plan itself (train/memory_plan.hpp) or the devices (config/hardware.hpp).
#pragma once

#include <cstdio>
#include <string>

#include "etude/config/hardware.hpp"
#include "etude/core/types.hpp"
#include "etude/train/memory_plan.hpp"

namespace etude {

// Bytes by which `plan` exceeds `usable` (0 when it fits), and bytes it leaves (0 when it does not).
constexpr index_t overflow_bytes(const memory_plan& plan, index_t usable) {
  return plan.total() > usable ? plan.total() - usable : 0;
}
constexpr index_t headroom_bytes(const memory_plan& plan, index_t usable) {
  return plan.total() <= usable ? usable - plan.total() : 0;
}
constexpr bool fits_in(const memory_plan& plan, index_t usable) { return plan.total() <= usable; }

// Asks without failing: true when the plan's total is at most the device's usable bytes.
template <memory_plan Plan, hw::descriptor Hw>
inline constexpr bool would_fit = fits_in(Plan, Hw::usable);

namespace detail {
constexpr index_t ceil_mib(index_t bytes) { return (bytes + hw::mib - 1) / hw::mib; }

// Instantiated by `fits` with the plan's numbers; its assertion fails when OverflowBytes > 0.
template <index_t OverflowBytes, index_t OverflowMiB, index_t PlanBytes, index_t UsableBytes>
struct memory_plan_does_not_fit {
  static constexpr bool check() {
    static_assert(OverflowBytes == 0,
                  "etude::fits: the memory plan does not fit the device. OverflowBytes (OverflowMiB, rounded up) "
                  "in the instantiation shown is the excess, PlanBytes the plan's total, UsableBytes the device's "
                  "memory less its runtime reserve. To fit: a smaller microbatch with more accumulation "
                  "(accumulate<N>, the same global batch), activation checkpointing (checkpointing::selective, "
                  "selective_ffn or every_layer), bf16 (precision::bf16), or a larger device");
    return true;
  }
};
}  // namespace detail

// `static_assert(etude::fits<plan, hw::h100_80gb>)`: true when the plan fits, a compile error
// with the overflow in bytes and what to change when it does not.
template <memory_plan Plan, hw::descriptor Hw>
inline constexpr bool fits =
    detail::memory_plan_does_not_fit<overflow_bytes(Plan, Hw::usable), detail::ceil_mib(overflow_bytes(Plan, Hw::usable)),
                                     Plan.total(), Hw::usable>::check();

// One paragraph: fits or not on `device`, the plan against the usable bytes, the headroom or the
// overflow in bytes and GiB, and what to change when it does not fit.
inline std::string fit_report(const memory_plan& plan, const hw::device_info& device) {
  const auto gib = [](index_t b) { return static_cast<double>(b) / static_cast<double>(hw::gib); };
  const bool ok = fits_in(plan, device.usable);
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "%s %s: plan %lld bytes (%.2f GiB) against %lld usable (%.2f GiB = %.2f GiB reported - %.2f GiB "
                "runtime reserve); %s %lld bytes (%.2f GiB)%s",
                ok ? "fits" : "does not fit", device.name, static_cast<long long>(plan.total()), gib(plan.total()),
                static_cast<long long>(device.usable), gib(device.usable), gib(device.memory),
                gib(device.runtime_reserve), ok ? "headroom" : "overflow",
                static_cast<long long>(ok ? headroom_bytes(plan, device.usable) : overflow_bytes(plan, device.usable)),
                gib(ok ? headroom_bytes(plan, device.usable) : overflow_bytes(plan, device.usable)),
                ok ? ""
                   : ". To fit: a smaller microbatch with more accumulation, activation checkpointing, bf16, or a "
                     "larger device");
  return buf;
}
// Against a descriptor: fit_report(plan, hw::h100_80gb{}).
template <hw::descriptor Hw>
std::string fit_report(const memory_plan& plan, Hw) {
  return fit_report(plan, hw::info_of<Hw>());
}
// Against a number of usable bytes (nothing reserved beyond them).
inline std::string fit_report(const memory_plan& plan, index_t usable_bytes) {
  return fit_report(plan, hw::device_info{"a device", usable_bytes, 0, usable_bytes});
}

// The largest b in [1, limit] with plan_at(b).total() <= usable, or 0 when b = 1 does not fit.
// plan_at must grow with b (every plan_memory does: each component is constant or grows with
// the rows B·S). Doubling, then bisection: about 2·log2(b) plans.
template <class PlanAt>
constexpr index_t largest_fitting(PlanAt&& plan_at, index_t usable, index_t limit = index_t{1} << 24) {
  if (limit < 1 || !fits_in(plan_at(index_t{1}), usable)) return 0;
  index_t lo = 1, hi = 2;  // plan_at(lo) fits; plan_at(hi) does not, once hi <= limit
  while (hi <= limit && fits_in(plan_at(hi), usable)) {
    lo = hi;
    hi = hi > limit / 2 ? limit + 1 : 2 * hi;
  }
  if (hi > limit) {
    if (fits_in(plan_at(limit), usable)) return limit;
    hi = limit;
  }
  while (hi - lo > 1) {
    const index_t mid = lo + (hi - lo) / 2;
    if (fits_in(plan_at(mid), usable)) lo = mid; else hi = mid;
  }
  return lo;
}

// The largest microbatch of `frames`-frame examples whose plan under Config and Backend fits.
template <class Config, class Backend>
constexpr index_t largest_microbatch(index_t frames, index_t usable, plan_options options = {},
                                     index_t limit = index_t{1} << 24) {
  return largest_fitting([&](index_t b) { return plan_memory<Config, Backend>(b, frames, options); }, usable, limit);
}

// Microbatches per optimiser step so that microbatch · steps · world_size reaches global_batch:
// ceil(global_batch / (microbatch · world_size)); 0 when microbatch is 0 (nothing fits).
constexpr index_t accumulation_steps(index_t global_batch, index_t microbatch, int world_size = 1) {
  if (microbatch <= 0 || world_size <= 0) return 0;
  const index_t per_step = microbatch * world_size;
  return global_batch <= 0 ? 1 : (global_batch + per_step - 1) / per_step;
}

}  // namespace etude
