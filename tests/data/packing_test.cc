#include "data/packing.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "data/sampler.h"
#include "test_util.h"

namespace astrai::data {
namespace {

using testing::error_of;

// Documents with distinct, recognisable tokens: doc d token k = d * 1000 + k + 1 (never the
// pad id 0), loss mask alternating so masks can be tracked too.
std::vector<std::vector<int32_t>> make_docs(const std::vector<int64_t>& lengths) {
  std::vector<std::vector<int32_t>> docs;
  for (size_t d = 0; d < lengths.size(); ++d) {
    std::vector<int32_t> t;
    for (int64_t k = 0; k < lengths[d]; ++k) t.push_back(static_cast<int32_t>(d * 1000 + k + 1));
    docs.push_back(t);
  }
  return docs;
}

std::vector<PackedRow> pack(Packing mode, const std::vector<std::vector<int32_t>>& docs, int64_t row_len,
                            PackingStats* stats = nullptr, int64_t buffer = int64_t{1} << 24) {
  std::vector<PackedRow> rows;
  Packer p(mode, row_len, /*pad_id=*/0, [&](const PackedRow& r) { rows.push_back(r); }, buffer);
  for (const auto& d : docs) {
    std::vector<uint8_t> mask(d.size());
    for (size_t k = 0; k < d.size(); ++k) mask[k] = (d[k] % 2) != 0;
    p.add(d, mask);
  }
  p.flush();
  if (stats) *stats = p.stats();
  return rows;
}

// Checks the packing invariants and returns, per document, its tokens in the order found.
void check_invariants(Packing mode, const std::vector<std::vector<int32_t>>& docs, const std::vector<PackedRow>& rows,
                      int64_t row_len) {
  std::vector<std::vector<int32_t>> found(docs.size());
  int64_t real = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const PackedRow& row = rows[r];
    ASSERT_EQ(row.tokens.size(), row.loss_mask.size());
    ASSERT_EQ(row.tokens.size(), row.position_ids.size());
    if (mode != Packing::kNone) {
      ASSERT_EQ(static_cast<int64_t>(row.tokens.size()), row_len) << "row " << r;
    }
    bool in_padding = false;
    for (size_t j = 0; j < row.tokens.size(); ++j) {
      const int32_t t = row.tokens[j];
      // Positions: 0 at a piece start, +1 inside a piece.
      if (j == 0) {
        EXPECT_EQ(row.position_ids[j], 0) << "row " << r;
      } else if (row.position_ids[j] != 0) {
        EXPECT_EQ(row.position_ids[j], row.position_ids[j - 1] + 1) << "row " << r << " col " << j;
        // Inside one piece, tokens belong to the same document and are consecutive.
        if (t != 0) {
          EXPECT_EQ(t, row.tokens[j - 1] + 1) << "row " << r << " col " << j;
        }
      }
      if (t == 0) {
        if (!in_padding) {
          EXPECT_EQ(row.position_ids[j], 0) << "padding starts its own segment";
        }
        in_padding = true;
        EXPECT_EQ(row.loss_mask[j], 0);
        continue;
      }
      EXPECT_FALSE(in_padding) << "padding only at the end of a row";
      ++real;
      EXPECT_EQ(row.loss_mask[j], (t % 2) != 0);
      // A new document always starts at position 0.
      if (j > 0 && row.tokens[j - 1] != 0 && row.tokens[j - 1] / 1000 != t / 1000) {
        EXPECT_EQ(row.position_ids[j], 0);
      }
      found[static_cast<size_t>((t - 1) / 1000)].push_back(t);
    }
  }
  int64_t total = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    total += static_cast<int64_t>(docs[d].size());
    std::vector<int32_t> sorted = found[d];
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, docs[d]) << "document " << d << " lost or duplicated tokens";
  }
  EXPECT_EQ(real, total);
}

TEST(Packing, SimpleConcatenatesAndCutsRows) {
  const auto docs = make_docs({3, 5, 2});
  PackingStats st;
  const auto rows = pack(Packing::kSimple, docs, 4, &st);
  ASSERT_EQ(rows.size(), 3u);  // 10 tokens -> ceil(10 / 4)
  EXPECT_EQ(rows[0].tokens, (std::vector<int32_t>{1, 2, 3, 1001}));
  EXPECT_EQ(rows[0].position_ids, (std::vector<int32_t>{0, 1, 2, 0}));
  // The cut document continues as a new piece with positions from 0.
  EXPECT_EQ(rows[1].tokens, (std::vector<int32_t>{1002, 1003, 1004, 1005}));
  EXPECT_EQ(rows[1].position_ids, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(rows[2].tokens, (std::vector<int32_t>{2001, 2002, 0, 0}));
  EXPECT_EQ(rows[2].position_ids, (std::vector<int32_t>{0, 1, 0, 1}));
  EXPECT_EQ(rows[2].loss_mask, (std::vector<uint8_t>{1, 0, 0, 0}));
  EXPECT_EQ(st.padding, 2);
  EXPECT_EQ(st.split_documents, 1);
  EXPECT_EQ(st.tokens, 10);
  check_invariants(Packing::kSimple, docs, rows, 4);
}

TEST(Packing, BestFitDecreasingKeepsFittingDocumentsWhole) {
  // Rows of 10: 7+3, 6+4, 5+5 fill three rows exactly; simple packing would split documents.
  const auto docs = make_docs({5, 3, 7, 4, 6, 5});
  PackingStats st;
  const auto rows = pack(Packing::kBestFit, docs, 10, &st);
  EXPECT_EQ(rows.size(), 3u);
  EXPECT_EQ(st.padding, 0);
  EXPECT_EQ(st.split_documents, 0);
  check_invariants(Packing::kBestFit, docs, rows, 10);
  PackingStats simple;
  pack(Packing::kSimple, docs, 10, &simple);
  EXPECT_GT(simple.split_documents, 0);
}

TEST(Packing, BestFitSplitsOnlyOverlongDocuments) {
  const auto docs = make_docs({23, 4, 10, 1});
  PackingStats st;
  const auto rows = pack(Packing::kBestFit, docs, 10, &st);
  EXPECT_EQ(st.split_documents, 1);
  check_invariants(Packing::kBestFit, docs, rows, 10);
  // 23 = 10 + 10 + 3; the 3 joins 4 and 1 in one row; 10 has its own row.
  EXPECT_EQ(rows.size(), 4u);
}

TEST(Packing, NoneKeepsOneUnpaddedRecordPerDocument) {
  const auto docs = make_docs({3, 1, 12});
  const auto rows = pack(Packing::kNone, docs, 4);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[2].tokens.size(), 12u);
  EXPECT_EQ(rows[2].position_ids.back(), 11);
  check_invariants(Packing::kNone, docs, rows, 4);
}

// Random corpora: invariants always hold; BFD never splits a document that fits, never uses
// fewer rows than the lower bound ceil(tokens / row_len) (which simple packing attains), and
// never more than next-fit without splitting.
TEST(Packing, RandomCorporaInvariantsAndRowBounds) {
  SplitMix64 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t row_len = 8 + static_cast<int64_t>(rng.below(40));
    std::vector<int64_t> lengths;
    const int n = 1 + static_cast<int>(rng.below(60));
    for (int i = 0; i < n; ++i) lengths.push_back(1 + static_cast<int64_t>(rng.below(static_cast<uint64_t>(row_len * 2))));
    const auto docs = make_docs(lengths);
    const int64_t buffer = trial % 2 ? (int64_t{1} << 24) : 50;  // also exercise buffered BFD
    PackingStats s_simple, s_bfd;
    const auto simple = pack(Packing::kSimple, docs, row_len, &s_simple);
    const auto bfd = pack(Packing::kBestFit, docs, row_len, &s_bfd, buffer);
    check_invariants(Packing::kSimple, docs, simple, row_len);
    check_invariants(Packing::kBestFit, docs, bfd, row_len);
    const int64_t total = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
    EXPECT_EQ(static_cast<int64_t>(simple.size()), (total + row_len - 1) / row_len);
    EXPECT_GE(bfd.size(), simple.size());
    int64_t overlong = 0;
    for (int64_t l : lengths) overlong += l > row_len;
    EXPECT_EQ(s_bfd.split_documents, overlong);
    if (buffer > total) {
      // Next-fit over the same pieces, no splitting: BFD never does worse.
      int64_t next_fit = 0, space = 0;
      for (int64_t l : lengths) {
        for (int64_t rest = l; rest > 0;) {
          const int64_t piece = std::min(rest, row_len);
          if (piece > space) {
            ++next_fit;
            space = row_len;
          }
          space -= piece;
          rest -= piece;
        }
      }
      EXPECT_LE(static_cast<int64_t>(bfd.size()), next_fit);
    }
  }
}

TEST(Packing, BestFitDecreasingPlacesIntoTightestBin) {
  // Items 6, 5, 4, 3 into capacity 9: 6 -> bin0 (3 left), 5 -> bin1 (4 left), 4 -> bin1 (tightest
  // fit, 0 left), 3 -> bin0 (0 left).
  const std::vector<int64_t> lengths{3, 6, 4, 5};
  const auto bins = best_fit_decreasing(lengths, 9);
  ASSERT_EQ(bins.size(), 2u);
  EXPECT_EQ(bins[0], (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(bins[1], (std::vector<int64_t>{3, 2}));
  EXPECT_THAT(error_of([&] { best_fit_decreasing(std::vector<int64_t>{10}, 9); }), ::testing::HasSubstr("does not fit"));
}

TEST(Packing, ErrorsAreClear) {
  EXPECT_THAT(error_of([] { parse_packing("zip"); }), ::testing::HasSubstr("unknown packing"));
  Packer p(Packing::kSimple, 4, 0, [](const PackedRow&) {});
  EXPECT_THAT(error_of([&] { p.add(std::vector<int32_t>{1, 2}, std::vector<uint8_t>{1}); }),
              ::testing::HasSubstr("loss mask has 1 entries for 2 tokens"));
  EXPECT_EQ(parse_packing("bfd"), Packing::kBestFit);
}

}  // namespace
}  // namespace astrai::data
