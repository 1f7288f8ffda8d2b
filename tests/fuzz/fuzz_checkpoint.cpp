// libFuzzer harness for etude's checkpoint reading. The first byte picks what the rest is:
//   even: a whole checkpoint file, opened as it is (mutations mostly stop at the digest);
//   odd:  the text of the etude.state metadata; the harness wraps it in a checkpoint of the fuzz
//         model (fuzz_model.hpp) with a correct digest, so the fuzzer reaches the state parsing
//         and restoring behind the checksum, as a hand-edited (or re-hashed) checkpoint would.
// A file must open, with state() and step() readable, or be refused with an etude::error. A file
// that opens is then restored into a trainer of the fuzz model: it must either restore (the
// trainer then holds its step and weights, and its state saves again) or be refused with an
// etude::error before the trainer changed (bit for bit). Anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <etude/io/checkpoint.hpp>

#include "fuzz_input.hpp"
#include "fuzz_model.hpp"

namespace io = etude::io;
using etude::fuzz::trainer_t;

namespace {

trainer_t& the_trainer() {
  static trainer_t t{etude::fuzz::hyper()};
  return t;
}

struct trainer_bits {
  long step;
  std::vector<float> params, m1, m2;
  double scale;
  long good, skipped;
  explicit trainer_bits(const trainer_t& t)
      : step(t.steps_done()),
        params(t.parameters().begin(), t.parameters().end()),
        m1(t.optimizer_state(0).begin(), t.optimizer_state(0).end()),
        m2(t.optimizer_state(1).begin(), t.optimizer_state(1).end()),
        scale(t.loss_scale()),
        good(t.good_steps()),
        skipped(t.skipped_steps()) {}
  bool operator==(const trainer_bits& o) const {
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    return step == o.step && same(params, o.params) && same(m1, o.m1) && same(m2, o.m2) && scale == o.scale &&
           good == o.good && skipped == o.skipped;
  }
  void put_back(trainer_t& t) const {
    t.restore(step, params, m1, m2);
    t.set_loss_scale(scale, good, skipped);
  }
};

// A checkpoint of the fuzz model holding `state`, with the digest write_snapshot stores.
std::string wrap_state(const std::string& state) {
  static const io::checkpoint_snapshot snap = io::take_snapshot(the_trainer(), {});
  io::safetensors_writer w = io::detail::snapshot_tensors(snap);
  w.metadata("etude.state", state);  // refuses text that is not UTF-8 (an etude::invalid_argument)
  const std::string header = w.digested_header(io::detail::checksum_key);
  std::string file(8, '\0');
  const std::uint64_t n = header.size();
  std::memcpy(file.data(), &n, 8);
  return file + header + w.data_region();
}

// Restores an accepted file: all or nothing.
void restore_or_refuse(const io::checkpoint_file& c) {
  trainer_t& t = the_trainer();
  const trainer_bits before(t);
  try {
    io::restore(t, c);
  } catch (const etude::error&) {
    if (!(trainer_bits(t) == before)) __builtin_trap();  // refused after it was taken
    return;
  }
  if (t.steps_done() != c.step()) __builtin_trap();
  const auto w = c.tensors().as<float>("model." + etude::param_name(trainer_t::params::entries[0]));
  if (std::memcmp(w.data(), t.tensor(trainer_t::params::entries[0]).data(), w.size() * sizeof(float)) != 0)
    __builtin_trap();
  (void)io::take_snapshot(t, {});  // a restored state is finite: it saves again without an error
  before.put_back(t);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  try {
    std::string path;
    if (data[0] & 1) {
      const std::string file = wrap_state(std::string(reinterpret_cast<const char*>(data + 1), size - 1));
      path = etude::fuzz::the_input().write(reinterpret_cast<const std::uint8_t*>(file.data()), file.size());
    } else {
      path = etude::fuzz::the_input().write(data + 1, size - 1);
    }
    const io::checkpoint_file c(path);
    volatile std::uint64_t sink = c.state().size() + c.tensors().size();
    sink = sink + static_cast<std::uint64_t>(c.step());
    (void)sink;
    restore_or_refuse(c);
  } catch (const etude::error&) {
    // the reader's refusal: expected for malformed input
  }
  return 0;
}
