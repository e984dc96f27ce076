// The heuristic kernel settings for a shape (used when the tuning cache has no entry) and the
// switch for tuning on a cache miss.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include "kernels/fused_walk_variant.hpp"
#include "mamba2_ssd/params.hpp"

namespace mamba2_ssd::detail {

// The chunk length the kernels run a call in: a 256-token chunk runs as two of 128 where nothing
// the call returns depends on where the chunks end (no chunk_states, no chunk_offsets, no batched
// varlen_states, which mamba_ssm defines from the chunk a sequence ends in). The chunked algorithm
// gives the same sums for any chunk length; the 16-bit chunk states are rounded at one more
// point per 256 tokens. On the H200 (2026-11-30) the 2.7B and 8-group layers' calls took 4-37%
// less time this way, with either kernel path (128-token chunks also let fused_walk run them).
inline int64_t kernel_chunk_size(const ForwardParams& p) {
  if (p.chunk_size != 256) return p.chunk_size;
  const bool chunk_bound = p.chunk_states.present() || p.chunk_offsets.present() ||
                           (p.layout == Layout::kBatched && p.varlen_states.present());
  return chunk_bound ? p.chunk_size : 128;
}

// fused_walk takes headdim 64 with dstate up to 128 and chunks of 64 or 128 tokens, or dstate up
// to 512 and chunks of 128 (two warpgroups, one per 64-token block; above dstate 256 two CTAs of
// a cluster per head walk, 256 state columns each; its state and shared memory:
// kernels::fused_walk_supported checks the same at launch).
inline bool fused_walk_applies(const ProblemShape& s) {
  if (s.headdim != 64) return false;
  if (s.dstate <= 128) return s.chunk_size == 64 || s.chunk_size == 128;
  return s.dstate <= 512 && s.chunk_size == 128;
}

// fused_walk's segment sums (kernels::launch_segment_sums): their column tile, 64 (three CTAs per
// SM) or 128 (two; headdim 64, chunks of 128), and the parts each summed segment is split into
// (SsdParams::sum_split; `splittable`: without chunk_cumsum's work, the batched layout; chains
// of more than kSumsCumsumMaxChunks chunks; at most max_split and 4 parts, and kMaxSplitSums sums
// per walk and head, which each walk combines at its start: 1 row x 10 heads x 16K in 13
// segments, 24 sums in 2 parts of 128 columns, took 0.7% longer, about half of it then the sums
// kernel's code, design log v32).
// - Where the 64-column CTAs would run in more than one wave: 128 columns, one part. One X tile
//   then serves twice the columns, a quarter less L2 traffic per step: the anchor dstate 128 at
//   16K / 64K tokens (448 / 960 CTAs of 64 columns) 7% / 5% faster (H200, 2026-11-30 v17).
// - Within one wave each sum CTA's chain of steps is the sums' time: the most parts that keep the
//   CTAs of either tile within one wave, the tile with the shorter chain. Anchor dstate 512 (128
//   columns in 2 parts) 4K / 16K / 64K 130.0 -> 125.5, 463.6 -> 439.0, 1,784 -> 1,668 us; dstate
//   128 (64 columns in 2 parts) 4K 41.3 -> 40.4, 16K 127.2 -> 118.6 us. Parts that take a second
//   wave were slower even with shorter chains (dstate 128 16K in 3 parts 130.2 us, 4K 45.1) (H200,
//   2026-12-01 v32).
// - Chains equally long: 128 columns above dstate 128 from 64 chunks per chain, else 64, the
//   shorter step (anchor dstate 256 at 64K / 256K tokens 839 -> 814 us / 3.435 -> 3.343 ms,
//   128-chunk and 512-chunk chains; at 4K 68.6 -> 70.0 us, 8 chunks; v17: dstate 128 at 1K +2%).
// - A short first segment (two segments, the first summed) splits too, since v36: the 2.7B layer
//   on 1 row, 80 heads, first segments of 9 / 20 / 169 chunks in 3 parts of 128 columns, 1 x 4K
//   76.7 -> 75.1 us, 1 x 8K 142.4 -> 133.2, 1 x 64K 1.043 -> 0.941 ms; 70 heads x 8K 141.7 ->
//   130.9. Its 4 chunks at 1 x 2K in 2 parts: 44.3 -> 44.5 us, so chains of up to
//   kSumsCumsumMaxChunks stay whole (even segments that short take chunk_cumsum's work, unsplit).
constexpr int64_t kMaxSplitSums = 8;
// Whether the sums may split their segments at all: the batched layout, without chunk_cumsum's
// work, headdim 64 and chunks of 128 (the launch's sums_splittable and the segment model's price
// both ask this).
inline bool sums_split_allowed(bool batched, bool sums_cumsum, int64_t headdim, int64_t chunk) {
  return batched && !sums_cumsum && headdim == 64 && chunk == 128;
}
struct SegmentSums {
  int tile;   // state columns per sum CTA
  int split;  // SsdParams::sum_split
};
inline SegmentSums segment_sums_plan(int64_t headdim, int64_t dstate, int64_t chunk, int64_t walk_heads, int nseg,
                                     int64_t seg_chunks, bool splittable, int max_split, int sm_count) {
  if (headdim != 64 || chunk != 128 || nseg < 2) return {64, 1};
  const int64_t sm = std::max(sm_count, 1), sums = walk_heads * (nseg - 1);
  const bool wide = dstate > 64;  // (at most 64 columns: one tile of 64 either way)
  const int64_t cap = splittable && seg_chunks > kernels::kSumsCumsumMaxChunks
                          ? std::clamp<int64_t>(std::min<int64_t>({max_split, seg_chunks, kMaxSplitSums / (nseg - 1)}), 1, 4)
                          : 1;
  // The most parts whose CTAs fit one wave (0: not even one part does).
  auto parts = [&](int64_t ctas, int64_t slots) { return ctas <= slots ? std::min(cap, slots / ctas) : int64_t{0}; };
  const int64_t r64 = parts(sums * ((dstate + 63) / 64), 3 * sm);
  const int64_t r128 = wide ? parts(sums * ((dstate + 127) / 128), 2 * sm) : 0;
  if (r64 == 0 && r128 == 0) return {wide ? 128 : 64, 1};
  auto chain = [&](int64_t r) {
    return r > 0 ? (seg_chunks + r - 1) / r : std::numeric_limits<int64_t>::max();
  };
  const int64_t l64 = chain(r64), l128 = chain(r128);
  if (l128 < l64 || (l128 == l64 && l128 >= 64 && dstate > 128)) return {128, static_cast<int>(r128)};
  return {64, static_cast<int>(r64)};
}

// Whether fused_walk's segment sums compute chunk_cumsum's outputs themselves, each sum CTA for its
// segment's chunks before its walk (SsdParams::sums_cumsum), so that the call has one kernel
// fewer on its chain: segments of up to kSumsCumsumMaxChunks chunks (design log v21: anchor at 1K
// tokens 3-7% faster; segments of 8-12 chunks were slower than chunk_cumsum, by up to 5%).
inline bool sums_take_cumsum(int nseg, int64_t seg_chunks) {
  return nseg > 1 && seg_chunks <= kernels::kSumsCumsumMaxChunks;
}

// fused_walk's segment count (fused_walk_plan) for walk_heads (walk, head) chains of `chunks` chunks with states of
// dstate_tiles 64-column tiles: the count with the least modelled time, in units of one chunk of a
// CTA that shares its SM with another (two fit per SM; dstate above 128: one CTA of two
// warpgroups per SM, its chunk counted as one such unit; above 256: two such CTAs per walk).
// - fused_walk: its CTAs run in waves of ctas_per_sm x sm_count, each wave costing its segment
//   length plus one chunk of start-up; where two fit per SM but all CTAs fit one per SM they run
//   alone, 1.5x faster (anchor dstate 128, 64K tokens: 987 us with one CTA per SM, 749 with two).
//   At dstate 65-128 in chunks of 128 those run two warpgroups per CTA (fused_walk_variant): 0.64
//   per chunk and half a chunk of start-up, fitted to forced counts on 37 calls with seq_idx, z,
//   dstate 64-512 (H200, 2026-11-30 v30: 1 row x 10 heads x 16 chunks with seq_idx in 8 segments,
//   21.4 us, not 16 of one warpgroup, 24.9; 40 heads in 6, 39.0 us, not 3, 43.1).
//   The split costed is the one that runs: segments of ceil(chunks / count) chunks.
// - The segment sums run first (every segment but the last) as segment_sums_plan runs them
//   (`splittable_sums`: a batched call; parts where the segments are even and the sums do not
//   take chunk_cumsum's work): waves of their CTAs (three per SM of 64 columns, two of 128) at
//   0.15 per chunk of a part, and 0.15 per part beyond the first. Their waves matter: the sums of
//   the anchor dstate 128 at 64K took 199 us in 8 segments (448 CTAs, two waves of 64 chunks) and
//   150 us in 16 (960 CTAs, three waves of 32) (ncu, 2026-11-30). Priced unsplit until v32, the
//   model took twice the segments that run fastest where parts shorten the sums' chain (anchor
//   dstate 128 at 64K: 8 segments, 423.2 us, against 4, 415.7 with the sums in 2 parts; at 256K
//   12 against 4; dstate 64, the specialised kernel, at 64K 8, 352.7, against 4, 343.6); without
//   the start per part, 1 row x 40 heads x 16 chunks with seq_idx in 3 segments, 42.2 us, rather
//   than 6, 39.8 (H200, v33).
// - dstate 64 also has a variant of three CTAs per SM, run where its waves are fewer than two per
//   SM would take (kernels::launch_fused_walk): there a chunk costs 1.38 units (anchor dstate 64
//   at 64K: 9.75 us per chunk and CTA in 12 segments against 7.06 in 8 with two per SM; the call
//   416 against 452 us, H200 2026-11-30 v19).
// - The specialised kernel (dstate <= 128, chunks of 128; fused_walk_variant): one CTA per SM,
//   0.55 per chunk and 4 chunks of start-up per wave, and the sums in 128-column CTAs where the
//   64-column ones would take more than a wave (segment_sums_plan). Fitted to its H200 graph times
//   at 1-16 segments on 12 anchor, model and tensor-parallel calls (2026-11-30, design log v24): it
//   picks the fastest on 11 (4 rows x 80 heads x 64 chunks: 2 segments, 550 us against 532 in 1;
//   one since v33, below).
//   Where its walks x heads fill more than half of the SMs but not all: one segment or two with
//   a short first one (first_segment_chunks), priced from their own measurements (below).
//   At dstate 129-512 (its block slots, above 256 on two CTAs per walk; segments of 4 chunks or
//   more) kSpecializedBlocksUnit per chunk and kSpecializedBlocksStart chunks of start-up per
//   wave (below).
// - The specialised kernel with two heads per CTA (dstate <= 64, heads_per_cta 2): half the CTAs,
//   0.86 per chunk (two heads' work for 1.56 times one head's) and 4.5 chunks of start-up per
//   wave; the sums as above (per head). Fitted to 26 forced settings of 7 calls, 1 and 2 heads
//   (anchor dstate 64 at 1K-256K, the 8-group layer, 1 row x 80 heads x 64 chunks; H200,
//   2026-12-01 v34): its faster of the two is the measured faster on each (two from 16K: 64K
//   303 us in 8 segments against 344 with one head in 4; one at 1K and 4K: 14.4 against 18.1).
//   The heuristic takes the cheaper of the two plans (heuristic_config).
// Counts within 1% of the least: the fewest. Fitted to the H200's graph times of 1-16 segments
// on 11 anchor, model and tensor-parallel calls (2026-11-30, docs/PERFORMANCE.md v14): it picks
// the fastest or one within 1% on each (1 row x 20 heads x 512 chunks: 13, 410 us against 544 in
// 16; 1 row x 80 heads x 512 chunks: 13, 1.41 ms against 1.52 in 6; anchor dstate 128 at 64K: 16,
// at 16K: 8).
inline int fused_walk_ctas_per_sm(int64_t dstate) { return dstate > 128 ? 1 : 2; }
inline int fused_walk_ctas_per_walk(int64_t dstate) { return dstate > 256 ? 2 : 1; }
inline bool fused_walk_three_per_sm(int64_t dstate, int64_t ctas, int sm_count) {
  const int64_t sm = std::max(sm_count, 1);
  return dstate <= 64 && (ctas + 3 * sm - 1) / (3 * sm) < (ctas + 2 * sm - 1) / (2 * sm);
}
// The fused_walk kernel for `ctas` CTAs (walks x heads x segments): where they all fit one per SM
// at dstate 65-128 (chunks of 128), two warpgroups per CTA, one per 64-token block, which shortens
// each chunk's chain of waits (tensor-parallel 1 x 16K x 10 heads, 13 segments: 75.9 -> 67.3 us;
// anchor dstate 128 at 1K: 23.2 -> 22.2 us; at dstate 64 the second warpgroup's columns would be
// past dstate: anchor 1K 20.1 -> 20.9 us, H200 2026-11-30 v19); three per SM as above; else one
// warpgroup, two CTAs per SM.
// `specialized`: the call fits kSpecialized (kernels::fused_walk_specialized_supported), which then
// runs wherever it applies: faster than the others at dstate 65-128 on every anchor and model
// shape measured (design log v24), and at dstate 64 than three CTAs per SM (anchor 1K-256K 5-11%,
// the 8-group layer 17%: design log v33).
inline kernels::FusedWalkVariant fused_walk_variant(int64_t dstate, int64_t chunk, int64_t ctas, int sm_count,
                                                    bool specialized) {
  if (specialized) return kernels::FusedWalkVariant::kSpecialized;
  if (dstate > 64 && dstate <= 128 && chunk == 128 && ctas <= std::max(sm_count, 1)) {
    return kernels::FusedWalkVariant::kTwoWarpgroups;
  }
  if (fused_walk_three_per_sm(dstate, ctas, sm_count)) return kernels::FusedWalkVariant::kThreePerSm;
  return kernels::FusedWalkVariant::kOneWarpgroup;
}
// Two segments of the specialised kernel (one CTA per SM) where its walks x heads fill more than
// half of the SMs but not all (the 2.7B layer's 80 heads on one row): the first segment short
// and its CTAs on the SMs beside the second's, running `rounds` after one another there while
// the long ones run once (launched first, fused_cta). Its length balances the two, the
// start-up of 4 chunks per CTA counted: rest + 4 = rounds x (first + 4), rest = chunks - first.
// Elsewhere the even split (first = ceil(chunks / 2), rounds = 1). With 80 of 132 SMs, rounds
// 2: 16 chunks as 4 + 12 (one wave of 12 plus start-up against 16 in one segment), 64 as 20 + 44
// (against three segments of 22 in two waves).
struct FirstSegment {
  int64_t first, rounds;
};
inline FirstSegment first_segment_chunks(int64_t walk_heads, int64_t chunks, int sm_count, bool specialized) {
  const int64_t even = (chunks + 1) / 2, sm = std::max(sm_count, 1);
  if (!specialized || 2 * walk_heads <= sm || walk_heads >= sm) return {even, 1};
  const int64_t free_sms = sm - walk_heads;
  const int64_t rounds = 1 + (2 * walk_heads - sm + free_sms - 1) / free_sms;
  return {std::clamp<int64_t>((chunks - 4 * (rounds - 1)) / (1 + rounds), 1, even), rounds};
}
// The same split with the long segment's CTAs walking the short one's chunks themselves, state
// only, before their own (SsdParams::prewalk), so that no segment sums come before them. A
// state-only chunk costs about half a walked one (2.7B layer on one row: 1.4 against 2.5 us), so
// the two balance at rest + first / 2 = rounds x first: first = 2 chunks / (2 rounds + 1). It
// pays on short walks, where the sums' fixed cost is much of the chain (1 row x 80 heads, 16
// chunks: 44.3 -> 39.6 us; 32: 75.3 -> 71.3; 1 row x 70 heads, 16: 45.2 -> 41.6), not from 40
// chunks, where the sums run in parts (1 row x 70 heads, 40: 87.9 -> 89.2; 80 heads, 64: 133.5
// -> 135.2; 128: 253 -> 265); beyond a wave it gained 1-2% at its best lengths (2 rows x 80 heads
// x 32 chunks: 140.4 -> 137.2; 4 x 64: 461 -> 456) and lost at 2 x 64 (260 -> 267), not taken
// there (H200, design log v37). Measured with 2 rounds only. Returns 0 where it does not apply.
constexpr int64_t kPrewalkMaxChunks = 32;
inline int64_t prewalk_first_segment(int64_t walk_heads, int64_t chunks, int sm_count, bool specialized) {
  const FirstSegment f = first_segment_chunks(walk_heads, chunks, sm_count, specialized);
  if (f.rounds != 2 || chunks > kPrewalkMaxChunks) return 0;
  const int64_t first = 2 * chunks / (2 * f.rounds + 1);
  return first >= 1 && first < chunks - first ? first : 0;
}

// Two segments of the specialised kernel where its CTAs per segment (walks x heads) take more than
// a wave: the long segments of every walk launched first, the short ones after (fused_cta), each
// CTA on the SM that frees first. long_first_makespan is that schedule's end, exactly, for
// `ctas` long CTAs of `lg` and as many short ones of `sh` (chunks, start-up counted) on `sm` SMs:
// the long ones in full waves and a partial last one, beside which the short ones start; those
// SMs run ceil(lg / sh) of them each before the partial wave's SMs join, the rest in rounds.
inline int64_t long_first_makespan(int64_t ctas, int64_t sm, int64_t lg, int64_t sh) {
  const int64_t waves = ctas / sm, part = ctas % sm;
  if (part == 0) return waves * lg + (ctas + sm - 1) / sm * sh;
  const int64_t t0 = waves * lg, t1 = t0 + lg, beside = (lg + sh - 1) / sh;
  if (ctas <= (sm - part) * beside) return std::max(t1, t0 + (ctas + sm - part - 1) / (sm - part) * sh);
  const int64_t rest = ctas - (sm - part) * beside, late = beside * sh - lg;  // (the side SMs free at t1 + late)
  const int64_t rounds = rest / sm, left = rest % sm;
  if (left == 0) return t1 + late + rounds * sh;
  return left <= part ? t1 + (rounds + 1) * sh : t1 + late + (rounds + 1) * sh;
}
// The first segment's length that ends that schedule soonest (the shortest of equals), with the
// schedule's end against one segment's, ceil(ctas / sm) waves of chunks + 4.
struct MultiWaveSplit {
  int64_t first;
  double ratio;
};
inline MultiWaveSplit multi_wave_first_segment(int64_t ctas, int64_t chunks, int sm_count) {
  const int64_t sm = std::max(sm_count, 1);
  MultiWaveSplit best{(chunks + 1) / 2, 1.0};
  if (chunks < 3) return best;
  const double one = static_cast<double>((ctas + sm - 1) / sm * (chunks + 4));
  int64_t least = std::numeric_limits<int64_t>::max();
  for (int64_t f = 1; f < chunks - f; ++f) {
    const int64_t t = long_first_makespan(ctas, sm, chunks - f + 4, f + 4);
    if (t < least) {
      least = t;
      best = {f, static_cast<double>(t) / one};
    }
  }
  return best;
}
// That split where it runs, else first 0 (callers then evaluate the schedule once): the
// specialised kernel with one head per CTA at dstate 65-128 (where it was measured), in the
// batched layout, its CTAs per segment in more than a wave, and the schedule ending by 0.92 of
// one segment's. The calls gained about 0.4-0.6 of the schedule's gain (the chunks of a full GPU
// cost more, and the sums come first): the 2.7B layer (80 heads, dstate 128) 4 x 8K predicted
// 0.88 at 8, measured 476.5 -> 457.2 us; 4 x 16K 0.86 at 30 (938 -> 894.9 us at
// 24); 2 x 8K 0.71 at 20 (277.0 us in 4 even segments -> 258.1); 2 x 4K 0.75 at 9 (154.7 in 2
// -> 135.5 at 10); and where it predicted no gain none came: 3 x 8K 0.97 (323.0 -> 351.3 and
// more), 4 x 2K 1.0 (128.5 -> 131.9 and more), 8 x 4K 1.08 (410.0 -> 446.9 and more) (H200,
// 2026-12-01 v36, forced lengths).
inline MultiWaveSplit multi_wave_split(int64_t ctas, int64_t chunks, int64_t dstate, int heads_per_cta, bool batched,
                                       int sm_count) {
  if (dstate <= 64 || dstate > 128 || heads_per_cta != 1 || !batched || ctas < std::max(sm_count, 1)) return {0, 1.0};
  const MultiWaveSplit m = multi_wave_first_segment(ctas, chunks, sm_count);
  return m.ratio <= 0.92 ? m : MultiWaveSplit{0, 1.0};
}

// A fused_walk call as the segment model prices it: walks x heads, chunks per walk, 64-column
// dstate tiles, chunk length, the SMs, the most segments, whether the specialised kernel runs,
// whether the sums may split (the batched layout), and its heads per CTA.
struct FusedWalkCall {
  int64_t walk_heads, chunks, dstate_tiles, chunk;
  int sm_count, max_segments;
  bool specialized, splittable_sums;
  int heads_per_cta;
  bool pair() const { return specialized && heads_per_cta == 2; }
  int64_t cta_heads() const { return pair() ? (walk_heads + 1) / 2 : walk_heads; }  // (CTAs per segment)
};

// The specialised kernel's chunk at dstate 129-256 (block slots, one CTA per SM), in the units
// below: 0.83 of the two-warpgroup kernel's (1.0), the two walks' ratio at the anchor's 16K in 4
// segments (187.1 and 216.9 us, less the 44 us of sums and chunk_cumsum both run, v29's ncu).
// Its start-up per wave, 2 chunks: the walks' difference at 4K and 1K in 4 segments (62.6 against
// 67.9 us, 28.1 against 26.0, at about 5.3 us per unit); it pays from segments of about 4 chunks
// (kernels::kSpecializedBlocksMinChunks). The model's ratios between 2, 4 and 8 segments then
// follow the forced counts (at 16K 1.75 / 1 / 1.05 against 1.61 / 1 / 1.13) and it picks 4, the
// fastest measured from 4K to 256K tokens (H200, design log v38). The same prices at dstate
// 257-512 (two CTAs per walk) pick 2 segments at the anchor, the fastest of 1, 2 and 4 measured
// from 1K to 64K (16K: 580.6 / 356.5 / 399.8 us; v39).
constexpr double kSpecializedBlocksUnit = 0.83;
constexpr double kSpecializedBlocksStart = 2.0;

// The model's time of `want` segments (in its units: comparable between counts and heads per
// CTA of one call).
inline double fused_walk_cost(const FusedWalkCall& c, int64_t want) {
  const int64_t sm = std::max(c.sm_count, 1);
  const int64_t chunks = c.chunks, dstate_tiles = c.dstate_tiles, chunk = c.chunk, walk_heads = c.walk_heads;
  // (the split that runs: `want` segments of len chunks, fewer where the last ones would be empty)
  const int64_t len_chunks = (chunks + want - 1) / want;
  const int64_t seg = (chunks + len_chunks - 1) / len_chunks;
  const int64_t ctas = c.cta_heads() * fused_walk_ctas_per_walk(64 * dstate_tiles) * seg;
  // (priced by the variant that launch_fused_walk runs for these CTAs)
  using V = kernels::FusedWalkVariant;
  const V variant = fused_walk_variant(64 * dstate_tiles, chunk, ctas, c.sm_count,
                                       c.specialized && kernels::fused_walk_specialized_segment(64 * dstate_tiles, len_chunks));
  const int per_sm = variant == V::kSpecialized  ? 1
                     : variant == V::kThreePerSm ? 3
                                                 : fused_walk_ctas_per_sm(64 * dstate_tiles);
  const int64_t slots = per_sm * sm;
  double sums = 0.0;
  if (seg > 1) {
    const bool parts =
        sums_split_allowed(c.splittable_sums, sums_take_cumsum(static_cast<int>(seg), len_chunks), 64, chunk);
    const SegmentSums plan = segment_sums_plan(64, 64 * dstate_tiles, chunk, walk_heads, static_cast<int>(seg),
                                               len_chunks, parts, static_cast<int>((c.max_segments - 1) / (seg - 1)),
                                               c.sm_count);
    const int64_t sum_ctas = walk_heads * (seg - 1) * ((64 * dstate_tiles + plan.tile - 1) / plan.tile) * plan.split;
    const int64_t sum_slots = (plan.tile == 128 ? 2 : 3) * sm;
    sums = 0.15 * (static_cast<double>((sum_ctas + sum_slots - 1) / sum_slots) *
                       static_cast<double>((len_chunks + plan.split - 1) / plan.split) +
                   static_cast<double>(plan.split - 1));
  }
  const double len = static_cast<double>(len_chunks);
  const bool alone = per_sm == 2 && ctas <= c.sm_count;
  const bool blocks = variant == V::kSpecialized && dstate_tiles > 2;  // (dstate 129-512: block slots)
  const double unit = c.pair()                         ? 0.86
                      : blocks                         ? kSpecializedBlocksUnit
                      : variant == V::kSpecialized    ? 0.55
                      : variant == V::kThreePerSm    ? 1.38
                      : variant == V::kTwoWarpgroups ? 0.64
                      : alone                        ? 0.66
                                                     : 1.0;
  const double start = c.pair()                        ? 4.5
                       : blocks                        ? kSpecializedBlocksStart
                       : variant == V::kSpecialized    ? 4.0
                       : variant == V::kTwoWarpgroups ? 0.5
                                                       : 1.0;
  return unit * static_cast<double>((ctas + slots - 1) / slots) * (len + start) + sums;
}

struct FusedWalkPlan {
  int64_t segments;
  double cost;
};
inline FusedWalkPlan fused_walk_plan(const FusedWalkCall& c) {
  const int64_t sm = std::max(c.sm_count, 1), chunks = c.chunks, cta_heads = c.cta_heads();
  auto cost = [&](int64_t want) { return fused_walk_cost(c, want); };
  // The specialised kernel's walks x heads on more than half of the SMs but not all: one segment,
  // or two with a short first one (first_segment_chunks), which beat every even split measured
  // there. The long segment's chunks then cost 1.28 times a chunk of one segment (all SMs busy)
  // and the sums 0.4 of a chunk more: 80 heads x 1 row, 1 segment / 2 (us) 25.0 / 27.5 at 8
  // chunks, 44.8 / 44.1 at 16, 82.0 / 76.3 at 32, 157 / 141 at 64, 305 / 271 at 128, 1190 / 1041
  // at 512 (even splits: 3 segments 81.5, 150, 278, 1096; 8 at 512: 1110); 70 heads x 64 chunks
  // 155 / 138 (5 segments: 153); 96 heads x 16 and 100 x 32: 46.3 / 48.4 and 84.5 / 85.1 (H200,
  // 2026-12-01 v31).
  // Where the long segment walks the short one's chunks itself (prewalk_first_segment): no sums,
  // a state-only chunk 0.56 of a walked one, and the long segment's chunks 1.05 times one
  // segment's: 80 heads x 1 row, 1 segment / 2 with the pre-walk (us) 16.2 / 15.1 at 4 chunks,
  // 20.9 / 19.1 at 6, 25.6 / 23.7 at 8, 35.4 / 31.6 at 12, 44.8 / 39.7 at 16; 70 heads x 8 chunks
  // 25.3 / 23.3 (H200, 2026-12-01 v37; with the sums, 2 segments were slower up to 12 chunks).
  // (rounds > 1: the regime where first_segment_chunks splits unevenly)
  const bool uneven = c.specialized && kernels::fused_walk_specialized_uneven(64 * c.dstate_tiles);
  if (const FirstSegment f = first_segment_chunks(cta_heads, chunks, c.sm_count, uneven); f.rounds > 1) {
    const int64_t pre = c.pair() ? 0 : prewalk_first_segment(cta_heads, chunks, c.sm_count, uneven);
    const double one = cost(1);
    const double split = pre > 0 ? 1.05 * (static_cast<double>(chunks - pre) + 0.56 * static_cast<double>(pre))
                                 : 1.28 * static_cast<double>(chunks - f.first) + 0.4;  // (against chunks in one segment)
    return c.max_segments >= 2 && (pre > 0 || f.first < chunks - f.first) && split < static_cast<double>(chunks)
               ? FusedWalkPlan{2, one * split / static_cast<double>(chunks)}
               : FusedWalkPlan{1, one};
  }
  // The specialised kernel's CTAs per segment in more than a wave: two segments, the first short,
  // where multi_wave_split runs (priced at 0.3 + 0.7 of the schedule's ratio: the gains measured
  // there), else as below.
  if (c.specialized && c.max_segments >= 2) {
    const MultiWaveSplit m =
        multi_wave_split(cta_heads, chunks, 64 * c.dstate_tiles, c.heads_per_cta, c.splittable_sums, c.sm_count);
    if (m.first > 0) return {2, cost(1) * (0.3 + 0.7 * m.ratio)};
  }
  // The specialised kernel's CTAs per segment in two waves or more: one segment. Segments then only
  // add the sums and start-ups, which the waves' price above undercounts against a partial last
  // wave: 2.7B layer 4 x 8K (320 CTAs) 473.8 us in 1 against 499.5 in 2 (v24: 532 against 550),
  // 8 x 4K 405.8 against 498.9, the 8-group layer (512 CTAs, dstate 64) 277.6 against 340.3
  // (H200, 2026-12-01 v33).
  if (c.specialized && cta_heads >= 2 * sm) return {1, cost(1)};
  const int64_t top = std::max(c.max_segments, 1);
  double least = cost(1);
  for (int64_t seg = 2; seg <= top; ++seg) least = std::min(least, cost(seg));
  int64_t seg = 1;
  while (cost(seg) > 1.01 * least) ++seg;
  return {seg, cost(seg)};
}

// The rules below reproduce the tuner's picks on the H200 (bench --tune, 26 anchor and model
// shapes, 2026-11-29 v6 run; compute_out's heads per CTA re-checked after its TMA loads,
// 2026-11-30) where they differ by more than a few percent.
// fwd_pass_state walks chunks in order, so its parallelism is only walks x heads x state tiles:
// the 32-column dstate tile doubles its CTAs when 64-column tiles would fill less than half of
// the SMs (anchor dstate 64/128: 32 and 64 CTAs; dstate 256: 128 CTAs, where 64 columns won by
// 6%). Its shallow load ring leaves room on each SM for compute_out CTAs, which run alongside it
// (anchor 64K: 1.23 ms with the shallow ring against 1.34 ms with the deep one). compute_out:
// two heads per CTA for headdim 64 (C B^T shared by both, three CTAs per SM fit), one for
// headdim 128 (its accumulators fill the registers) and when two would leave the grid under one
// wave of three CTAs per SM (short sequences: dstate 512 at 1K tokens gained 17% with one).
// Walk segments (2026-11-30 v11 sweep) pay where the walks are too few for the chain to hide
// behind compute_out: under a fifth of the SMs in 64-column tiles, about two CTAs per SM in
// 4 to 16 segments of at least 8 chunks (1 row x 8 heads, dstate 128, 64K tokens: 603 -> 256 us; 1 row
// x 10 heads of the 2.7B layer, 64K: 546 -> 329 us). With more walks the call is bound by the
// two kernels' combined work, and segments only add the sums (anchor 64K: 792 -> 925+ us).
// fused_walk (2026-11-30 v12): the walk and the output in one kernel, where it applies (but for
// long walks at dstate 257-447, v27), with the segments (and heads per CTA) of fused_walk_plan.
// walks: the rows (batched layout) or sequences (varlen); specialized_options: the call's layout
// and options let fused_walk run its specialised kernel (kernels::fused_walk_specialized_options);
// max_segments: max_walk_segments() of the call. fused_walk: 0 to choose, 1 or 2 for the settings
// of that mode (2 where fused_walk applies).
inline KernelConfig heuristic_config(const ProblemShape& s, int64_t walks, bool specialized_options, int sm_count,
                                     int max_segments, int fused_walk = 0) {
  KernelConfig c;
  const int64_t p_tiles = (s.headdim + 63) / 64;
  const int64_t ctas64 = walks * s.nheads * p_tiles * ((s.dstate + 63) / 64);
  // (few walks: 64-column tiles would fill under half of the SMs)
  const bool few_walks = 2 * ctas64 < sm_count;
  c.pass_state_dstate_tile = few_walks ? 32 : 64;
  c.pass_state_stages = 2;
  c.pass_state_segments = 1;
  const int64_t segments = std::min<int64_t>({2 * sm_count / std::max<int64_t>(ctas64, 1), s.nchunks / 8, max_segments});
  if (5 * ctas64 <= sm_count && segments >= 4) {  // 2 halve the chain but add half of it as sums
    c.pass_state_dstate_tile = 64;
    c.pass_state_segments = static_cast<int>(segments);
  }
  const int64_t hpg = s.nheads / s.ngroups;
  int hb = static_cast<int>(std::min<int64_t>(hpg, s.headdim <= 64 ? 2 : 1));
  if (hb == 2) {
    // compute_out's CTAs: one per 64 tokens (chunk padding aside), group and pair of heads.
    const int64_t blocks = s.batch * ((s.seqlen + 63) / 64) * s.ngroups * ((hpg + 1) / 2);
    if (blocks < 3 * static_cast<int64_t>(sm_count)) hb = 1;
    // dstate 64 with chunks of up to 128 tokens: C B^T is cheap to repeat per head, and the CTA
    // of one head is shorter (anchor dstate 64, 64K tokens: 1.03 ms against 1.15 ms with two).
    if (s.dstate <= 64 && s.chunk_size <= 128) hb = 1;
  }
  c.compute_out_heads_per_cta = hb;
  c.fused_walk = 1;
  c.fused_walk_heads_per_cta = 1;
  const int64_t walk_heads = std::max<int64_t>(walks * s.nheads, 1);
  const int64_t chunks_per_walk = s.nchunks * s.batch / std::max<int64_t>(walks, 1);  // varlen: the mean
  // fused_walk wherever it applies, but for dstate 257-447 over long walks. Measured against
  // the two kernels on 39 shapes, most of which an older rule gave the two kernels (H200,
  // 2026-11-30 v27, CLI graph replay, each in the segments below): 1.27-2.25x faster for dstate
  // 64-128 from 1 to 24 chunks per walk (2.7B layer 1 x 2K 69.9 -> 45.8 us, 8 x 2K 471 -> 213;
  // 64 rows x 128 tokens 239 -> 188; anchor dstate 64, 64 x 1K 191 -> 97), 1.5-2.1x for dstate
  // 192-512 at 2-8 chunks, 1.06-1.29x for dstate 320-448 at 4-32 chunks (dstate 384, 16 x 2K
  // 253 -> 211). The two kernels stay ahead only for dstate 384 over 128 chunks (4 x 16K: 445
  // against 458), where fused_walk's two CTAs per walk cost what they do at dstate 512 and the
  // two kernels' time grows with dstate (v17). The specialised kernel on two ranks beats them
  // there too (4 rows x 8 heads in 2 segments: dstate 272 at 16K 380 against 443 us, 320 397
  // against 460, 384 355 against 443, at 64K 1.358 against 1.719 ms; H200, design log v39).
  // (the segments of the kernel that runs: with seq_idx, z or an fp32 output the others run.
  // Counted for them (16 / 8 / 8 segments at the anchor's 64K / 16K / 4K against 8 / 4 / 4),
  // dstate 128 calls with seq_idx were 3.6-17.5% faster at 4K, 16K and on the 2.7B layer and
  // 2.6% slower at 64K, with z 7.5% faster at 16K (H200, v29); until v28 the specialised
  // kernel's counts applied to them all)
  const bool specialized =
      specialized_options && kernels::fused_walk_specialized_shape(s.headdim, s.dstate, s.chunk_size);
  const bool fused_pays = specialized || !(s.dstate > 256 && s.dstate < 448 && chunks_per_walk >= 64);
  if (fused_walk_applies(s) && (fused_walk == 2 || (fused_walk == 0 && fused_pays))) {
    c.fused_walk = 2;
    // (the sums split into parts in the batched layout only: its walks are the rows)
    FusedWalkCall call{walk_heads,       chunks_per_walk, (s.dstate + 63) / 64, s.chunk_size, sm_count, max_segments,
                       specialized,      walks == s.batch, 1};
    FusedWalkPlan plan = fused_walk_plan(call);
    // Two heads per CTA where the specialised kernel pairs them and the model prices them lower.
    if (specialized && kernels::fused_walk_specialized_pairs(s.dstate, hpg)) {
      call.heads_per_cta = 2;
      if (const FusedWalkPlan two = fused_walk_plan(call); two.cost < plan.cost) {
        plan = two;
        c.fused_walk_heads_per_cta = 2;
      }
    }
    c.pass_state_segments = static_cast<int>(std::clamp<int64_t>(plan.segments, 1, max_segments));
  }
  return c;
}

// fwd_pass_state's walk segments: at most 16, and at most the walks' mean chunk count (segments
// of one chunk; the fp32 sums they take per walk and segment are then at most twice what the
// 16-bit chunk states take, which fused_walk does not store). Short segments pay for short walks
// in fused_walk: anchor dstate 64 / 128 at 1K tokens, 4 segments 27-30% faster than 2; dstate 64
// in 8 segments of one chunk 18.9 -> 17.9 us against 4 (H200, 2026-11-30 v22). In the varlen
// layout s.nchunks bounds the chunks of all s.nseq sequences together.
inline int max_walk_segments(const ProblemShape& s, bool varlen) {
  const int64_t mean_chunks = varlen ? s.nchunks / std::max<int64_t>(s.nseq, 1) : s.nchunks;
  return static_cast<int>(std::clamp<int64_t>(mean_chunks, 1, 16));
}

// MAMBA2_SSD_AUTOTUNE=1: forward() tunes a shape class it has no cache entry for (1 s budget).
inline bool autotune_on_miss() {
  const char* e = std::getenv("MAMBA2_SSD_AUTOTUNE");
  return e != nullptr && std::string(e) == "1";
}

}  // namespace mamba2_ssd::detail
