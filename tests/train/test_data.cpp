// Byte-level data: splits, windows, seeded shuffling and position restore.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "coremesh/train/data.hpp"
#include "test_util.hpp"

using namespace coremesh;
using namespace coremesh::train;

static std::string write_text(const std::string& dir, const std::string& name, size_t n) {
  std::string path = dir + "/" + name;
  std::ofstream out(path, std::ios::binary);
  uint64_t x = 12345;  // LCG text: no repeated windows
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    out.put(char('a' + (x >> 33) % 26));
  }
  return path;
}

TEST(Data, SplitsAndWindows) {
  TempDir d;
  auto a = write_text(d.path, "a.txt", 1000), b = write_text(d.path, "b.txt", 500);
  TextDataset ds({a, b}, 0.1);
  EXPECT_EQ(ds.total_bytes(), 1500);
  EXPECT_EQ(ds.split_bytes(Split::validation), 100 + 50);
  EXPECT_EQ(ds.split_bytes(Split::train), 900 + 450);
  auto tw = ds.windows(Split::train, 16), vw = ds.windows(Split::validation, 16);
  EXPECT_EQ(tw.size(), size_t((900 - 1) / 16 + (450 - 1) / 16));
  EXPECT_EQ(vw.size(), size_t((100 - 1) / 16 + (50 - 1) / 16));
  // Training windows end inside the training part of their file.
  for (const auto& w : tw) EXPECT_LE(w.offset + 17, w.file == 0 ? 900 : 450);
  for (const auto& w : vw) EXPECT_GE(w.offset, w.file == 0 ? 900 : 450);
}

TEST(Data, TargetsAreInputsShiftedByOne) {
  TempDir d;
  TextDataset ds({write_text(d.path, "a.txt", 4096)}, 0.0);
  DataLoader dl(ds, Split::train, 3, 32, 7);
  std::vector<int32_t> x, y;
  dl.next_batch(x, y);
  ASSERT_EQ(x.size(), 96u);
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t + 1 < 32; ++t) EXPECT_EQ(y[b * 32 + t], x[b * 32 + t + 1]);
  for (int v : x) EXPECT_TRUE(v >= 'a' && v <= 'z');
}

TEST(Data, ShuffleIsDeterministicBySeedAndCoversEveryWindow) {
  TempDir d;
  TextDataset ds({write_text(d.path, "a.txt", 20000)}, 0.0);
  auto run = [&](uint64_t seed, int batches) {
    DataLoader dl(ds, Split::train, 4, 16, seed);
    std::vector<int32_t> all, x, y;
    for (int i = 0; i < batches; ++i) {
      dl.next_batch(x, y);
      all.insert(all.end(), x.begin(), x.end());
    }
    return all;
  };
  EXPECT_EQ(run(1, 20), run(1, 20));
  EXPECT_NE(run(1, 20), run(2, 20));
  // One epoch visits every window once: count distinct window contents' offsets.
  DataLoader dl(ds, Split::train, 1, 16, 3);
  const int64_t n = dl.num_windows();
  std::set<std::vector<int32_t>> seen;
  std::vector<int32_t> x, y;
  for (int64_t i = 0; i < n; ++i) {
    dl.next_batch(x, y);
    seen.insert(x);
  }
  EXPECT_EQ(dl.position().epoch, 0u);
  EXPECT_EQ(dl.position().cursor, uint64_t(n));
  dl.next_batch(x, y);
  EXPECT_EQ(dl.position().epoch, 1u);  // wrapped into a new, differently shuffled epoch
  EXPECT_EQ(seen.size(), size_t(n));  // every window exactly once
}

TEST(Data, PositionRestoreContinuesTheSameSequence) {
  TempDir d;
  TextDataset ds({write_text(d.path, "a.txt", 5000)}, 0.05);
  DataLoader a(ds, Split::train, 8, 24, 11);
  std::vector<int32_t> x, y, x2, y2;
  for (int i = 0; i < 37; ++i) a.next_batch(x, y);  // crosses epoch boundaries
  DataPosition pos = a.position();
  EXPECT_GT(pos.epoch, 0u);
  DataLoader b(ds, Split::train, 8, 24, 11);
  b.set_position(pos);
  for (int i = 0; i < 10; ++i) {
    a.next_batch(x, y);
    b.next_batch(x2, y2);
    ASSERT_EQ(x, x2);
    ASSERT_EQ(y, y2);
  }
}

TEST(Data, ClearErrors) {
  TempDir d;
  EXPECT_THROW(TextDataset({d.path + "/missing.txt"}, 0.1), InvalidArgument);
  EXPECT_THROW(TextDataset({write_text(d.path, "a.txt", 100)}, 1.0), InvalidArgument);
  try {
    TextDataset dir({d.path}, 0.1);
    FAIL() << "accepted a directory as a data file";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
  TextDataset ds({write_text(d.path, "b.txt", 100)}, 0.1);
  try {
    DataLoader dl(ds, Split::validation, 1, 64, 0);
    FAIL() << "accepted a split without a full window";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("validation split has no window"), std::string::npos);
  }
}
