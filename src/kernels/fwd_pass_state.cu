// fwd_pass_state: the state after every chunk.
//
// One CTA (one warpgroup) per (walk, head, 64-row headdim tile, NT-column dstate tile). It walks
// the walk's chunks in order, keeping its state slice in wgmma accumulator registers (fp32):
//   H = carry * H + X^T (B * w)      carry, w: per chunk / per token, from chunk_cumsum
// and stores H after each chunk (the chunk states that compute_out reads) and after the last
// chunk (final_states). Steps of KS tokens (a whole chunk up to 128) stream through a ring of
// stages, so the next steps' loads are in flight while the current one is multiplied: thread 0
// issues the X and B tiles as TMA loads and the weights as a bulk copy, completing on the
// stage's mbarrier. Tokens past a chunk's end (the next sequence's, in the varlen layout) have
// the weight 0, so they add exact zeros.
// The chunk-to-chunk dependency makes the per-step latency (a barrier, the scaling by the token
// weights, one wgmma batch) the cost to keep small; parallelism comes from walks x heads x state
// tiles.
// Every few chunks the CTA publishes its progress (SsdParams::ready) so that compute_out, which
// runs alongside, can use the chunk states already stored.
// With walk segments (SsdParams::nseg > 1) two launches: the kernel's sum-only instantiation
// sums each segment (every one but the last), then the walks, each segment starting from the
// state the earlier segments' sums give. Few walks make the chain the cost; segments shorten it.
#include "kernels/chunk_decay.cuh"
#include "kernels/kernels.hpp"
#include "kernels/state_tile.cuh"
#include "kernels/tensor_map.hpp"
#include "kernels/tma.cuh"

namespace mamba2_ssd::kernels {

namespace {

using namespace cute;
namespace st = state_tile;

// The TMA loads of fwd_pass_state: x as (p, token, head, row), box 64 x KS; B as
// (n, token, group, row), box NT x KS (64- or 128-byte swizzle, as the smem layouts below; NT =
// 128: two boxes of 64 columns, a box row being at most the 128-byte swizzle).
struct PassMaps {
  CUtensorMap x, B;
};

// One pipeline stage of a step of KS tokens: X^T tile (64 p x KS tokens, MN-major A operand),
// B tile (NT x KS, MN-major B operand) and the tokens' state weights.
template <class T, int NT, int KS>
struct PassTiles {
  using LayoutX = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{}, Shape<Int<st::kP>, Int<KS>>{}));
  using AtomB = std::conditional_t<NT == 32, GMMA::Layout_MN_SW64_Atom<T>, GMMA::Layout_MN_SW128_Atom<T>>;
  // (NT = 128: two 64-column slices of KS tokens, one after the other, as the two TMA boxes)
  using LayoutB = std::conditional_t<NT == 128,
                                     decltype(tile_to_shape(AtomB{}, Shape<Int<NT>, Int<KS>>{}, Step<_2, _1>{})),
                                     decltype(tile_to_shape(AtomB{}, Shape<Int<NT>, Int<KS>>{}))>;
  // Where the token weights w go: 64-column tiles scale X^T in registers (loaded with a
  // transposing ldmatrix, the A operand from there: no barrier and no shared-memory round trip);
  // 32-column tiles scale B in shared memory, half as many values as X^T (two such CTAs share one
  // X tile). On the H200 each was the faster for its tile (2026-11-30, design log v15). (128-column
  // tiles: fused_walk's segment sums, see launch_segment_sums.)
  static constexpr bool kWeightX = NT >= 64;
  // The segment sums of bf16 (without chunk_cumsum's work) scale X^T by the weights in pairs of
  // bf16 terms (SsdParams::wst_pairs): two instructions per two values instead of five, on the
  // steps' chain (sums 14% faster at dstate 128-256, design log v48; chosen at run time instead,
  // the branch made the dstate-64 sums 7% slower).
  template <bool kSumsOnly, bool kCumsum>
  static constexpr bool kWeightPairs = kWeightX && kSumsOnly && !kCumsum && std::is_same_v<T, cutlass::bfloat16_t>;
  using Mma = decltype(make_tiled_mma(std::conditional_t<
                                      kWeightX,
                                      decltype(GMMA::rs_op_selector<T, T, float, Shape<_64, Int<NT>, Int<KS>>,
                                                                    GMMA::Major::K, GMMA::Major::MN>()),
                                      decltype(GMMA::ss_op_selector<T, T, float, Shape<_64, Int<NT>, Int<KS>>,
                                                                    GMMA::Major::MN, GMMA::Major::MN>())>{}));
  static constexpr int kXBytes = st::kP * KS * 2;
  static constexpr int kBBytes = NT * KS * 2;
  static constexpr int kWOffset = kXBytes + kBBytes;           // KS floats
  static constexpr int kStageBytes = (kWOffset + KS * 4 + 1023) / 1024 * 1024;
  static constexpr int kLoadBytes = kXBytes + kBBytes + KS * 4;  // per stage, for the mbarrier
};

// Chunks between two progress releases: 4 for walks under 32 chunks (compute_out would otherwise
// wait for most of a short walk), else 8 (each release stalls the chain while the CTA's stores
// drain; every 8 instead of 4 made long calls 2-4% faster on the H200).
__device__ __forceinline__ int publish_mask(int64_t nchunks) { return nchunks >= 32 ? 7 : 3; }

// The segment sums' share of chunk_cumsum (SsdParams::sums_cumsum), after the mbarriers: 64 bytes
// for them, the chunks' carries (kSumsCumsumMaxChunks floats), then their KS state weights each.
constexpr int kSumsCumsumOffset = 64;
template <int KS>
constexpr int sums_cumsum_bytes(int chunks) {
  return kSumsCumsumOffset + kSumsCumsumMaxChunks * 4 + chunks * KS * 4;
}

// kSumsOnly: the segment-sum launch (SsdParams::nseg): CTA (walk, segment k < nseg - 1) walks
// its segment from a zero state (segment 0: from the initial state) without storing chunk
// states, then writes the sum and the product of the segment's carries; kCumsum (the sums of
// SsdParams::sums_cumsum) first does chunk_cumsum's work for its chunks and a share of the last
// segment's (while its first tiles load). Otherwise the walking
// launch: segment k starts from the state entering it, combined from the earlier segments' sums.
// (Template parameters: the walk's chain loop carries none of the sums' code; with it as a
// run-time flag the walk was 4% slower on the H200. With chunk_cumsum's work behind a run-time
// flag, the sums without it made calls up to 6% slower: anchor dstate 256 at 4K, 71 -> 76 us.
// kSplit: the sums of segments split into parts (SsdParams::sum_split > 1); with its code in the
// one sums instantiation, unsplit calls were up to 0.8% slower: 1 row x 20 heads at 64K.)
template <class T, int NT, int KS, int kStages, bool kSumsOnly, bool kCumsum = false, bool kSplit = false>
__global__ void __launch_bounds__(st::kThreads)
    fwd_pass_state_kernel(const SsdParams p, const __grid_constant__ PassMaps maps) {
  constexpr bool sums_only = kSumsOnly;
  static_assert(sums_only || !kCumsum, "chunk_cumsum's work is the sums'");
  static_assert(!kSplit || (sums_only && !kCumsum), "split sums: the sums alone");
  using Tl = PassTiles<T, NT, KS>;
  extern __shared__ __align__(1024) char smem_raw[];
  // 1024-byte alignment by an offset from smem_raw, so that the compiler still sees shared
  // memory (LDS/STS for the weights and the B scaling instead of generic loads and stores).
  char* smem = smem_raw + ((1024u - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u);
  const int tid = threadIdx.x;
  // Launched early behind the stream's previous kernel (see launch_kernel): its writes are read
  // from here on. Only then may compute_out start (it waits on `ready`, which chunk_cumsum
  // zeroes); fused_walk behind the segment sums waits for their end itself. The sums without
  // chunk_cumsum's work wait further down, after their first tiles' loads.
  constexpr bool kEarlyTiles = kSumsOnly && !kCumsum;
  if constexpr (!kEarlyTiles) {
    pdl_wait_primary();
    pdl_launch_dependents();
  }

  const int n_tiles = (p.dstate + NT - 1) / NT;
  const int p0 = (blockIdx.x / n_tiles) * st::kP;
  const int n0 = (blockIdx.x % n_tiles) * NT;
  const int64_t h = blockIdx.y;
  constexpr bool sums_cumsum = kCumsum;
  // The sums: CTA z sums part z % sum_split of segment z / sum_split (of its walk), sum z.
  // (the sums per walk and head; the walks' launch takes unsplit sums, see launch_checked)
  const int sums_per_wh = kSplit ? sums_per_walk_head(p) : p.nseg - 1;
  const int nseg_grid = sums_only ? sums_per_wh : p.nseg;
  const int sum_idx = static_cast<int>(blockIdx.z % nseg_grid);
  const Walk walk = make_walk(p, blockIdx.z / nseg_grid);
  const int64_t grp = h / p.heads_per_group;
  const int seg = kSplit ? sum_idx / p.sum_split : sum_idx;
  // This CTA's chunks: [c_begin, c_end) of the walk. In the varlen layout the segment length is
  // the same for every sequence, so a short sequence leaves its later segments empty.
  SegmentRange range = segment_range(p, seg, walk.nchunks);
  if constexpr (kSplit) {  // (part `part` of the segment; an empty part sums to 0)
    const int part = sum_idx - seg * p.sum_split;
    range.begin = min(range.begin + part * p.sum_part_chunks, range.end);
    range.end = min(range.begin + p.sum_part_chunks, range.end);
  }
  const int64_t c_begin = range.begin, c_end = range.end;
  if (seg > 0 && c_begin >= walk.nchunks) return;
  // This CTA's progress counter: the walk's chunk count up to which it has stored the states.
  int32_t* ready = p.ready != nullptr && !sums_only
                       ? p.ready + ((walk.walk * p.nheads + h) * p.nseg + seg) * p.ready_tiles + blockIdx.x
                       : nullptr;
  // Chunks are counted from c_begin in 32 bits (a walk has fewer than 2^31 chunks).
  const int n_local = static_cast<int>(c_end - c_begin);
  const int pmask = publish_mask(n_local);
  // chunk_cumsum's work (sums_cumsum): this segment's chunks (their weights and carries to shared
  // memory; tile 0's CTA also stores all four arrays to the workspace for fused_walk), and a share
  // of the last segment's, which has no sum CTAs (to the workspace only: chunks r, r + R, ... of
  // it for CTA r of the R = (nseg - 1) x tiles summing the walk's head). Warp i % 4 does item i of
  // the CTA; every warp issues its dt loads here, before thread 0 issues the first tiles, and
  // computes its items after that. (The items' branches are warp-uniform: the warp scan is safe.)
  constexpr int kPerLane = KS / 32, kItemsPerWarp = 2 * kSumsCumsumMaxChunks / 4;  // (own + last segment's)
  float* s_carry = reinterpret_cast<float*>(smem + kStages * Tl::kStageBytes + kSumsCumsumOffset);
  float* s_w = s_carry + kSumsCumsumMaxChunks;
  const int warp = tid / 32, lane = tid % 32;
  [[maybe_unused]] float fold_dt[kItemsPerWarp][kPerLane];
  HeadDecay hd{};
  int n_items = 0, item_r = 0, item_step = 1;
  const int64_t last_begin = segment_range(p, p.nseg - 1, walk.nchunks).begin;
  auto item_chunk = [&](int i) -> int64_t {  // (within the walk)
    return i < n_local ? c_begin + i : last_begin + item_r + static_cast<int64_t>(i - n_local) * item_step;
  };
  if constexpr (sums_cumsum) {
    const int n_last = static_cast<int>(max(walk.nchunks - last_begin, int64_t{0}));
    item_r = seg * static_cast<int>(gridDim.x) + static_cast<int>(blockIdx.x);
    item_step = (p.nseg - 1) * static_cast<int>(gridDim.x);
    n_items = n_local + (item_r < n_last ? (n_last - item_r + item_step - 1) / item_step : 0);
    hd = head_decay(p, static_cast<int>(h));
#pragma unroll
    for (int i = 0; i < kItemsPerWarp; ++i) {
      const int item = warp + 4 * i;
      if (item < n_items) {
        load_chunk_dt(p, walk_chunk(p, walk, item_chunk(item)), static_cast<int>(h), hd.bias, lane, fold_dt[i]);
      }
    }
  }
  // Segment sums and carry products: [walk][head][segment][tile] blocks, fragment order.
  constexpr int kAccVals = st::kP * NT / st::kThreads;
  const int64_t sum_base = (walk.walk * p.nheads + h) * sums_per_wh;
  auto sum_ptr = [&](int k) {
    return p.seg_sums + ((sum_base + k) * p.ready_tiles + blockIdx.x) * (kAccVals * st::kThreads) + tid;
  };

  typename Tl::Mma mma;
  auto thr = mma.get_slice(tid);
  Tensor acc = partition_fragment_C(mma, Shape<Int<st::kP>, Int<NT>>{});
  static_assert(decltype(size(acc))::value == kAccVals, "accumulator fragment size");
  if (sum_idx == 0 && p.init != nullptr) {  // (segment 0; the sums: its part 0)
    const void* src = static_cast<const char*>(p.init) +
                      (walk.walk * p.init_sb + h * p.init_sh) * (int64_t)dtype_size_dev(p.init_dtype);
    st::load_tile(acc, src, p.init_dtype, p.init_sp, p0, n0, p);
  } else if (seg > 0 && !sums_only) {
    // T_1 = sum_0 (it includes the initial state), T_k = carry_{k-1} T_{k-1} + sum_{k-1}.
    const float* s0 = sum_ptr(0);
#pragma unroll
    for (int v = 0; v < kAccVals; ++v) acc(v) = s0[v * st::kThreads];
#pragma unroll 1
    for (int k = 1; k < seg; ++k) {
      const float f = p.seg_carry[sum_base + k];
      const float* sk = sum_ptr(k);
#pragma unroll
      for (int v = 0; v < kAccVals; ++v) acc(v) = fmaf(f, acc(v), sk[v * st::kThreads]);
    }
  } else {
    clear(acc);
  }

  // kWeightX: this thread's share of X^T (p, token) as the update's A operand, and the token of
  // each value. Otherwise the offset of the B vector this thread scales: thread v = tid + 128 * it
  // owns the 16-byte vector at token v / (NT / 8), column 8 * (v % (NT / 8)); the shared offset
  // advances by 2048 bytes per iteration in this layout (tests/cpp/test_tile_layouts.cu).
  using XFrag = decltype(make_tensor<T>(partition_shape_A(mma, Shape<Int<st::kP>, Int<KS>>{})));
  [[maybe_unused]] XFrag xw;
  auto x_copy = make_tiled_copy_A(Copy_Atom<SM75_U16x8_LDSM_T, T>{}, mma);
  auto thr_x_copy = x_copy.get_slice(tid);
  [[maybe_unused]] Tensor xw_dst = thr_x_copy.retile_D(xw);
  [[maybe_unused]] Tensor x_tok = thr.partition_A(make_identity_tensor(Shape<Int<st::kP>, Int<KS>>{}));
  constexpr int kBVec = NT / 8;
  const int tb = tid / kBVec, cb = (tid % kBVec) * 8;
  uint32_t off_b;
  {
    Tensor sB = make_tensor(make_smem_ptr(reinterpret_cast<T*>(smem + Tl::kXBytes)), typename Tl::LayoutB{});
    off_b = static_cast<uint32_t>(reinterpret_cast<char*>(&sB(cb, tb)) - (smem + Tl::kXBytes));  // within the B tile
  }
  constexpr bool kPairs = Tl::template kWeightPairs<kSumsOnly, kCumsum>;
  const float* w_walk = (kPairs ? p.wst_pairs : p.wst) + cum_offset(p, walk.row, h, walk.g0);
  const float* carry_walk = p.carry + carry_offset(p, walk.row, h, walk.g0);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kStages * Tl::kStageBytes);  // [kStages]
  if (tid == 0) {
    for (int b = 0; b < kStages; ++b) tma::mbar_init(bars + b, 1);
    tma::fence_mbar_init();
  }
  __syncthreads();
  const int p32 = p0, n32 = n0, h32 = static_cast<int>(h), g32 = static_cast<int>(grp);
  const int row32 = static_cast<int>(walk.row);

  // Producer cursor over (chunk, step of KS tokens); thread 0 issues the loads. (tiles: the x and
  // B tiles, inputs of the call; weights: chunk_cumsum's, read only after the wait for it)
  int ld_c = 0;  // from c_begin
  int ld_k = 0;
  auto issue_next = [&](int stage_idx, bool tiles = true, bool weights = true) {
    if (ld_c < n_local) {
      const ChunkInfo ci = walk_chunk(p, walk, c_begin + ld_c);
      const int t0 = ld_k * KS;
      if (tid == 0) {
        char* stage = smem + stage_idx * Tl::kStageBytes;
        uint64_t* bar = bars + stage_idx;
        const int tok = static_cast<int>(ci.tok0 + t0);  // token of the step in the row
        if (tiles) {
          tma::mbar_arrive_expect(bar, sums_cumsum ? Tl::kLoadBytes - KS * 4 : Tl::kLoadBytes);
          tma::load_4d(&maps.x, bar, stage, p32, tok, h32, row32);
          tma::load_4d(&maps.B, bar, stage + Tl::kXBytes, n32, tok, g32, row32);
          if constexpr (NT == 128) {
            tma::load_4d(&maps.B, bar, stage + Tl::kXBytes + Tl::kBBytes / 2, n32 + 64, tok, g32, row32);
          }
        }
        if constexpr (!sums_cumsum) {
          if (weights) tma::load_bulk(stage + Tl::kWOffset, w_walk + (c_begin + ld_c) * p.chunk + t0, KS * 4, bar);
        }
      }
      if (++ld_k * KS >= ci.count) { ld_k = 0; ++ld_c; }
    }
  };

  if constexpr (kEarlyTiles) {
    // The first stages' tiles before the wait for chunk_cumsum, which does not write them (it
    // starts this kernel only once the kernel before it has ended); their weights after it.
#pragma unroll 1
    for (int s = 0; s < kStages - 1; ++s) issue_next(s, true, false);
    pdl_wait_primary();
    pdl_launch_dependents();
    ld_c = 0;
    ld_k = 0;
#pragma unroll 1
    for (int s = 0; s < kStages - 1; ++s) issue_next(s, false, true);
  } else {
#pragma unroll 1
    for (int s = 0; s < kStages - 1; ++s) issue_next(s);
  }
  if constexpr (sums_cumsum) {
#pragma unroll
    for (int i = 0; i < kItemsPerWarp; ++i) {
      const int item = warp + 4 * i;
      if (item < n_items) {
        const int64_t c = item_chunk(item);
        const ChunkDecay<kPerLane> d = chunk_decay(p, walk_chunk(p, walk, c), hd.a, lane, fold_dt[i]);
        if (item < n_local) {
          store_slots(s_w + item * KS + lane * kPerLane, d.wst);
          if (lane == 0) s_carry[item] = d.carry;
        }
        if (item >= n_local || blockIdx.x == 0) store_chunk_decay(p, d, hd.a, walk.row, static_cast<int>(h), walk.g0 + c, lane);
      }
    }
    __syncthreads();
  }

  int stage = 0;
  uint32_t parity = 0;  // bit s: the phase of stage s to wait for
  const DType sd = p.state_dtype;
  const int64_t esz = dtype_size_dev(sd);
  // The chunks' carries, 32 at a time: lane i holds the carry of chunk c0 + i of the current
  // block of 32 and of the next block (loaded a block ahead; a value loaded a single chunk ahead
  // was moved into a uniform register right after its load, which waited for it on the chain).
  const float* carry_seg = sums_cumsum ? s_carry : carry_walk + c_begin;
  float carry_block = lane < n_local ? carry_seg[lane] : 0.0f;
  float carry_block_next = 32 + lane < n_local ? carry_seg[32 + lane] : 0.0f;
  [[maybe_unused]] float carry_product = 1.0f;  // of the segment's chunks (sums_only)
  for (int c_rel = 0; c_rel < n_local; ++c_rel) {
    const int64_t c = c_begin + c_rel;
    const ChunkInfo ci = walk_chunk(p, walk, c);
    const int nsteps = (ci.count + KS - 1) / KS;
    const int c_in_block = c_rel % 32;
    if (c_in_block == 0 && c_rel > 0) {
      carry_block = carry_block_next;
      carry_block_next = c_rel + 32 + lane < n_local ? carry_seg[c_rel + 32 + lane] : 0.0f;
    }
    const float carry = __shfl_sync(0xffffffffu, carry_block, c_in_block);
    if constexpr (sums_only) carry_product *= carry;
    for (int k = 0; k < nsteps; ++k) {
      // Every thread is done with the previous stage (its wgmma completed): its buffer takes the
      // next load at once, before this step's tiles are waited for, so that the wait has one more
      // load in flight (issued after the wait, two stages ran one load at a time).
      __syncthreads();
      // Chunks 0..c-1 are stored (by all threads, before the barrier): publish them, a chunk
      // late and every few chunks (a release per chunk made this kernel 35% slower on the H200).
      if (k == 0 && c_rel > 0 && (c_rel & pmask) == 0 && tid == 0 && ready != nullptr) {
        store_release(ready, static_cast<int32_t>(c));
      }
      issue_next((stage + kStages - 1) % kStages);
      tma::mbar_wait(bars + stage, (parity >> stage) & 1u);
      parity ^= 1u << stage;
      char* sp = smem + stage * Tl::kStageBytes;
      // X^T or B times w per token (w is 0 on padding and on tokens of an earlier sequence).
      Tensor sX = make_tensor(make_smem_ptr(reinterpret_cast<T*>(sp)), typename Tl::LayoutX{});
      Tensor sB = make_tensor(make_smem_ptr(reinterpret_cast<T*>(sp + Tl::kXBytes)), typename Tl::LayoutB{});
      const float* sw = sums_cumsum ? s_w + c_rel * KS : reinterpret_cast<const float*>(sp + Tl::kWOffset);
      if constexpr (Tl::kWeightX) {
        copy(x_copy, thr_x_copy.partition_S(sX), xw_dst);
        if constexpr (kPairs) {
          scale_by_weight_pairs(xw, [&](int i) { return static_cast<int>(get<1>(x_tok(i))); }, sw);
        } else {
#pragma unroll
          for (int i = 0; i < decltype(size(xw))::value; ++i) {
            xw(i) = from_float<T>(to_float<T>(xw(i)) * sw[get<1>(x_tok(i))]);
          }
        }
      } else {
#pragma unroll
        for (int it = 0; it < NT * KS / 8 / st::kThreads; ++it) {
          const float w = sw[tb + it * (st::kThreads / kBVec)];
          T* ptr = reinterpret_cast<T*>(sp + Tl::kXBytes + off_b + it * 2048);
          uint4 raw = *reinterpret_cast<uint4*>(ptr);
          T* vals = reinterpret_cast<T*>(&raw);
#pragma unroll
          for (int e = 0; e < 8; ++e) vals[e] = from_float<T>(to_float<T>(vals[e]) * w);
          *reinterpret_cast<uint4*>(ptr) = raw;
        }
        fence_async_shared();
        __syncthreads();
      }
      if (k == 0) {
#pragma unroll
        for (int v = 0; v < size(acc); ++v) acc(v) *= carry;
      }
      warpgroup_fence_operand(acc);
      if constexpr (Tl::kWeightX) {
        warpgroup_fence_operand(xw);
        warpgroup_arrive();
        gemm(mma, xw, thr.partition_fragment_B(sB), acc);
      } else {
        warpgroup_arrive();
        gemm(mma, thr.partition_fragment_A(sX), thr.partition_fragment_B(sB), acc);
      }
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc);
      stage = (stage + 1) % kStages;
    }
    // The state after chunk c.
    if constexpr (!sums_only) {
      const int64_t g = walk.g0 + c;
      char* dst = static_cast<char*>(p.states) + (walk.row * p.st_sb + g * p.st_sc + h * p.st_sh) * esz;
      st::store_tile(acc, dst, sd, p.st_sp, p0, n0, p);
    }
  }
  if constexpr (sums_only && NT == 128) {
    // In 64-column tiles as fused_walk reads them: value v of the 64 x 128 fragment is value v % 32
    // of the 64 x 64 fragment of columns 64 (v / 32).. (headdim 64: blockIdx.x is the dstate tile).
#pragma unroll
    for (int v = 0; v < kAccVals; ++v) {
      const int tile = 2 * blockIdx.x + v / 32;
      if (tile < p.ready_tiles) {
        p.seg_sums[((sum_base + sum_idx) * p.ready_tiles + tile) * (32 * st::kThreads) + (v % 32) * st::kThreads +
                   tid] = acc(v);
      }
    }
    if (blockIdx.x == 0 && tid == 0) p.seg_carry[sum_base + sum_idx] = carry_product;
    return;
  } else if constexpr (sums_only) {
    float* dst = sum_ptr(sum_idx);
#pragma unroll
    for (int v = 0; v < kAccVals; ++v) dst[v * st::kThreads] = acc(v);
    if (blockIdx.x == 0 && tid == 0) p.seg_carry[sum_base + sum_idx] = carry_product;
    return;
  }
  __syncthreads();
  if (tid == 0 && ready != nullptr) store_release(ready, static_cast<int32_t>(c_end));
  if (p.final_states != nullptr && c_end == walk.nchunks) {
    char* dst = static_cast<char*>(p.final_states) +
                (walk.walk * p.fin_sb + h * p.fin_sh) * (int64_t)dtype_size_dev(p.fin_dtype);
    st::store_tile(acc, dst, p.fin_dtype, p.fin_sp, p0, n0, p);
  }
}

template <class T, int NT, int KS, int kStages>
constexpr int pass_smem_bytes() {
  return kStages * PassTiles<T, NT, KS>::kStageBytes + 1024 + 8 * kStages;
}

template <class T, int NT, int KS, int kStages>
CtaFootprint footprint_typed() {
  static int regs = 0;  // per instantiation
  if (regs == 0) {
    cudaFuncAttributes a{};
    check_cuda(cudaFuncGetAttributes(&a, fwd_pass_state_kernel<T, NT, KS, kStages, false>),
               "cudaFuncGetAttributes(fwd_pass_state)");
    regs = (a.numRegs + 7) / 8 * 8 * st::kThreads;
  }
  return {pass_smem_bytes<T, NT, KS, kStages>() + 1024, regs};
}

// One kernel instantiation with its dynamic shared memory limit raised on the current device.
template <class T, int NT, int KS, int kStages, bool kSumsOnly, bool kCumsum = false, bool kSplit = false>
auto prepared_kernel() {
  auto kernel = fwd_pass_state_kernel<T, NT, KS, kStages, kSumsOnly, kCumsum, kSplit>;
  raise_smem_limit(reinterpret_cast<const void*>(kernel),
                   pass_smem_bytes<T, NT, KS, kStages>() + (kCumsum ? sums_cumsum_bytes<KS>(kSumsCumsumMaxChunks) : 0),
                   false, "cudaFuncSetAttribute(fwd_pass_state)");
  return kernel;
}

// The segment sums (p.nseg > 1), then the walks unless `sums_only`.
template <class T, int NT, int KS, int kStages>
void launch_typed(const SsdParams& p, int64_t walks, bool sums_only, cudaStream_t stream) {
  static_assert(st::kP * NT % st::kThreads == 0, "accumulator fragment size");
  const int p_tiles = (p.headdim + st::kP - 1) / st::kP;
  const int n_tiles = (p.dstate + NT - 1) / NT;
  if (NT != 128 && p.ready != nullptr && p.ready_tiles != p_tiles * n_tiles) {
    throw_launch_error("fwd_pass_state: SsdParams::ready_tiles is " + std::to_string(p.ready_tiles) + ", expected " +
                       std::to_string(p_tiles * n_tiles) + " for dstate tile " + std::to_string(NT));
  }
  PassMaps maps;
  {
    const int64_t dims[4] = {p.headdim, p.seqlen, p.nheads, p.batch};
    const int64_t strides[3] = {2 * p.x_st, 2 * p.x_sh, 2 * p.x_sb};
    const uint32_t box[4] = {64, KS, 1, 1};
    maps.x = make_tile_map_16bit(p.x, 4, dims, strides, box, "fwd_pass_state x");
  }
  {
    const int64_t dims[4] = {p.dstate, p.seqlen, p.ngroups, p.batch};
    const int64_t strides[3] = {2 * p.B_st, 2 * p.B_sg, 2 * p.B_sb};
    const uint32_t box[4] = {NT == 128 ? 64 : NT, KS, 1, 1};
    maps.B = make_tile_map_16bit(p.B, 4, dims, strides, box, "fwd_pass_state B", NT == 32 ? 64 : 128);
  }
  if (p.nseg > 1) {
    // Segment sums first (every segment but the last; always the shallow ring, which keeps the
    // instantiations few), then the walks.
    constexpr int kSumStages = KS == 64 ? 3 : 2;
    // Three 64-column CTAs per SM, with chunk_cumsum's work in the longest segments that take it.
    static_assert(3 * (pass_smem_bytes<T, 64, 128, 2>() + sums_cumsum_bytes<128>(kSumsCumsumMaxChunks) + 1024) <=
                  228 * 1024);
    auto sums = prepared_kernel<T, NT, KS, kSumStages, true>();
    int smem = pass_smem_bytes<T, NT, KS, kSumStages>();
    if (p.sums_cumsum) {
      // (fused_walk's sums only: 64- and 128-column tiles)
      if (NT == 32 || p.chunk != KS || p.seg_chunks > kSumsCumsumMaxChunks || p.seg0_chunks != p.seg_chunks ||
          p.ready != nullptr) {
        throw_launch_error("fwd_pass_state: chunk_cumsum's work in the segment sums takes dstate tiles of 64 or 128, "
                           "chunks of 64 or 128, at most " + std::to_string(kSumsCumsumMaxChunks) +
                           " chunks in every segment and no progress counters, got tile " + std::to_string(NT) +
                           ", chunk " + std::to_string(p.chunk) + ", segments of " + std::to_string(p.seg0_chunks) +
                           " and " + std::to_string(p.seg_chunks) + " chunks");
      }
      if constexpr (NT != 32) sums = prepared_kernel<T, NT, KS, kSumStages, true, true>();
      smem += sums_cumsum_bytes<KS>(p.seg_chunks);
    } else if (p.sum_split > 1) {
      // (fused_walk's sums only: 64- and 128-column tiles, chunks of 128; launch_checked checked the rest)
      if (NT == 32 || KS != 128) {
        throw_launch_error("fwd_pass_state: segment sums split into parts take dstate tiles of 64 or 128 and chunks "
                           "of 128, got tile " + std::to_string(NT) + ", chunk " + std::to_string(p.chunk));
      }
      if constexpr (NT != 32 && KS == 128) sums = prepared_kernel<T, NT, KS, kSumStages, true, false, true>();
    }
    if (PassTiles<T, NT, KS>::template kWeightPairs<true, false> && !p.sums_cumsum && p.wst_pairs == nullptr) {
      throw_launch_error("fwd_pass_state: the bf16 segment sums read chunk_cumsum's weights in pairs "
                         "(SsdParams::wst_pairs), got none");
    }
    const bool fp32_weights = !(PassTiles<T, NT, KS>::template kWeightPairs<true, false> && !p.sums_cumsum);
    if (fp32_weights && p.wst == nullptr) {
      throw_launch_error("fwd_pass_state: these segment sums read (or, with chunk_cumsum's work, write) fp32 weights "
                         "(SsdParams::wst), got none");
    }
    if (p.walk_meta && (p.sums_cumsum || fp32_weights)) {
      throw_launch_error(p.sums_cumsum ? "fwd_pass_state: the segment sums doing chunk_cumsum's work do not store "
                                         "fused_walk's walk meta (SsdParams::walk_meta)"
                                       : "fwd_pass_state: these segment sums read fp32 weights (SsdParams::wst), "
                                         "where walk_meta has chunk_cumsum store fused_walk's instead");
    }
    dim3 grid_sums(p_tiles * n_tiles, p.nheads, static_cast<unsigned>(walks * (p.nseg - 1) * p.sum_split));
    launch_kernel(sums, grid_sums, dim3(st::kThreads), smem, stream, true, 1, "launch fwd_pass_state (segment sums)", p,
                  maps);
  }
  if constexpr (NT == 128) {
    return;  // (sums only)
  } else {
    if (sums_only) return;
    if (p.wst == nullptr) throw_launch_error("fwd_pass_state: the walks read fp32 weights (SsdParams::wst), got none");
    auto walk = prepared_kernel<T, NT, KS, kStages, false>();
    dim3 grid(p_tiles * n_tiles, p.nheads, static_cast<unsigned>(walks * p.nseg));
    launch_kernel(walk, grid, dim3(st::kThreads), pass_smem_bytes<T, NT, KS, kStages>(), stream, true, 1,
                  "launch fwd_pass_state", p, maps);
  }
}

// Calls f.template run<T, NT, KS, kStages>() for the instantiation of a setting.
// Whole chunks per step where they fit (fewer barrier rounds per token); 64 for Q = 64.
// Deep ring: about 64-100 KB of loads in flight per CTA, for one CTA per SM (few walks x
// heads). Shallow ring: two stages, so that two or three CTAs share an SM when there are many.
template <class F>
auto with_instantiation(const SsdParams& p, const PassStateConfig& cfg, F&& f) {
  using Op = std::decay_t<F>;
  const bool deep = cfg.stages > 2;
  auto steps = [&](auto t, auto nt) {
    using T = decltype(t);
    constexpr int NT = decltype(nt)::value;
    if (p.chunk == 64) {
      return deep ? f.template run<T, NT, 64, 6>() : f.template run<T, NT, 64, 3>();
    }
    return deep ? f.template run<T, NT, 128, 4>() : f.template run<T, NT, 128, 2>();
  };
  if (cfg.dstate_tile == 32) {
    return p.fp16 ? steps(cutlass::half_t{}, Int<32>{}) : steps(cutlass::bfloat16_t{}, Int<32>{});
  }
  if constexpr (Op::kSums128) {
    // 128-column tiles: fused_walk's segment sums only (headdim 64, chunks of 128, two stages)
    if (cfg.dstate_tile == 128) {
      return p.fp16 ? f.template run<cutlass::half_t, 128, 128, 2>()
                    : f.template run<cutlass::bfloat16_t, 128, 128, 2>();
    }
  }
  return p.fp16 ? steps(cutlass::half_t{}, Int<64>{}) : steps(cutlass::bfloat16_t{}, Int<64>{});
}

struct LaunchOp {
  static constexpr bool kSums128 = true;
  const SsdParams& p;
  int64_t walks;
  bool sums_only;
  cudaStream_t stream;
  template <class T, int NT, int KS, int kStages>
  void run() const { launch_typed<T, NT, KS, kStages>(p, walks, sums_only, stream); }
};
struct FootprintOp {
  static constexpr bool kSums128 = false;
  template <class T, int NT, int KS, int kStages>
  CtaFootprint run() const { return footprint_typed<T, NT, KS, kStages>(); }
};

}  // namespace

CtaFootprint fwd_pass_state_footprint(const SsdParams& p, const PassStateConfig& cfg) {
  return with_instantiation(p, cfg, FootprintOp{});
}

int fwd_pass_state_tiles(int64_t headdim, int64_t dstate, int dstate_tile) {
  const int64_t nt = dstate_tile == 32 ? 32 : 64;
  return static_cast<int>(((headdim + st::kP - 1) / st::kP) * ((dstate + nt - 1) / nt));
}

namespace {

// The checks and the launch(es) of both entry points below.
void launch_checked(const SsdParams& p, const PassStateConfig& cfg, bool sums_only, cudaStream_t stream) {
  const int64_t walks = p.varlen ? p.nseq : p.batch;
  if (walks == 0) return;
  if (p.nseg < 1 || (p.nseg > 1 && (p.seg_chunks < 1 || p.seg0_chunks < 1 || p.seg_sums == nullptr ||
                                    p.seg_carry == nullptr ||
                                    p.seg0_chunks + static_cast<int64_t>(p.nseg - 2) * p.seg_chunks >= p.nchunks))) {
    throw_launch_error("fwd_pass_state: inconsistent walk segments (nseg " + std::to_string(p.nseg) + ", seg_chunks " +
                       std::to_string(p.seg_chunks) + ", seg0_chunks " + std::to_string(p.seg0_chunks) + ", nchunks " +
                       std::to_string(p.nchunks) + ")");
  }
  if (!sums_only && p.nseg > 1 && p.seg0_chunks != p.seg_chunks) {
    throw_launch_error("fwd_pass_state: its walks (and compute_out) take segments of one length, got " +
                       std::to_string(p.seg0_chunks) + " chunks in the first and " + std::to_string(p.seg_chunks) +
                       " in the others (a shorter first segment is fused_walk's)");
  }
  if (walks * p.nseg > 65535) {
    throw_launch_error("fwd_pass_state: at most 65535 walks x segments per launch, got " +
                       std::to_string(walks * p.nseg));
  }
  // (the longest summed segment: the first where it is the shorter of two)
  const int64_t summed = p.nseg > 2 ? p.seg_chunks : p.seg0_chunks;
  if (p.sum_split < 1 || (p.nseg > 1 && static_cast<int64_t>(p.sum_part_chunks) * p.sum_split < summed) ||
      (p.sum_split > 1 && (!sums_only || p.sums_cumsum || p.varlen || walks * (p.nseg - 1) * p.sum_split > 65535))) {
    throw_launch_error("fwd_pass_state: segment sums split in " + std::to_string(p.sum_split) + " parts of " +
                       std::to_string(p.sum_part_chunks) + " chunks (summed segments of up to " +
                       std::to_string(summed) + "), which take parts that cover the summed segments, the sums "
                       "alone (fused_walk's), the batched layout, no chunk_cumsum work and at most 65535 walks x "
                       "sums per launch");
  }
  with_instantiation(p, cfg, LaunchOp{p, walks, sums_only, stream});
}

}  // namespace

void launch_fwd_pass_state(const SsdParams& p, const PassStateConfig& cfg, cudaStream_t stream) {
  if (cfg.dstate_tile != 32 && cfg.dstate_tile != 64) {
    throw_launch_error("fwd_pass_state: dstate tile 32 or 64, got " + std::to_string(cfg.dstate_tile));
  }
  if (p.sums_cumsum) {
    throw_launch_error("fwd_pass_state: its walks read chunk_cumsum's outputs; SsdParams::sums_cumsum is for fused_walk");
  }
  launch_checked(p, cfg, false, stream);
}

void launch_segment_sums(const SsdParams& p, int dstate_tile, cudaStream_t stream) {
  if (p.nseg < 2) return;
  if (dstate_tile == 128 && !(p.headdim == 64 && p.chunk == 128)) {
    throw_launch_error("fwd_pass_state: 128-column segment sums take headdim 64 and chunks of 128, got headdim " +
                       std::to_string(p.headdim) + ", chunk " + std::to_string(p.chunk));
  }
  PassStateConfig cfg;
  cfg.dstate_tile = dstate_tile;
  cfg.stages = 2;
  launch_checked(p, cfg, true, stream);
}

}  // namespace mamba2_ssd::kernels
