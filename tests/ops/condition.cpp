// The condition ops (ops/condition.hpp) on the CPU against their plain definitions, element by
// element: the gather with its null condition, the bias and mask rows, fuse::sum's broadcast and
// fuse::prepend's sequence; each backward against central differences of its forward in double
// (the ops are linear, so the check is exact up to the differences' rounding). The whole conditioned
// model's gradients are tests/config/conditions.cpp's.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include <etude/backend/cpu/cpu.hpp>

#include "ops/oracle.hpp"

using cpu = etude::backend::cpu;
using etude::index_t;
using namespace etude::test::ops;

TEST_CASE("condition_gather: a table row per example, zero for the null condition; its backward sums by index",
          "[ops][condition]") {
  const index_t batch = 4, width = 5, values = 3, stride = 2;
  // index read every stride-th value; example 2 is the null condition, examples 0 and 3 share row 1
  const std::vector<std::int32_t> index{1, 9, 0, 9, -1, 9, 1, 9};
  auto table = random_vector(static_cast<std::size_t>(values * width), 1);
  std::vector<double> rows(static_cast<std::size_t>(batch * width), 7.0);
  cpu::condition_gather(rows.data(), table.data(), index.data(), batch, width, stride);
  for (index_t b = 0; b < batch; ++b)
    for (index_t j = 0; j < width; ++j) {
      const std::int32_t i = index[static_cast<std::size_t>(b * stride)];
      INFO("example " << b << " column " << j);
      CHECK(rows[static_cast<std::size_t>(b * width + j)] == (i < 0 ? 0.0 : table[static_cast<std::size_t>(i * width + j)]));
    }

  const auto drows = random_vector(rows.size(), 2);
  std::vector<double> dtable(table.size(), 0.0);
  cpu::condition_gather_bwd(dtable.data(), drows.data(), index.data(), batch, width, stride);
  check_gradient(table, dtable, [&] {
    cpu::condition_gather(rows.data(), table.data(), index.data(), batch, width, stride);
    return dot(rows, drows);
  }, "dtable");
  // the backward adds to what the table's gradient holds
  std::vector<double> again(table.size(), 0.5);
  cpu::condition_gather_bwd(again.data(), drows.data(), index.data(), batch, width, stride);
  for (std::size_t i = 0; i < again.size(); ++i) CHECK(again[i] == 0.5 + dtable[i]);
}

TEST_CASE("bias_rows adds a bias to every row of a strided matrix; bias_grad sums the rows into dbias",
          "[ops][condition]") {
  const index_t rows = 3, n = 4, ld = 6;
  auto y0 = random_vector(static_cast<std::size_t>(rows * ld), 3);
  auto bias = random_vector(static_cast<std::size_t>(n), 4);
  auto y = y0;
  cpu::bias_rows(y.data(), bias.data(), rows, n, ld);
  for (index_t r = 0; r < rows; ++r)
    for (index_t j = 0; j < ld; ++j) {
      const auto e = static_cast<std::size_t>(r * ld + j);
      CHECK(y[e] == (j < n ? y0[e] + bias[static_cast<std::size_t>(j)] : y0[e]));  // the stride's tail untouched
    }

  const auto dy = random_vector(y.size(), 5);
  std::vector<double> dbias(bias.size(), 0.0);
  cpu::bias_grad(dbias.data(), dy.data(), rows, n, ld);
  check_gradient(bias, dbias, [&] {
    y = y0;
    cpu::bias_rows(y.data(), bias.data(), rows, n, ld);
    return dot(y, dy);
  }, "dbias");
}

TEST_CASE("mask_rows zeroes the rows whose mask is 0 and keeps the others bit for bit", "[ops][condition]") {
  const index_t rows = 4, n = 3, ld = 5;
  const auto x0 = random_vector(static_cast<std::size_t>(rows * ld), 6);
  const std::vector<float> mask{1, 0, 1, 0};
  auto x = x0;
  cpu::mask_rows(x.data(), mask.data(), rows, n, ld);
  for (index_t r = 0; r < rows; ++r)
    for (index_t j = 0; j < ld; ++j) {
      const auto e = static_cast<std::size_t>(r * ld + j);
      CHECK(x[e] == (j < n && mask[static_cast<std::size_t>(r)] == 0 ? 0.0 : x0[e]));
    }
}

TEST_CASE("add_rows broadcasts a row per example over its steps; sum_rows is its backward", "[ops][condition]") {
  const index_t batch = 2, steps = 3, n = 4;
  const auto x0 = random_vector(static_cast<std::size_t>(batch * steps * n), 7);
  auto c = random_vector(static_cast<std::size_t>(batch * n), 8);
  auto x = x0;
  cpu::add_rows(x.data(), c.data(), batch, steps, n);
  for (index_t r = 0; r < batch * steps; ++r)
    for (index_t j = 0; j < n; ++j) {
      const auto e = static_cast<std::size_t>(r * n + j);
      CHECK(x[e] == x0[e] + c[static_cast<std::size_t>((r / steps) * n + j)]);
    }

  const auto dx = random_vector(x.size(), 9);
  std::vector<double> dc(c.size(), 3.0);  // written, not added to
  cpu::sum_rows(dc.data(), dx.data(), batch, steps, n);
  check_gradient(c, dc, [&] {
    x = x0;
    cpu::add_rows(x.data(), c.data(), batch, steps, n);
    return dot(x, dx);
  }, "dc");
}

TEST_CASE("prepend_rows: condition rows plus their positions, then the token rows; its backward splits dx",
          "[ops][condition]") {
  const index_t batch = 2, lc = 2, steps = 3, n = 4, len = lc + steps;
  auto cond = random_vector(static_cast<std::size_t>(batch * lc * n), 10);
  auto tok = random_vector(static_cast<std::size_t>(batch * steps * n), 11);
  const auto pos = random_vector(static_cast<std::size_t>(lc * n), 12);
  std::vector<double> x(static_cast<std::size_t>(batch * len * n));
  cpu::prepend_rows(x.data(), cond.data(), tok.data(), pos.data(), batch, lc, steps, n);
  for (index_t b = 0; b < batch; ++b)
    for (index_t i = 0; i < len; ++i)
      for (index_t j = 0; j < n; ++j) {
        const double got = x[static_cast<std::size_t>((b * len + i) * n + j)];
        INFO("example " << b << " row " << i << " column " << j);
        if (i < lc)
          CHECK(got == cond[static_cast<std::size_t>((b * lc + i) * n + j)] + pos[static_cast<std::size_t>(i * n + j)]);
        else
          CHECK(got == tok[static_cast<std::size_t>((b * steps + i - lc) * n + j)]);
      }

  const auto dx = random_vector(x.size(), 13);
  std::vector<double> dcond(cond.size()), dtok(tok.size());
  cpu::prepend_rows_bwd(dcond.data(), dtok.data(), dx.data(), batch, lc, steps, n);
  auto loss = [&] {
    cpu::prepend_rows(x.data(), cond.data(), tok.data(), pos.data(), batch, lc, steps, n);
    return dot(x, dx);
  };
  check_gradient(cond, dcond, loss, "dcond");
  check_gradient(tok, dtok, loss, "dtok");

  // bf16 rows: the sum in float, rounded once
  using etude::bf16;
  std::vector<bf16> cb(cond.size()), tb(tok.size()), xb(x.size());
  std::vector<float> pf(pos.begin(), pos.end());
  for (std::size_t i = 0; i < cb.size(); ++i) cb[i] = bf16(static_cast<float>(cond[i]));
  for (std::size_t i = 0; i < tb.size(); ++i) tb[i] = bf16(static_cast<float>(tok[i]));
  cpu::prepend_rows(xb.data(), cb.data(), tb.data(), pf.data(), batch, lc, steps, n);
  for (index_t b = 0; b < batch; ++b)
    for (index_t i = 0; i < lc; ++i)
      for (index_t j = 0; j < n; ++j) {
        const auto c = static_cast<std::size_t>((b * lc + i) * n + j), p = static_cast<std::size_t>(i * n + j);
        CHECK(static_cast<float>(xb[static_cast<std::size_t>((b * len + i) * n + j)]) ==
              static_cast<float>(bf16(static_cast<float>(cb[c]) + pf[p])));
      }
}
