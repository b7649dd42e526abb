#include "analysis/timeline/intervals.h"

#include <gtest/gtest.h>

namespace dynaflow {
namespace {

using V = std::vector<Interval>;

TEST(IntervalSetTest, MergesOverlappingAndTouchingAndDropsEmpty) {
  auto s = IntervalSet::FromUnsorted({{30, 40}, {0, 10}, {5, 12}, {12, 15}, {20, 20}, {25, 22}});
  EXPECT_EQ(s.intervals(), (V{{0, 15}, {30, 40}}));
  EXPECT_EQ(s.Length(), 25);
  EXPECT_EQ(s.first_start(), 0);
  EXPECT_EQ(s.last_end(), 40);
}

TEST(IntervalSetTest, Subtract) {
  auto a = IntervalSet::FromUnsorted({{0, 10}, {20, 30}, {40, 50}});
  auto b = IntervalSet::FromUnsorted({{5, 22}, {25, 27}, {45, 60}});
  EXPECT_EQ(a.Subtract(b).intervals(), (V{{0, 5}, {22, 25}, {27, 30}, {40, 45}}));
  EXPECT_EQ(b.Subtract(a).intervals(), (V{{10, 20}, {50, 60}}));
  EXPECT_TRUE(a.Subtract(a).empty());
  EXPECT_EQ(a.Subtract(IntervalSet()).intervals(), a.intervals());
}

TEST(IntervalSetTest, SubtractOneIntervalSpanningSeveral) {
  auto a = IntervalSet::FromUnsorted({{0, 100}});
  auto b = IntervalSet::FromUnsorted({{10, 20}, {30, 40}, {90, 120}});
  EXPECT_EQ(a.Subtract(b).intervals(), (V{{0, 10}, {20, 30}, {40, 90}}));
}

TEST(IntervalSetTest, UnionAndIntersect) {
  auto a = IntervalSet::FromUnsorted({{0, 10}, {20, 30}});
  auto b = IntervalSet::FromUnsorted({{5, 22}, {40, 45}});
  EXPECT_EQ(a.Union(b).intervals(), (V{{0, 30}, {40, 45}}));
  EXPECT_EQ(a.Intersect(b).intervals(), (V{{5, 10}, {20, 22}}));
  // |A| + |B| = |A u B| + |A n B|
  EXPECT_EQ(a.Length() + b.Length(), a.Union(b).Length() + a.Intersect(b).Length());
}

}  // namespace
}  // namespace dynaflow
