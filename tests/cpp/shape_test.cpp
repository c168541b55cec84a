// shape_test.cpp: Shape behaves as the std::vector it replaced, on both sides of its inline
// capacity (the sanitizer build checks that no storage is lost or freed twice).
#include "numalign/shape.hpp"

#include <gtest/gtest.h>

#include <iterator>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

namespace numalign {
namespace {

using Dims = std::vector<std::uint64_t>;

void expect_same(const Shape& s, const Dims& v) {
  ASSERT_EQ(s.size(), v.size());
  EXPECT_EQ(s.empty(), v.empty());
  EXPECT_EQ(Dims(s.begin(), s.end()), v);
  for (std::size_t i = 0; i < v.size(); ++i) EXPECT_EQ(s[i], v[i]) << i;
  if (!v.empty()) {
    EXPECT_EQ(s.front(), v.front());
    EXPECT_EQ(s.back(), v.back());
  }
}

TEST(ShapeTest, ConstructsAsAVectorDoes) {
  expect_same(Shape(), Dims());
  expect_same(Shape{}, Dims{});
  expect_same(Shape{7}, Dims{7});  // one dimension of 7, not seven dimensions
  expect_same(Shape{2, 3}, Dims{2, 3});
  expect_same(Shape(8, 2), Dims(8, 2));  // eight dimensions of 2
  expect_same(Shape(3, 5), Dims(3, 5));
  expect_same(Shape(0, 5), Dims(0, 5));
  const Dims long_dims{1, 2, 3, 4, 5, 6};
  expect_same(Shape(long_dims.begin(), long_dims.end()), long_dims);
  expect_same(Shape(long_dims), long_dims);
  EXPECT_EQ(sizeof(Shape), 32u) << "three dimensions inline and a size";
}

// Every rank from 0 to 9, through every way of making, copying and moving a shape: the
// contents always those of the vector made alongside, the moved-from shape empty.
TEST(ShapeTest, CopiesMovesAndGrowsAcrossTheInlineCapacity) {
  std::mt19937_64 rng(7);
  for (std::size_t rank = 0; rank <= 9; ++rank) {
    SCOPED_TRACE(rank);
    Dims v;
    Shape s;
    for (std::size_t i = 0; i < rank; ++i) {
      v.push_back(rng());
      s.push_back(v.back());
      expect_same(s, v);
    }
    const Shape copy = s;
    expect_same(copy, v);
    EXPECT_TRUE(copy == s);
    Shape moved = std::move(s);
    expect_same(moved, v);
    expect_same(s, Dims());  // NOLINT(bugprone-use-after-move): moved-from is empty
    Shape assigned{1, 2, 3, 4, 5};
    assigned = moved;
    expect_same(assigned, v);
    Shape move_assigned{9};
    move_assigned = std::move(assigned);
    expect_same(move_assigned, v);
    const Shape& itself = move_assigned;
    move_assigned = itself;  // self-assignment keeps the dimensions
    expect_same(move_assigned, v);
    move_assigned.clear();
    expect_same(move_assigned, Dims());
    move_assigned.push_back(4);
    expect_same(move_assigned, Dims{4});
  }
}

// Dimensions read one at a time (an input iterator: no count ahead) and a long run of
// push_back, which grows the heap buffer by doubling.
TEST(ShapeTest, GrowsOneDimensionAtATime) {
  std::istringstream text("4 5 6 7 8 9 10");
  const Shape read{std::istream_iterator<std::uint64_t>(text),
                   std::istream_iterator<std::uint64_t>()};
  expect_same(read, Dims{4, 5, 6, 7, 8, 9, 10});
  Dims v;
  Shape s;
  for (std::uint64_t i = 0; i < 1000; ++i) {
    v.push_back(i * 3);
    s.push_back(i * 3);
  }
  expect_same(s, v);
  expect_same(Shape(s), v);
}

TEST(ShapeTest, EqualOnlyWithTheSameDimensionsInOrder) {
  EXPECT_TRUE((Shape{2, 3} == Shape{2, 3}));
  EXPECT_FALSE((Shape{2, 3} == Shape{3, 2}));
  EXPECT_FALSE((Shape{2, 3} == Shape{2, 3, 1}));
  EXPECT_FALSE((Shape{1, 2, 3, 4} == Shape{1, 2, 3, 5}));
  EXPECT_TRUE((Shape{1, 2, 3, 4} == Shape(Dims{1, 2, 3, 4})));
  EXPECT_TRUE((Shape{} == Shape()));
  EXPECT_TRUE((Shape{2, 3} != Shape{2, 4}));
}

TEST(ShapeTest, WritesThroughIndexAndIterators) {
  Shape s(5, 0);
  std::uint64_t k = 10;
  for (auto& d : s) d = k++;
  s[0] = 1;
  expect_same(s, Dims{1, 11, 12, 13, 14});
  Shape t(2, 0);
  t.back() = 6;
  t.front() = 5;
  expect_same(t, Dims{5, 6});
}

}  // namespace
}  // namespace numalign
