// The tuning cache without a GPU: shape-class keys, the JSON file format, the file location from
// the environment, persistence across a reset, and validate()'s checks of explicit settings.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/tuning.hpp"
#include "dispatch/tuning_cache.hpp"
#include "mamba2_ssd/api.hpp"
#include "mamba2_ssd/tuning.hpp"
#include "test_util.hpp"

namespace mamba2_ssd::test {
namespace {

using detail::DeviceId;
using detail::TuningEntry;

ProblemConfig small_config() {
  ProblemConfig c;
  c.batch = 2;
  c.seqlen = 300;
  c.nheads = 4;
  c.ngroups = 1;
  c.headdim = 64;
  c.dstate = 64;
  c.chunk_size = 64;
  c.has_initial_states = true;
  return c;
}

std::string key_of(const ProblemConfig& c, const DeviceId& dev = {"NVIDIA H200", 132}) {
  Problem prob(c);
  ForwardParams p = prob.params(Device::kCPU);
  return detail::make_tuning_key(dev, p, validate(p));
}

// A temporary cache file named by MAMBA2_SSD_TUNING_CACHE for one test.
struct TempCacheFile {
  std::string path;
  TempCacheFile() {
    path = "/tmp/mamba2_ssd_tuning_test_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".json";
    std::remove(path.c_str());
    ::setenv("MAMBA2_SSD_TUNING_CACHE", path.c_str(), 1);
    reset_tuning_cache();
  }
  ~TempCacheFile() {
    std::remove(path.c_str());
    ::unsetenv("MAMBA2_SSD_TUNING_CACHE");
    reset_tuning_cache();
  }
};

TEST(TuningKey, SameClassSameKeyAndEachFieldMatters) {
  const ProblemConfig base = small_config();
  const std::string k = key_of(base);
  EXPECT_EQ(k, key_of(base));
  EXPECT_EQ(k.rfind("k39|", 0), 0u) << k;  // (the kernels' revision: entries of earlier builds do not apply)
  ProblemConfig c = base;
  c.seqlen = 280;  // same power-of-two bucket of tokens per row (512)
  EXPECT_EQ(key_of(c), k);
  c.seqlen = 1000;
  EXPECT_NE(key_of(c), k);
  c = base; c.dstate = 128; EXPECT_NE(key_of(c), k);
  c = base; c.headdim = 128; EXPECT_NE(key_of(c), k);
  c = base; c.chunk_size = 128; EXPECT_NE(key_of(c), k);
  c = base; c.nheads = 8; EXPECT_NE(key_of(c), k);
  c = base; c.ngroups = 2; EXPECT_NE(key_of(c), k);
  c = base; c.batch = 3; EXPECT_NE(key_of(c), k);
  c = base; c.dtype = DType::kFloat16; c.dt_dtype = DType::kFloat16; EXPECT_NE(key_of(c), k);
  c = base; c.has_initial_states = false; EXPECT_NE(key_of(c), k);
  c = base; c.has_z = true; EXPECT_NE(key_of(c), k);
  EXPECT_NE(key_of(base, {"NVIDIA H100 80GB HBM3", 132}), k);
  EXPECT_NE(key_of(base, {"NVIDIA H200", 114}), k);
  // Walk counts above 8 share power-of-two buckets.
  c = base; c.batch = 9;
  ProblemConfig d = base; d.batch = 16;
  EXPECT_EQ(key_of(c), key_of(d));
}

TEST(TuningJson, RoundTripAndUnknownFieldsAreSkipped) {
  std::map<std::string, TuningEntry> a;
  a["dev|sm132|bf16|p64"] = {{32, 4, 2, 8, 2, 2}, 1.25, 1.5};
  a["dev|sm132|f16|p128"] = {{64, 2, 1, 0, 1}, 0.5, 0.75};
  const std::string text = detail::to_tuning_json(a);
  std::map<std::string, TuningEntry> b;
  std::string why;
  ASSERT_TRUE(detail::parse_tuning_json(text, b, &why)) << why;
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b["dev|sm132|bf16|p64"].config, (KernelConfig{32, 4, 2, 8, 2, 2}));
  EXPECT_DOUBLE_EQ(b["dev|sm132|bf16|p64"].ms, 1.25);
  EXPECT_EQ(b["dev|sm132|f16|p128"].config, (KernelConfig{64, 2, 1, 0, 1}));
  // A later version's extra fields are ignored; an entry from before walk segments leaves them
  // unset (and fused_walk's heads per CTA), and one from before fused_walk was tuned on the two
  // kernels (fused_walk 1).
  const std::string extra =
      "{\"version\": 1, \"note\": {\"x\": [1, 2, \"y\"]}, \"entries\": [{\"key\": \"k\", \"future\": true, "
      "\"pass_state_dstate_tile\": 64, \"pass_state_stages\": 4, \"compute_out_heads_per_cta\": 4}]}";
  std::map<std::string, TuningEntry> c;
  ASSERT_TRUE(detail::parse_tuning_json(extra, c, &why)) << why;
  EXPECT_EQ(c["k"].config, (KernelConfig{64, 4, 4, 0, 1}));
}

TEST(TuningJson, BadTextIsRejectedWithAReason) {
  std::map<std::string, TuningEntry> e;
  std::string why;
  for (const char* bad : {"", "{", "[]", "{\"version\": 2, \"entries\": []}", "{\"entries\": []}",
                          "{\"version\": 1, \"entries\": [{\"key\": \"k\", \"pass_state_dstate_tile\": 48, "
                          "\"pass_state_stages\": 4, \"compute_out_heads_per_cta\": 2}]}",
                          "{\"version\": 1, \"entries\": [{\"key\": \"k\", \"pass_state_dstate_tile\": 32, "
                          "\"pass_state_stages\": 4, \"compute_out_heads_per_cta\": 2, \"fused_walk_heads_per_cta\": 4}]}",
                          "{\"version\": 1, \"entries\": [{\"pass_state_dstate_tile\": 32}]}",
                          "{\"version\": 1, \"entries\": [{\"key\": \"k\" \"x\": 1}]}"}) {
    why.clear();
    EXPECT_FALSE(detail::parse_tuning_json(bad, e, &why)) << bad;
    EXPECT_FALSE(why.empty()) << bad;
  }
}

TEST(TuningCacheFile, LocationFromTheEnvironment) {
  ::setenv("MAMBA2_SSD_TUNING_CACHE", "off", 1);
  EXPECT_EQ(detail::tuning_cache_file_from_env(), "");
  ::setenv("MAMBA2_SSD_TUNING_CACHE", "/some/where.json", 1);
  EXPECT_EQ(detail::tuning_cache_file_from_env(), "/some/where.json");
  ::unsetenv("MAMBA2_SSD_TUNING_CACHE");
  ::setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(detail::tuning_cache_file_from_env(), "/xdg/mamba2_ssd/tuning.json");
  ::unsetenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] != '\0') {
    EXPECT_EQ(detail::tuning_cache_file_from_env(), std::string(home) + "/.cache/mamba2_ssd/tuning.json");
  }
}

TEST(TuningCacheFile, StoredEntriesSurviveAResetAndOtherEntriesAreMerged) {
  TempCacheFile tmp;
  auto& cache = detail::TuningCache::instance();
  EXPECT_EQ(cache.path(), tmp.path);
  EXPECT_FALSE(cache.find("a").has_value());
  cache.store("a", {{32, 2, 1, 0, 1}, 1.0, 2.0}, true);
  // Another process adds an entry to the file meanwhile.
  {
    std::map<std::string, TuningEntry> other;
    other["b"] = {{64, 4, 4, 4, 2}, 3.0, 3.0};
    other["a"] = {{32, 2, 1, 0, 1}, 1.0, 2.0};
    std::ofstream(tmp.path) << detail::to_tuning_json(other);
  }
  cache.store("c", {{64, 2, 2}, 1.0, 1.0}, true);
  reset_tuning_cache();
  ASSERT_TRUE(cache.find("a").has_value());
  EXPECT_EQ(cache.find("a")->config, (KernelConfig{32, 2, 1, 0, 1}));
  ASSERT_TRUE(cache.find("b").has_value());
  EXPECT_EQ(cache.find("b")->config, (KernelConfig{64, 4, 4, 4, 2}));
  ASSERT_TRUE(cache.find("c").has_value());
  // Not persisted: gone after a reset.
  cache.store("d", {{64, 2, 2}, 1.0, 1.0}, false);
  EXPECT_TRUE(cache.find("d").has_value());
  reset_tuning_cache();
  EXPECT_FALSE(cache.find("d").has_value());
}

TEST(TuningCacheFile, AnUnreadableFileIsIgnored) {
  TempCacheFile tmp;
  std::ofstream(tmp.path) << "not json at all";
  EXPECT_FALSE(detail::TuningCache::instance().find("a").has_value());
  // Storing replaces it with a valid file.
  detail::TuningCache::instance().store("a", {{32, 4, 2}, 1.0, 1.0}, true);
  reset_tuning_cache();
  EXPECT_TRUE(detail::TuningCache::instance().find("a").has_value());
}

TEST(TuningHeuristic, ValidSettingsForEveryShapeClass) {
  for (int64_t p : {64, 128})
    for (int64_t h : {1, 3, 8, 80})
      for (int64_t walks : {1, 4, 64})
        for (int64_t n : {16, 64, 128, 512}) {
        ProblemShape s;
        s.batch = walks; s.nheads = h; s.ngroups = 1; s.headdim = p; s.dstate = n; s.seqlen = 4096;
        s.nchunks = 4096 / 64;
        const KernelConfig c = detail::heuristic_config(s, walks, true, 132, detail::max_walk_segments(s, false));
        EXPECT_TRUE(c.pass_state_dstate_tile == 32 || c.pass_state_dstate_tile == 64);
        EXPECT_GE(c.pass_state_segments, 1);
        EXPECT_LE(c.pass_state_segments, detail::max_walk_segments(s, false));
        EXPECT_EQ(detail::heuristic_config(s, walks, true, 132, 1).pass_state_segments, 1);  // 1 allowed
        EXPECT_TRUE(c.pass_state_stages == 2 || c.pass_state_stages == 4);
        EXPECT_GE(c.compute_out_heads_per_cta, 1);
        EXPECT_LE(c.compute_out_heads_per_cta, std::min<int64_t>(h, p == 64 ? 4 : 2));
        EXPECT_EQ(c.compute_out_heads_per_cta & (c.compute_out_heads_per_cta - 1), 0);
      }
}

// Walk segments allowed: the mean chunks per walk, 1 to 16 (varlen: nchunks bounds all
// sequences' chunks together).
TEST(TuningHeuristic, WalkSegmentsAllowed) {
  ProblemShape s;
  s.nchunks = 512;
  EXPECT_EQ(detail::max_walk_segments(s, false), 16);
  s.nchunks = 16;
  EXPECT_EQ(detail::max_walk_segments(s, false), 16);
  s.nchunks = 7;
  EXPECT_EQ(detail::max_walk_segments(s, false), 7);
  s.nchunks = 1;
  EXPECT_EQ(detail::max_walk_segments(s, false), 1);
  s.nchunks = 60;
  s.nseq = 3;
  EXPECT_EQ(detail::max_walk_segments(s, true), 16);
  s.nchunks = 26;
  s.nseq = 9;
  EXPECT_EQ(detail::max_walk_segments(s, true), 2);
  s.nchunks = 8;
  s.nseq = 9;
  EXPECT_EQ(detail::max_walk_segments(s, true), 1);
  // The shapes of the GPU test Gpu.WalkSegments still split (else that test would check
  // nothing about segments): batched chunk counts and the segments each one asks for.
  const int64_t batched[][2] = {{33, 2}, {47, 3}, {40, 5}, {11, 2}, {128, 16}};
  for (const auto& bc : batched) {
    ProblemShape b;
    b.nchunks = bc[0];
    EXPECT_GE(detail::max_walk_segments(b, false), bc[1]) << bc[0] << " chunks";
  }
  // Its varlen case {3000, 0, 700} tokens in 64-token chunks: 60 chunks at most.
  ProblemShape v;
  v.nseq = 3;
  v.nchunks = max_varlen_chunks(3700, 3, 64);
  EXPECT_EQ(v.nchunks, 60);
  EXPECT_GE(detail::max_walk_segments(v, true), 4);
}

// fused_walk's segment sums: 128-column tiles where the 64-column CTAs would exceed one wave of
// three per SM (v17 A/B on the H200); within one wave the most parts per segment that keep it
// one (up to 8 sums per walk and head), the tile with the shorter chain, 128 columns for equal
// chains of 64 chunks and more above dstate 128 (v32); headdim 64 and 128-token chunks only.
TEST(TuningHeuristic, SegmentSumsPlan) {
  auto plan = [](int64_t headdim, int64_t dstate, int64_t chunk, int64_t walk_heads, int nseg, int64_t seg_chunks,
                 bool splittable, int max_split) {
    const detail::SegmentSums s =
        detail::segment_sums_plan(headdim, dstate, chunk, walk_heads, nseg, seg_chunks, splittable, max_split, 132);
    return std::pair<int, int>(s.tile, s.split);
  };
  using P = std::pair<int, int>;
  // More than a wave of 64-column CTAs: 128 columns, one part.
  EXPECT_EQ(plan(64, 128, 128, 32, 8, 16, true, 2), P(128, 1));    // 448 CTAs of 64 columns, 224 of 128
  EXPECT_EQ(plan(64, 128, 128, 32, 16, 32, true, 1), P(128, 1));   // 960
  EXPECT_EQ(plan(64, 256, 128, 8, 16, 32, true, 1), P(128, 1));    // 480
  EXPECT_EQ(plan(64, 64, 128, 320, 16, 8, true, 1), P(64, 1));     // dstate 64: one tile either way
  // Within one wave: parts (anchor dstate 128 at 16K in 4 segments: 192 CTAs, 2 parts; dstate 512
  // at 16K in 2: 128 CTAs of 128 columns, 2 parts; 8 walks x heads in 2 segments: 4 parts, the
  // most; in 4: 2, the 8 sums), not where the segments cannot split.
  EXPECT_EQ(plan(64, 128, 128, 32, 4, 32, true, 5), P(64, 2));
  EXPECT_EQ(plan(64, 128, 128, 32, 4, 32, false, 5), P(64, 1));
  EXPECT_EQ(plan(64, 512, 128, 32, 2, 64, true, 15), P(128, 2));
  EXPECT_EQ(plan(64, 64, 128, 8, 2, 10, true, 15), P(64, 4));
  EXPECT_EQ(plan(64, 64, 128, 8, 4, 10, true, 5), P(64, 2));
  EXPECT_EQ(plan(64, 128, 128, 10, 13, 10, true, 1), P(64, 1));   // 1 x 10 heads x 16K: 12 sums
  // chains of up to 4 chunks stay whole; a short first segment splits (the 2.7B layer on 1 row:
  // first segments of 20 and 4 chunks at 8K and 2K, v36)
  EXPECT_EQ(plan(64, 128, 128, 2, 2, 4, true, 15), P(64, 1));
  EXPECT_EQ(plan(64, 128, 128, 80, 2, 20, true, 15), P(128, 3));
  EXPECT_EQ(plan(64, 128, 128, 80, 2, 4, true, 15), P(64, 1));
  EXPECT_EQ(plan(64, 128, 128, 32, 4, 32, true, 1), P(64, 1));     // the workspace's sums
  // Equal chains: 128 columns from 64 chunks above dstate 128 (anchor dstate 256 at 64K / 16K in
  // 4 segments; 1 row x 20 heads at dstate 128 and 64K in 6).
  EXPECT_EQ(plan(64, 256, 128, 32, 4, 128, true, 5), P(128, 1));
  EXPECT_EQ(plan(64, 256, 128, 32, 4, 32, true, 5), P(64, 1));
  EXPECT_EQ(plan(64, 128, 128, 20, 6, 86, true, 3), P(64, 1));
  // No sums plan but 64 columns in one part.
  EXPECT_EQ(plan(64, 128, 64, 320, 16, 8, true, 1), P(64, 1));     // chunks of 64
  EXPECT_EQ(plan(128, 128, 128, 32, 4, 32, true, 5), P(64, 1));    // headdim 128
  EXPECT_EQ(plan(64, 128, 128, 320, 1, 8, true, 1), P(64, 1));     // no segments
}

// fused_walk takes headdim 64 with dstate up to 128 and chunks of 64 or 128 tokens, or dstate up
// to 512 and chunks of 128; the dispatcher runs the two kernels for anything else even when
// fused_walk = 2 is asked for, so this pins that the GPU test Gpu.FusedWalk's shapes really take
// fused_walk (else it would check nothing about it) and that the others do not.
// fused_walk's three CTAs per SM at dstate 64: where they take fewer waves than two per SM.
TEST(TuningHeuristic, FusedWalkThreePerSm) {
  using detail::fused_walk_three_per_sm;
  EXPECT_TRUE(fused_walk_three_per_sm(64, 384, 132));    // 1 wave against 2
  EXPECT_TRUE(fused_walk_three_per_sm(32, 300, 132));    // dstate under 64 too
  EXPECT_FALSE(fused_walk_three_per_sm(64, 264, 132));   // one wave of two per SM
  EXPECT_FALSE(fused_walk_three_per_sm(64, 512, 132));   // 2 waves either way
  EXPECT_FALSE(fused_walk_three_per_sm(64, 128, 132));   // under one per SM
  EXPECT_FALSE(fused_walk_three_per_sm(128, 384, 132));  // dstate 128: two per SM only
}

// Its kernel: the specialised one wherever the call fits it; else two warpgroups per CTA where all
// CTAs fit one per SM (dstate 65-128, chunks of 128).
TEST(TuningHeuristic, FusedWalkVariant) {
  using detail::fused_walk_variant;
  using V = kernels::FusedWalkVariant;
  EXPECT_EQ(fused_walk_variant(128, 128, 128, 132, true), V::kSpecialized);  // anchor 1K, 4 segments
  EXPECT_EQ(fused_walk_variant(128, 128, 256, 132, true), V::kSpecialized);  // anchor 64K, 8 segments
  EXPECT_EQ(fused_walk_variant(128, 128, 128, 132, false), V::kTwoWarpgroups);  // (seq_idx, z, ...)
  EXPECT_EQ(fused_walk_variant(80, 128, 132, 132, false), V::kTwoWarpgroups);
  EXPECT_EQ(fused_walk_variant(64, 128, 128, 132, false), V::kOneWarpgroup);  // (columns past dstate)
  EXPECT_EQ(fused_walk_variant(128, 128, 133, 132, false), V::kOneWarpgroup);
  EXPECT_EQ(fused_walk_variant(64, 128, 384, 132, false), V::kThreePerSm);
  EXPECT_EQ(fused_walk_variant(64, 64, 128, 132, false), V::kOneWarpgroup);   // chunks of 64
  EXPECT_EQ(fused_walk_variant(256, 128, 128, 132, false), V::kOneWarpgroup);  // (dstate 256: its own kernel)
}

// The short first of two segments (specialised kernel, walks x heads on more than half of the
// SMs but not all): the long segment's CTAs once, the short ones in `rounds` beside them.
TEST(TuningHeuristic, FirstSegmentChunks) {
  using detail::first_segment_chunks;
  // 80 of 132 SMs: the 28 short CTAs that do not fit beside the 80 long ones run a second round
  EXPECT_EQ(first_segment_chunks(80, 16, 132, true).first, 4);
  EXPECT_EQ(first_segment_chunks(80, 16, 132, true).rounds, 2);
  EXPECT_EQ(first_segment_chunks(80, 64, 132, true).first, 20);
  EXPECT_EQ(first_segment_chunks(80, 512, 132, true).first, 169);
  EXPECT_EQ(first_segment_chunks(100, 24, 132, true).first, 2);  // 4 rounds on 32 SMs
  EXPECT_EQ(first_segment_chunks(80, 2, 132, true).first, 1);
  // elsewhere the even split: all CTAs in one wave (66 or fewer), the long ones alone filling
  // it (132 or more), or not the specialised kernel
  EXPECT_EQ(first_segment_chunks(66, 64, 132, true).first, 32);
  EXPECT_EQ(first_segment_chunks(66, 64, 132, true).rounds, 1);  // (fused_walk_plan's test of the regime)
  EXPECT_EQ(first_segment_chunks(132, 64, 132, true).rounds, 1);
  EXPECT_EQ(first_segment_chunks(67, 64, 132, true).rounds, 2);
  EXPECT_EQ(first_segment_chunks(132, 64, 132, true).first, 32);
  EXPECT_EQ(first_segment_chunks(80, 63, 132, false).first, 32);
  for (int64_t heads = 67; heads < 132; ++heads) {
    for (int64_t chunks = 2; chunks <= 600; chunks += 7) {
      const auto f = first_segment_chunks(heads, chunks, 132, true);
      ASSERT_GE(f.first, 1);
      ASSERT_LE(f.first, chunks - f.first) << heads << " heads, " << chunks << " chunks";
    }
  }
}

// The split whose long segment walks the short one's chunks first (prewalk): short walks with
// two rounds of short CTAs only, lengths 2 chunks / 5.
TEST(TuningHeuristic, PrewalkFirstSegment) {
  using detail::prewalk_first_segment;
  EXPECT_EQ(prewalk_first_segment(80, 16, 132, true), 6);  // 2.7B layer, 1 x 2K: 6 + 10
  EXPECT_EQ(prewalk_first_segment(70, 16, 132, true), 6);
  EXPECT_EQ(prewalk_first_segment(80, 32, 132, true), 12);
  EXPECT_EQ(prewalk_first_segment(80, 31, 132, true), 12);
  EXPECT_EQ(prewalk_first_segment(80, 33, 132, true), 0);   // the sums from 33 chunks
  EXPECT_EQ(prewalk_first_segment(70, 40, 132, true), 0);
  EXPECT_EQ(prewalk_first_segment(80, 64, 132, true), 0);
  EXPECT_EQ(prewalk_first_segment(100, 24, 132, true), 0);  // 4 rounds: not measured
  EXPECT_EQ(prewalk_first_segment(66, 16, 132, true), 0);   // one wave of both segments
  EXPECT_EQ(prewalk_first_segment(160, 16, 132, true), 0);  // beyond a wave
  EXPECT_EQ(prewalk_first_segment(80, 16, 132, false), 0);
  EXPECT_EQ(prewalk_first_segment(80, 2, 132, true), 0);    // no first segment shorter than the rest
  for (int64_t heads = 67; heads < 132; ++heads) {
    for (int64_t chunks = 2; chunks <= 40; ++chunks) {
      const int64_t f = prewalk_first_segment(heads, chunks, 132, true);
      if (f != 0) ASSERT_LT(f, chunks - f) << heads << " heads, " << chunks << " chunks";
    }
  }
}

// The long-first schedule of two segments beyond a wave (long_first_makespan) against the
// schedule itself, each CTA to the SM that frees first; the first segment's length and where it
// runs (multi_wave_first_segment, multi_wave_split) on the calls it was measured on.
TEST(TuningHeuristic, MultiWaveFirstSegment) {
  using detail::long_first_makespan;
  auto simulate = [](int64_t ctas, int64_t sm, int64_t lg, int64_t sh) {
    std::vector<int64_t> free_at(static_cast<size_t>(sm), 0);
    int64_t end = 0;
    for (int64_t i = 0; i < 2 * ctas; ++i) {
      auto it = std::min_element(free_at.begin(), free_at.end());
      *it += i < ctas ? lg : sh;
      end = std::max(end, *it);
    }
    return end;
  };
  for (int64_t ctas : {1, 5, 131, 132, 133, 160, 240, 264, 320, 500, 640}) {
    for (int64_t chunks : {3, 4, 16, 33, 64, 200}) {
      for (int64_t first = 1; first < chunks - first; first += 1 + first / 3) {
        ASSERT_EQ(long_first_makespan(ctas, 132, chunks - first + 4, first + 4),
                  simulate(ctas, 132, chunks - first + 4, first + 4))
            << ctas << " CTAs, " << chunks << " chunks, first " << first;
      }
    }
  }
  using detail::multi_wave_first_segment;
  auto runs = [](int64_t ctas, int64_t chunks, int64_t dstate, bool batched) {
    return detail::multi_wave_split(ctas, chunks, dstate, 1, batched, 132).first > 0;
  };
  // the 2.7B layer (80 heads, dstate 128): the measured best length or next to it
  EXPECT_EQ(multi_wave_first_segment(320, 64, 132).first, 8);    // 4 x 8K (8: 457.2 us, 12: 466.4)
  EXPECT_EQ(multi_wave_first_segment(160, 64, 132).first, 20);   // 2 x 8K (20: 258.1, 16: 272.1)
  EXPECT_EQ(multi_wave_first_segment(160, 32, 132).first, 9);    // 2 x 4K (10: 135.5, 8: 143.0)
  EXPECT_TRUE(runs(320, 64, 128, true));
  EXPECT_EQ(detail::multi_wave_split(320, 64, 128, 1, true, 132).first, 8);  // (the length above)
  EXPECT_TRUE(runs(320, 128, 128, true));  // 4 x 16K
  EXPECT_TRUE(runs(160, 32, 128, true));
  EXPECT_FALSE(runs(240, 64, 128, true));   // 3 x 8K
  EXPECT_FALSE(runs(320, 16, 128, true));   // 4 x 2K
  EXPECT_FALSE(runs(640, 32, 128, true));   // 8 x 4K
  EXPECT_FALSE(runs(264, 64, 128, true));   // two full waves
  EXPECT_FALSE(runs(80, 64, 128, true));    // within a wave: first_segment_chunks
  EXPECT_FALSE(runs(320, 64, 64, true));    // (dstate 64: not measured)
  EXPECT_FALSE(runs(320, 64, 128, false));  // (varlen)
  for (int64_t ctas = 132; ctas < 1400; ctas += 37) {
    for (int64_t chunks = 1; chunks <= 600; chunks += 13) {
      const auto f = multi_wave_first_segment(ctas, chunks, 132);
      ASSERT_GE(f.first, 1);
      if (f.ratio < 1.0) ASSERT_LT(f.first, chunks - f.first) << ctas << " CTAs, " << chunks << " chunks";
    }
  }
}

TEST(TuningHeuristic, SumsTakeCumsum) {
  using detail::sums_take_cumsum;
  EXPECT_TRUE(sums_take_cumsum(4, 2));    // anchor 1K: 4 segments of 2 chunks
  EXPECT_TRUE(sums_take_cumsum(2, 4));    // the longest segments that take it
  EXPECT_FALSE(sums_take_cumsum(2, 5));
  EXPECT_FALSE(sums_take_cumsum(1, 8));   // no segments: no sums
  EXPECT_FALSE(sums_take_cumsum(8, 64));  // anchor 64K
}

TEST(TuningHeuristic, FusedWalkApplies) {
  auto shape = [](int64_t p, int64_t n, int64_t q) {
    ProblemShape s;
    s.headdim = p; s.dstate = n; s.chunk_size = q;
    return s;
  };
  const int64_t fused_test[][2] = {{128, 128}, {64, 64}, {64, 128}, {128, 16}, {128, 80}, {64, 32}, {128, 64}};
  for (const auto& qn : fused_test) {
    EXPECT_TRUE(detail::fused_walk_applies(shape(64, qn[1], qn[0]))) << "chunk " << qn[0] << " dstate " << qn[1];
  }
  EXPECT_FALSE(detail::fused_walk_applies(shape(128, 128, 128)));  // headdim 128
  EXPECT_TRUE(detail::fused_walk_applies(shape(64, 144, 128)));    // dstate above 128: two warpgroups
  EXPECT_TRUE(detail::fused_walk_applies(shape(64, 256, 128)));
  EXPECT_FALSE(detail::fused_walk_applies(shape(64, 256, 64)));    // ... in chunks of 128 only
  EXPECT_TRUE(detail::fused_walk_applies(shape(64, 320, 128)));    // above 256: two CTAs per walk
  EXPECT_TRUE(detail::fused_walk_applies(shape(64, 512, 128)));
  EXPECT_FALSE(detail::fused_walk_applies(shape(64, 512, 64)));
  EXPECT_FALSE(detail::fused_walk_applies(shape(64, 128, 256)));   // chunk 256
}

// Chunks of 256 tokens run as two of 128 unless an output depends on where the chunks end.
TEST(TuningHeuristic, KernelChunkSize) {
  auto chunk = [](ProblemConfig c) {
    Problem prob(c);
    return detail::kernel_chunk_size(prob.params(Device::kCPU));
  };
  ProblemConfig c = small_config();
  c.chunk_size = 256;
  c.seqlen = 600;
  c.has_z = true;
  c.want_final_states = true;
  c.seq_starts = {{100, 300}};
  EXPECT_EQ(chunk(c), 128);
  c.want_chunk_states = true;
  EXPECT_EQ(chunk(c), 256);
  c.want_chunk_states = false;
  c.batch = 1;
  c.seqlens = {100, 200, 300};
  EXPECT_EQ(chunk(c), 128);  // cu_seqlens alone does not change what is returned
  c.want_varlen_states = true;
  EXPECT_EQ(chunk(c), 256);  // mamba_ssm's varlen_states start from the chunk a sequence ends in
  ProblemConfig v = small_config();
  v.layout = Layout::kVarlen;
  v.chunk_size = 256;
  v.seqlens = {100, 0, 700};
  v.want_final_states = true;
  EXPECT_EQ(chunk(v), 128);
  v.want_chunk_states = true;
  EXPECT_EQ(chunk(v), 256);
  v.want_chunk_offsets = true;
  EXPECT_EQ(chunk(v), 256);
  for (int64_t q : {64, 128}) {
    ProblemConfig s = small_config();
    s.chunk_size = q;
    EXPECT_EQ(chunk(s), q);
  }
}

// The heuristic reproduces the tuner's H200 picks on the benchmark's shapes (tuning.hpp).
TEST(TuningHeuristic, PicksOfTheH200Run) {
  auto shape = [](int64_t b, int64_t l, int64_t h, int64_t g, int64_t n, int64_t q = 128) {
    ProblemShape s;
    s.batch = b; s.seqlen = l; s.nheads = h; s.ngroups = g; s.headdim = 64; s.dstate = n;
    s.chunk_size = q;
    s.nchunks = (l + q - 1) / q;
    return s;
  };
  auto pick = [](const ProblemShape& s, int64_t walks) {
    return detail::heuristic_config(s, walks, true, 132, detail::max_walk_segments(s, false));
  };
  // anchor (4 rows, 8 heads): dstate 128 fused (the specialised kernel, one CTA per SM) in 4
  // segments at 64K since the sums split into parts (415.7 us, their sums in 2 parts; 423.2 in 8;
  // H200 2026-12-01 v33), 4 at 16K and 4K (136 / 44.3 us; 141 / 53.6 in 8; v24); else 32-column
  // tiles up to dstate 128, 64 from 256 on
  EXPECT_EQ(pick(shape(4, 65536, 8, 1, 128), 4), (KernelConfig{32, 2, 2, 4, 2, 1}));
  EXPECT_EQ(pick(shape(4, 16384, 8, 1, 128), 4), (KernelConfig{32, 2, 2, 4, 2, 1}));
  EXPECT_EQ(pick(shape(4, 4096, 8, 1, 128), 4), (KernelConfig{32, 2, 2, 4, 2, 1}));
  EXPECT_EQ(pick(shape(4, 2048, 8, 1, 128), 4).fused_walk, 2);
  // dstate 512: fused (two CTAs per walk) in 2 segments (128 CTAs; the fastest of 1-16 at 1K to
  // 64K tokens, 2026-11-30 v17; of 1, 2 and 4 at 4K-64K for the specialised kernel on two ranks,
  // v39); dstate 384: the cluster kernel's two kernels over 64 chunks per walk (fused costs what
  // it does at 512: 458 us against 445 at 4 x 16K), fused under them (16 x 2K: 211 against 253,
  // v27)
  EXPECT_EQ(pick(shape(4, 65536, 8, 1, 512), 4), (KernelConfig{64, 2, 2, 2, 2, 1}));
  EXPECT_EQ(pick(shape(4, 1024, 8, 1, 512), 4).pass_state_segments, 2);
  EXPECT_EQ(pick(shape(1, 16384, 8, 1, 512), 1).pass_state_segments, 8);  // 156 us; 182 two kernels
  EXPECT_EQ(pick(shape(2, 8192, 32, 1, 512), 2).pass_state_segments, 1);  // 425 us; 571 two kernels
  // (with seq_idx, z or an fp32 output, the cluster kernel; the specialised kernel on two ranks
  // beats the two kernels there too: dstate 384 at 4 x 16K 355 against 443 us, v39)
  auto pick_other = [](const ProblemShape& s, int64_t walks) {
    return detail::heuristic_config(s, walks, false, 132, detail::max_walk_segments(s, false));
  };
  EXPECT_EQ(pick_other(shape(4, 16384, 8, 1, 384), 4).fused_walk, 1);
  EXPECT_EQ(pick_other(shape(4, 8192, 8, 1, 384), 4).fused_walk, 1);
  EXPECT_EQ(pick(shape(4, 16384, 8, 1, 384), 4).fused_walk, 2);
  EXPECT_EQ(pick(shape(4, 65536, 8, 1, 320), 4).fused_walk, 2);
  EXPECT_EQ(pick(shape(4, 4096, 8, 1, 448), 4).fused_walk, 2);  // 130 us; 144 two kernels (v27)
  EXPECT_EQ(pick(shape(4, 4096, 8, 1, 320), 4).fused_walk, 2);  // 129 us; 137 two kernels (v27)
  EXPECT_EQ(pick(shape(16, 2048, 8, 1, 384), 16).fused_walk, 2);
  // dstate 256: fused (two warpgroups, one CTA per SM) at any length (16 x 512 tokens: 34.6 us
  // against 70.4, v27), in 4 segments for 4 rows (128 CTAs; the fastest of 1-16 at 4K, 16K and
  // 64K on the H200, 2026-11-30 v16)
  EXPECT_EQ(pick(shape(4, 65536, 8, 1, 256), 4), (KernelConfig{64, 2, 2, 4, 2, 1}));
  EXPECT_EQ(pick(shape(4, 16384, 8, 1, 256), 4), (KernelConfig{64, 2, 2, 4, 2, 1}));
  EXPECT_EQ(pick(shape(4, 4096, 8, 1, 256), 4), (KernelConfig{64, 2, 2, 4, 2, 1}));
  EXPECT_EQ(pick(shape(4, 1024, 8, 1, 256), 4).fused_walk, 2);
  EXPECT_EQ(pick(shape(4, 896, 8, 1, 256), 4).fused_walk, 2);
  EXPECT_EQ(pick(shape(16, 512, 8, 1, 256), 16), (KernelConfig{64, 2, 2, 1, 2, 1}));
  EXPECT_EQ(pick(shape(1, 16384, 8, 1, 256), 1), (KernelConfig{32, 2, 2, 16, 2, 1}));  // 83.8 us; 168 two kernels
  // dstate 64 with 128-token chunks: one head per compute_out CTA. Fused, the specialised kernel:
  // from 16K tokens two heads per CTA in 8 segments (128 CTAs, one wave; 64K 303.3 us against
  // 344.4 with one head in 4, 256K 1.192 ms against 1.335, 16K 94.1 against 99.0), below one head
  // in 4 (4K 31.6 us against 34.0 with two in 8, 1K 14.4 against 18.1; H200 2026-12-01 v34)
  EXPECT_EQ(pick(shape(4, 65536, 8, 1, 64), 4), (KernelConfig{32, 2, 1, 8, 2, 2}));
  EXPECT_EQ(pick(shape(4, 262144, 8, 1, 64), 4), (KernelConfig{32, 2, 1, 8, 2, 2}));
  EXPECT_EQ(pick(shape(4, 16384, 8, 1, 64), 4), (KernelConfig{32, 2, 1, 8, 2, 2}));
  EXPECT_EQ(pick(shape(4, 4096, 8, 1, 64), 4), (KernelConfig{32, 2, 1, 4, 2, 1}));
  // short walks, few of them (32 or 64 tiles of 64 columns): fused, in the model's segments (1K
  // tokens: 4 for dstate 64, the specialised kernel, v33 above, and 4 for dstate 128, where 8 of
  // one warpgroup took 23.7 us against 21.0, H200 2026-11-30 v22); under 8 chunks too (4 x 768
  // tokens: 17.4 us against 23.3 in the two kernels, v27)
  EXPECT_EQ(pick(shape(4, 1024, 8, 1, 64), 4), (KernelConfig{32, 2, 1, 4, 2, 1}));
  EXPECT_EQ(pick(shape(4, 1024, 8, 1, 128), 4), (KernelConfig{32, 2, 1, 4, 2, 1}));
  EXPECT_EQ(pick(shape(4, 896, 8, 1, 64), 4).fused_walk, 2);
  EXPECT_EQ(pick(shape(4, 768, 8, 1, 128), 4).fused_walk, 2);
  // many short walks: fused (v27: 64 x 1K dstate 64, 97 us against 191; 64 x 256 tokens dstate
  // 128, 47.5 against 83.1)
  EXPECT_EQ(pick(shape(64, 1024, 8, 1, 64), 64).fused_walk, 2);
  EXPECT_EQ(pick(shape(64, 256, 8, 1, 128), 64), (KernelConfig{64, 2, 2, 1, 2, 1}));
  // a short sequence in the two kernels (chunks of 256 with the chunk states returned): one head
  // per compute_out CTA (two would be under one wave)
  EXPECT_EQ(pick(shape(4, 1024, 8, 1, 128, 256), 4), (KernelConfig{32, 2, 1, 1, 1, 1}));
  // the 2.7B layer and the 8-group layer (chunks of 256, run as 128): fused, for 4 rows x 80
  // heads (2.4 waves) 2 segments, the first short and launched last (multi_wave_first_segment:
  // 457.2 us against 476.5 in 1, H200 2026-12-01 v36; even, 499.5 in 2 against 473.8 in 1, v33),
  // 1 for 8 rows x 80 (4.8 waves, 410.0 us; 446.9 and more in 2), and for 8 rows x 64 heads one
  // segment, two heads per CTA (225.2 us against 278.6 with one, v34)
  EXPECT_EQ(pick(shape(4, 8192, 80, 1, 128), 4), (KernelConfig{64, 2, 2, 2, 2, 1}));
  EXPECT_EQ(pick(shape(8, 4096, 80, 1, 128), 8).pass_state_segments, 1);
  EXPECT_EQ(pick(shape(8, 4096, 64, 8, 64), 8), (KernelConfig{64, 2, 1, 1, 2, 2}));
  // an odd number of heads per group: one head per CTA
  EXPECT_EQ(pick(shape(8, 4096, 24, 8, 64), 8).fused_walk_heads_per_cta, 1);
  // 1 row x 80 heads (80 of 132 SMs): two segments with a short first one (first_segment_chunks;
  // 1 x 2K 44.1 us against 44.8 in one, 1 x 8K 141 against 150 in three, 1 x 64K 1.04 ms against
  // 1.11 in eight; H200 2026-12-01 v31); on short walks the long segment walking the short one's
  // chunks itself (prewalk_first_segment), down to 4 chunks (1 x 1K 23.7 us against 25.6 in one,
  // 1 x 512 15.1 against 16.2; with the sums 28.6 and 18.3: v37)
  EXPECT_EQ(pick(shape(1, 2048, 80, 1, 128), 1), (KernelConfig{64, 2, 2, 2, 2, 1}));
  EXPECT_EQ(pick(shape(1, 1024, 80, 1, 128), 1).pass_state_segments, 2);
  EXPECT_EQ(pick(shape(1, 512, 80, 1, 128), 1).pass_state_segments, 2);
  EXPECT_EQ(pick(shape(1, 256, 80, 1, 128), 1).pass_state_segments, 1);  // (2 chunks: no pre-walk)
  EXPECT_EQ(pick(shape(1, 2048, 96, 1, 128), 1).pass_state_segments, 1);  // 46.3 us; 48.4 in two
  EXPECT_EQ(pick(shape(8, 2048, 80, 1, 128), 8).fused_walk, 2);  // 213 us; 471 two kernels (v27)
  EXPECT_EQ(pick(shape(64, 128, 80, 1, 128), 64).fused_walk, 2);  // 188 us; 239 two kernels (v27)
  EXPECT_EQ(pick(shape(1, 8192, 80, 1, 128), 1).pass_state_segments, 2);
  EXPECT_EQ(pick(shape(1, 65536, 80, 1, 128), 1).pass_state_segments, 2);
  EXPECT_EQ(pick(shape(1, 8192, 70, 1, 128), 1).pass_state_segments, 2);  // 138 us; 153 in five
  EXPECT_EQ(pick(shape(8, 4096, 80, 1, 128), 8).pass_state_segments, 1);  // 451 us; 548 in 2 (v24)
  // chunks of 256 (when the chunk states are returned): not fused
  EXPECT_EQ(pick(shape(4, 8192, 80, 1, 128, 256), 4), (KernelConfig{64, 2, 2, 1, 1, 1}));
  // few walks: 64-column tiles in segments (16 CTAs -> 16 segments; 20 -> 13; 2 rows of dstate
  // 64 -> 16), at least 8 chunks each (16K tokens in 256-token chunks: 8 segments), at least 4
  EXPECT_EQ(pick(shape(1, 65536, 8, 1, 128), 1).pass_state_segments, 16);
  EXPECT_EQ(pick(shape(1, 65536, 10, 1, 128, 256), 1), (KernelConfig{64, 2, 2, 13, 1, 1}));
  EXPECT_EQ(pick(shape(1, 65536, 10, 1, 128), 1), (KernelConfig{64, 2, 2, 13, 2, 1}));  // 272 us; 281 in 16
  EXPECT_EQ(pick(shape(1, 65536, 20, 1, 128), 1).pass_state_segments, 13);  // 410 us; 544 in 16
  EXPECT_EQ(pick(shape(1, 16384, 20, 1, 128), 1).pass_state_segments, 13);
  EXPECT_EQ(pick(shape(1, 65536, 8, 1, 128), 1).fused_walk, 2);
  EXPECT_EQ(pick(shape(2, 65536, 8, 1, 64), 2).pass_state_segments, 16);
  EXPECT_EQ(pick(shape(1, 16384, 10, 1, 128, 256), 1).pass_state_segments, 8);
  // 16 chunks: fused, 16 of one chunk (20.2 us against 21.3 in 8; dstate 64: 17.0 against 19.6)
  EXPECT_EQ(pick(shape(1, 2048, 8, 1, 128), 1), (KernelConfig{32, 2, 1, 16, 2, 1}));
}

// With seq_idx, z or an fp32 output (or the varlen layout) the specialised kernel does not run,
// and the segments are counted for the kernel that does (seq_idx, 3 sequences per row, forced
// segments on the H200, v29: anchor dstate 128 16K 165 us in 8 against 200 in 4, 4K 55.3 against
// 59.8, 2.7B 4 x 8K 723 against 800 in 2; 64K 603 in 16 against 586 in 8).
TEST(TuningHeuristic, SegmentsOfTheKernelThatRuns) {
  auto shape = [](int64_t b, int64_t l, int64_t h) {
    ProblemShape s;
    s.batch = b; s.seqlen = l; s.nheads = h; s.ngroups = 1; s.headdim = 64; s.dstate = 128;
    s.chunk_size = 128; s.nchunks = (l + 127) / 128;
    return s;
  };
  auto segments = [](const ProblemShape& s, int64_t walks, bool specialized_options) {
    const KernelConfig c =
        detail::heuristic_config(s, walks, specialized_options, 132, detail::max_walk_segments(s, false));
    EXPECT_EQ(c.fused_walk, 2);
    return c.pass_state_segments;
  };
  // (64K since the sums split into parts, v33: 4 segments of the specialised kernel, 8 of the
  // others, with seq_idx 590.7 us against 608.1 in 16)
  EXPECT_EQ(segments(shape(4, 65536, 8), 4, true), 4);
  EXPECT_EQ(segments(shape(4, 65536, 8), 4, false), 8);
  EXPECT_EQ(segments(shape(4, 16384, 8), 4, true), 4);
  EXPECT_EQ(segments(shape(4, 16384, 8), 4, false), 8);
  EXPECT_EQ(segments(shape(4, 4096, 8), 4, false), 8);
  // (more than a wave: 2, the first short, where multi_wave_split runs; v36, 457.2 us against 476.5
  // in 1; 3 rows, 1.8 waves: 1, 323.0 us against 351.3 and more in 2)
  EXPECT_EQ(segments(shape(4, 8192, 80), 4, true), 2);
  EXPECT_EQ(segments(shape(3, 8192, 80), 3, true), 1);
  EXPECT_EQ(segments(shape(4, 8192, 80), 4, false), 4);
  // the two-warpgroup kernel (CTAs within one per SM) against one-warpgroup CTAs two per SM, with
  // seq_idx (8 sequences in 1 row; H200, 2026-11-30 v30): 10 heads x 16 chunks in 8 segments of two
  // chunks (80 CTAs; 21.4 us) rather than 16 of one (24.9 us); 12 heads x 512 chunks in 11 (283.7
  // us against 304.3 in 16); but 40 heads x 16 chunks in 6 of three (240 CTAs; 39.0 us) rather
  // than 3 (43.1 us; 42.2 with the sums in parts against 39.8 in 6, v33)
  EXPECT_EQ(segments(shape(1, 2048, 10), 1, false), 8);
  EXPECT_EQ(segments(shape(1, 65536, 12), 1, false), 11);
  EXPECT_EQ(segments(shape(1, 2048, 40), 1, false), 6);
}

// The specialised kernel at dstate 129-256 (block slots; H200, design log v38, forced segment
// counts of the anchor at dstate 256): 4 segments from 4K to 256K tokens, where 2 and 8 were
// slower; in segments of under 4 chunks the two-warpgroup kernel runs (1K: 26.0 us against 28.1),
// and the model prices those counts by it.
TEST(TuningHeuristic, SpecializedBlockSlots) {
  for (int64_t l : {4096, 16384, 65536, 262144}) {
    ProblemShape s;
    s.batch = 4; s.seqlen = l; s.nheads = 8; s.ngroups = 1; s.headdim = 64; s.dstate = 256;
    s.chunk_size = 128; s.nchunks = l / 128;
    const KernelConfig c = detail::heuristic_config(s, 4, true, 132, detail::max_walk_segments(s, false));
    EXPECT_EQ(c.fused_walk, 2) << l;
    EXPECT_EQ(c.pass_state_segments, 4) << l;
    EXPECT_TRUE(kernels::fused_walk_specialized_segment(256, s.nchunks / c.pass_state_segments)) << l;
  }
  EXPECT_FALSE(kernels::fused_walk_specialized_segment(256, 2));
  EXPECT_TRUE(kernels::fused_walk_specialized_segment(256, 4));
  EXPECT_TRUE(kernels::fused_walk_specialized_segment(128, 1));
  EXPECT_TRUE(kernels::fused_walk_specialized_shape(64, 256, 128));
  EXPECT_TRUE(kernels::fused_walk_specialized_shape(64, 512, 128));  // (two ranks)
  EXPECT_FALSE(kernels::fused_walk_specialized_shape(64, 576, 128));
  // (16 chunks in 8 segments of 2: the two-warpgroup kernel's price, as with no specialised
  // kernel; in 2 of 8 the block slots' lower one)
  const detail::FusedWalkCall ws{32, 16, 4, 128, 132, 16, true, true, 1};
  detail::FusedWalkCall other = ws;
  other.specialized = false;
  EXPECT_DOUBLE_EQ(detail::fused_walk_cost(ws, 8), detail::fused_walk_cost(other, 8));
  EXPECT_LT(detail::fused_walk_cost(ws, 2), detail::fused_walk_cost(other, 2));
  // no uneven split or pre-walk there (fitted at dstate 128 only)
  EXPECT_FALSE(kernels::fused_walk_specialized_uneven(256));
  EXPECT_TRUE(kernels::fused_walk_specialized_uneven(128));
}

TEST(TuningValidate, ExplicitSettingsAreChecked) {
  ProblemConfig c = small_config();
  Problem prob(c);
  ForwardParams p = prob.params(Device::kCPU);
  p.kernel_config = {32, 4, 4};
  EXPECT_NO_THROW(validate(p));
  auto expect_bad = [&](KernelConfig kc, const char* arg, const char* text) {
    ForwardParams q = p;
    q.kernel_config = kc;
    try {
      validate(q);
      ADD_FAILURE() << "no error for " << to_string(kc);
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), arg);
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_bad({48, 0, 0}, "kernel_config.pass_state_dstate_tile", "got 48");
  expect_bad({0, 3, 0}, "kernel_config.pass_state_stages", "got 3");
  expect_bad({0, 0, 3}, "kernel_config.compute_out_heads_per_cta", "got 3");
  expect_bad({0, 0, 0, 17}, "kernel_config.pass_state_segments", "1 to 16, got 17");
  expect_bad({0, 0, 0, -1}, "kernel_config.pass_state_segments", "got -1");
  expect_bad({0, 0, 0, 0, 3}, "kernel_config.fused_walk", "1 (two kernels) or 2 (fused), got 3");
  expect_bad({0, 0, 0, 0, 2, 3}, "kernel_config.fused_walk_heads_per_cta", "1 or 2 (heads per CTA");
  expect_bad({0, 0, 0, 0, 2, -1}, "kernel_config.fused_walk_heads_per_cta", "got -1");
  expect_bad({0, 0, 8}, "kernel_config.compute_out_heads_per_cta", "1, 2 or 4 for headdim 64");
  c.headdim = 128;
  Problem prob128(c);
  p = prob128.params(Device::kCPU);
  expect_bad({0, 0, 4}, "kernel_config.compute_out_heads_per_cta", "1 or 2 for headdim 128");
}

}  // namespace
}  // namespace mamba2_ssd::test
