#include "analysis/store/bounded_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

namespace dynaflow {
namespace {

TEST(BoundedQueueTest, KeepsOrderAcrossThreads) {
  BoundedQueue<std::unique_ptr<int>> q(2);
  std::vector<int> got;
  std::thread consumer([&] {
    std::unique_ptr<int> v;
    while (q.Pop(&v)) got.push_back(*v);
  });
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(q.Push(std::make_unique<int>(i)));
  q.Close();
  consumer.join();
  ASSERT_EQ(got.size(), 1000u);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(got[i], i);
}

TEST(BoundedQueueTest, ProducerWaitsWhileFull) {
  BoundedQueue<int> q(1);
  ASSERT_TRUE(q.Push(1));
  std::atomic<bool> pushed{false};
  std::thread producer([&] {
    q.Push(2);
    pushed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(pushed.load());
  int v = 0;
  ASSERT_TRUE(q.Pop(&v));
  EXPECT_EQ(v, 1);
  producer.join();
  EXPECT_TRUE(pushed.load());
  ASSERT_TRUE(q.Pop(&v));
  EXPECT_EQ(v, 2);
}

TEST(BoundedQueueTest, CloseDrainsThenEnds) {
  BoundedQueue<int> q(4);
  ASSERT_TRUE(q.Push(7));
  q.Close();
  EXPECT_FALSE(q.Push(8));
  int v = 0;
  ASSERT_TRUE(q.Pop(&v));
  EXPECT_EQ(v, 7);
  EXPECT_FALSE(q.Pop(&v));
}

TEST(BoundedQueueTest, CloseReleasesBlockedProducer) {
  BoundedQueue<int> q(1);
  ASSERT_TRUE(q.Push(1));
  std::atomic<int> result{-1};
  std::thread producer([&] { result = q.Push(2) ? 1 : 0; });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  q.Close();
  producer.join();
  EXPECT_EQ(result.load(), 0);
}

}  // namespace
}  // namespace dynaflow
