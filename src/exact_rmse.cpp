// exact_rmse.cpp: exact sums of squares of float64 differences, and same()'s rmse inequality
// decided on them in integer arithmetic.
#include "exact_rmse.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "metrics_internal.hpp"

namespace numalign::detail {

namespace {

__extension__ typedef unsigned __int128 U128;

// Adds src to the limbs of dst from limb `at` on, carrying as far as needed.
void add_limbs(std::vector<std::uint64_t>& dst, const std::uint64_t* src, std::size_t count,
               std::size_t at) {
  if (dst.size() < at + count + 1) dst.resize(at + count + 1, 0);
  std::uint64_t carry = 0;
  std::size_t i = 0;
  for (; i < count; ++i) {
    const U128 s = static_cast<U128>(dst[at + i]) + src[i] + carry;
    dst[at + i] = static_cast<std::uint64_t>(s);
    carry = static_cast<std::uint64_t>(s >> 64);
  }
  for (std::size_t k = at + i; carry != 0; ++k) {
    if (k == dst.size()) dst.push_back(0);
    const U128 s = static_cast<U128>(dst[k]) + carry;
    dst[k] = static_cast<std::uint64_t>(s);
    carry = static_cast<std::uint64_t>(s >> 64);
  }
}

}  // namespace

Natural::Natural(std::uint64_t v) {
  if (v != 0) limbs_.push_back(v);
}

Natural Natural::from_parts(std::uint64_t hi, std::uint64_t lo, unsigned shift) {
  Natural r;
  r.add_shifted(hi, lo, shift);
  return r;
}

void Natural::trim() {
  while (!limbs_.empty() && limbs_.back() == 0) limbs_.pop_back();
}

void Natural::add_shifted(std::uint64_t hi, std::uint64_t lo, unsigned shift) {
  if (hi == 0 && lo == 0) return;
  const unsigned bit = shift % 64;
  const std::uint64_t parts[3] = {lo << bit, bit ? (lo >> (64 - bit)) | (hi << bit) : hi,
                                  bit ? hi >> (64 - bit) : 0};
  add_limbs(limbs_, parts, 3, shift / 64);
  trim();
}

Natural& Natural::operator+=(const Natural& o) {
  add_limbs(limbs_, o.limbs_.data(), o.limbs_.size(), 0);
  trim();
  return *this;
}

Natural& Natural::operator-=(const Natural& o) {
  std::uint64_t borrow = 0;
  for (std::size_t i = 0; i < limbs_.size(); ++i) {
    const std::uint64_t sub = i < o.limbs_.size() ? o.limbs_[i] : 0;
    if (sub == 0 && borrow == 0 && i >= o.limbs_.size()) break;
    const U128 d = static_cast<U128>(limbs_[i]) - sub - borrow;
    limbs_[i] = static_cast<std::uint64_t>(d);
    borrow = static_cast<std::uint64_t>(d >> 64) != 0 ? 1 : 0;
  }
  trim();
  return *this;
}

Natural Natural::operator*(const Natural& o) const {
  Natural r;
  if (is_zero() || o.is_zero()) return r;
  r.limbs_.assign(limbs_.size() + o.limbs_.size(), 0);
  for (std::size_t i = 0; i < limbs_.size(); ++i) {
    std::uint64_t carry = 0;
    for (std::size_t j = 0; j < o.limbs_.size(); ++j) {
      const U128 p = static_cast<U128>(limbs_[i]) * o.limbs_[j] + r.limbs_[i + j] + carry;
      r.limbs_[i + j] = static_cast<std::uint64_t>(p);
      carry = static_cast<std::uint64_t>(p >> 64);
    }
    r.limbs_[i + o.limbs_.size()] = carry;
  }
  r.trim();
  return r;
}

Natural Natural::operator<<(unsigned bits) const {
  Natural r;
  if (is_zero()) return r;
  const unsigned whole = bits / 64, bit = bits % 64;
  r.limbs_.assign(limbs_.size() + whole + 1, 0);
  for (std::size_t i = 0; i < limbs_.size(); ++i) {
    r.limbs_[i + whole] |= limbs_[i] << bit;
    if (bit) r.limbs_[i + whole + 1] = limbs_[i] >> (64 - bit);
  }
  r.trim();
  return r;
}

std::strong_ordering operator<=>(const Natural& a, const Natural& b) {
  if (a.limbs_.size() != b.limbs_.size()) return a.limbs_.size() <=> b.limbs_.size();
  for (std::size_t i = a.limbs_.size(); i-- > 0;) {
    if (a.limbs_[i] != b.limbs_[i]) return a.limbs_[i] <=> b.limbs_[i];
  }
  return std::strong_ordering::equal;
}

namespace {

// A finite double as m * 2^e with m < 2^53 an integer and e >= -1074 (the subnormal
// spacing), and its sign.
struct Dyadic {
  std::uint64_t m;
  int e;
  bool negative;
};

Dyadic split(double x) {
  const auto b = std::bit_cast<std::uint64_t>(x);
  const int field = static_cast<int>((b >> 52) & 0x7FF);
  const std::uint64_t fraction = b & ((std::uint64_t{1} << 52) - 1);
  if (field == 0) return {fraction, -1074, (b >> 63) != 0};
  return {fraction | (std::uint64_t{1} << 52), field - 1075, (b >> 63) != 0};
}

// The unit of the sums: 2^-2148, the square of the least subnormal.
constexpr int kUnit = -2148;

// Adds (u - x)^2 = u^2 + x^2 - 2ux exactly: the squares to plus, 2ux to plus or minus by
// its sign. Each term is a product of two 53-bit integers at a power of two >= 2^-2148.
void add_square_of_difference(double u, double x, Natural& plus, Natural& minus) {
  const Dyadic a = split(u), b = split(x);
  auto add = [](Natural& to, std::uint64_t p, std::uint64_t q, int e, unsigned extra) {
    const U128 v = static_cast<U128>(p) * q;
    to.add_shifted(static_cast<std::uint64_t>(v >> 64), static_cast<std::uint64_t>(v),
                   static_cast<unsigned>(e - kUnit) + extra);
  };
  add(plus, a.m, a.m, 2 * a.e, 0);
  add(plus, b.m, b.m, 2 * b.e, 0);
  add(a.negative != b.negative ? plus : minus, a.m, b.m, a.e + b.e, 1);
}

// A non-negative finite double as an integer times 2^exponent.
struct Scaled {
  Natural value;
  int exponent;
};

Scaled scaled(double x) {
  const Dyadic d = split(x);
  return {Natural(d.m), d.e};
}

// a * 2^ea <= b * 2^eb.
bool at_most(const Natural& a, int ea, const Natural& b, int eb) {
  const int low = std::min(ea, eb);
  return (a << static_cast<unsigned>(ea - low)) <= (b << static_cast<unsigned>(eb - low));
}

}  // namespace

ExactSquares exact_squares(const TensorView& test, const TensorView& ref, const TensorView& truth) {
  const std::uint64_t n = test.numel();
  const std::size_t es = element_size(test.dtype), us = element_size(truth.dtype);
  Natural plus_t, minus_t, plus_r, minus_r;
  double t[kBlock], r[kBlock], u[kBlock];
  for (std::uint64_t base = 0; base < n; base += kBlock) {
    const auto m = static_cast<std::size_t>(std::min<std::uint64_t>(kBlock, n - base));
    decode_block(test.dtype, test.data + base * es, m, t);
    decode_block(ref.dtype, ref.data + base * es, m, r);
    decode_block(truth.dtype, truth.data + base * us, m, u);
    for (std::size_t i = 0; i < m; ++i) {
      add_square_of_difference(u[i], t[i], plus_t, minus_t);
      add_square_of_difference(u[i], r[i], plus_r, minus_r);
    }
  }
  ExactSquares s;
  s.test = plus_t;
  s.test -= minus_t;
  s.ref = plus_r;
  s.ref -= minus_r;
  s.n = n;
  return s;
}

// With c = tol / 10, sqrt(se/n) <= m sqrt(sb/n) + c squares (both sides >= 0) to
// se - m^2 sb - n c^2 <= 2 m c sqrt(n sb). Times 100, with K = 100 se - 100 m^2 sb - n tol^2:
// it holds when K <= 0, else iff K^2 <= 400 m^2 tol^2 n sb. se, sb are in units of 2^-2148;
// m and tol are integers times powers of two: every term is an integer times 2^e.
bool rmse_inequality_holds(const ExactSquares& s, double multiplier, double tol) {
  const Scaled m = scaled(multiplier), c = scaled(tol);
  const Natural hundred(100), n(s.n);
  // Left: 100 se at 2^kUnit. Right: 100 m^2 sb at 2^(2 em + kUnit) + n tol^2 at 2^(2 ec).
  const Natural m2 = m.value * m.value, t2 = c.value * c.value;
  const Natural left = hundred * s.test;
  const Natural right_a = hundred * m2 * s.ref, right_b = n * t2;
  const int e_left = kUnit, e_a = 2 * m.exponent + kUnit, e_b = 2 * c.exponent;
  const int low = std::min({e_left, e_a, e_b});
  auto at_low = [low](const Natural& v, int e) { return v << static_cast<unsigned>(e - low); };
  Natural k = at_low(left, e_left);
  Natural right = at_low(right_a, e_a);
  right += at_low(right_b, e_b);
  if (k <= right) return true;
  k -= right;
  // K^2 at 2^(2 low) against 400 m^2 tol^2 n sb at 2^(2 em + 2 ec + kUnit).
  const Natural lhs = k * k;
  const Natural rhs = Natural(400) * m2 * t2 * n * s.ref;
  return at_most(lhs, 2 * low, rhs, 2 * m.exponent + 2 * c.exponent + kUnit);
}

bool rmse_verdict_certain(double error, double bound, double multiplier) {
  if (!std::isfinite(error) || !std::isfinite(bound)) return false;
  // The sums are plain over blocks of 256 and compensated across them: each is within
  // 2^-44 of its exact value, and the roots, the product and the sum add a few 2^-53;
  // underflow of a square loses at most 2^-1074 per element, 2^-537 in a root.
  const double margin = 0x1p-40 * std::max(error, bound) + (1 + multiplier) * 0x1p-530;
  return std::fabs(error - bound) > margin;
}

}  // namespace numalign::detail
