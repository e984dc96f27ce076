// fused_walk's warp-specialised kernel (FusedWalkVariant::kSpecialized): see below and
// docs/ARCHITECTURE.md. The rest of fused_walk is in fused_walk.cu.
#include "kernels/chunk_out.cuh"
#include "kernels/fused_walk_parts.cuh"
#include "kernels/kernels.hpp"
#include "kernels/state_tile.cuh"
#include "kernels/tensor_map.hpp"
#include "kernels/tma.cuh"
#include "mamba2_ssd/error.hpp"

namespace mamba2_ssd::kernels {

namespace {

using namespace cute;
using namespace chunk_out;
using namespace fused_walk_parts;
namespace st = state_tile;

// ---- The warp-specialised walk (FusedWalkVariant::kSpecialized): dstate <= 512 (one, two or
// four 64-column slices, NK; above 256 on two CTAs), chunks of 128, the batched layout without
// seq_idx, out by TMA stores.
// One CTA of three warpgroups per SM, walking one head or, at dstate <= 64, HP = 2 heads of one
// group (SsdParams::ws_heads): those share each chunk's C and B tiles and C_m B_m^T, and every
// part below runs once per head (two states, two H_s copies, two outputs per block).
// Warpgroup 0 holds the state: it writes the chunk's e_s (in place of dt'; on one rank chunk_cumsum
// may have stored it, SsdParams::walk_meta), updates H with each
// 64-token block in turn and writes H_s twice per chunk, the state entering it (start) and the
// state after block 0 (mid); it stores the chunk states and issues the loads. Warpgroup 1 + m
// computes block m's output of every chunk from H_s(start) or H_s(mid): block 1 then needs no
// C_1 B_0^T and S_10 X_0 (a sixth less tensor work per chunk than from H_s(start) alone, and one
// wait fewer on its chain), and the two blocks cost the same. The chunk buffer has two slots:
// the next chunk's tiles land and the state runs up to a chunk ahead while this chunk's output is
// computed; the walk's only chain is H's update. Each output warpgroup rounds its block into a
// staging buffer of its own for the TMA stores, which are waited for a chunk later. The output
// warpgroups take the registers the state one does not need (setmaxnreg).
// At dstate 129-256 (NK = 4) two chunks' tiles do not fit (2 x 145 KB): the buffer's two slots are
// the chunk's two 64-token blocks instead (kBlockSlots, one head per CTA), holding C_m and B_m
// (read by C H^T, C B^T and the state's update), which the block's output warpgroup refills with
// the next chunk's once its readers are done (the load runs under S X and the epilogue). The X
// tiles have a ring of three (tile n = 2 li + m at n % 3): there is no room for a staging buffer,
// so each block's output is staged in place in its X tile (D x read first) and the tile refilled
// with tile n + 3 once the stores have read it, while the block's next X has landed in another
// (the staging in the block's H_s copy, with X_m in one tile per block, held H_s(start) for
// block 0's stores and kept the state warpgroup's next chunk behind them: 3-5% slower, v39). The
// 64 x 256 state takes 128 accumulator registers.
// At dstate 257-512 two CTAs of a cluster (ranks, kRanks = 2) walk each head, rank r holding state
// columns 256 r .. 256 r + 255 in that block-slot form, as fused_walk_kernel's clusters do: each
// rank's output warpgroups compute both blocks' outputs over its columns, and block m is finished
// by rank m, whose warpgroup of block m adds the 64 x 64 fp32 partial that the other rank's sends
// (st.async) into slices 1-2 of its H_s copy m, free once its C H^T has read them and released
// once the partial is read; the sender stages nothing and stores nothing. There the parts of a
// block slot have barriers of their own (kClaims): B_m is refilled by whichever of its readers
// releases it last (the state warpgroup after its update, or block m's after C B^T), C_m by its
// block's warpgroup after C H^T and C B^T, the meta in a ring of four two chunks ahead, so that
// an output warpgroup no longer waits for the state's update to refill its slot (dstate 512
// 1.9-3.2% faster from 4K tokens; one rank lost 4.5-5.6% with it and keeps one refill, v46).
// (registers: state + 2 x output <= 3 x 168, 64K per SM; two heads per CTA take 8 more for the state)
template <int NK, int HP>
constexpr int kWsStateRegs = NK == 4 ? 192 : HP == 1 ? 144 : 152;
template <int NK>
constexpr int kWsOutRegs = NK == 4 ? 152 : 176;
template <int NK>
constexpr bool kWsBlockSlots = NK == 4;

// The state warpgroup scales X^T by its weights as bf16 (hi, lo) pairs (scale_by_weight_pairs),
// at one 64-column slice and in one-rank block slots: chunk_cumsum's pairs (SsdParams::wst_pairs)
// where it stores them, block 0's weights to the middle of the chunk written as pairs by the
// warpgroup itself (from fp32 wst where no pairs are given). The other two forms were slower
// with it (dstate 128 0.7-1.0%, two ranks 2.9-4.0%; design log v49).
template <class T, int NK, int kRanks>
constexpr bool kWsStatePairs = std::is_same_v<T, cutlass::bfloat16_t> && (NK == 1 || (kWsBlockSlots<NK> && kRanks == 1));

// A chunk's meta (cum, dt', weights) in one TMA load of maps.meta instead of three bulk copies, at
// one rank: there the state warpgroup (chunk slots) or block 0's refill (block slots) issues it
// on the walk's chain (chunk slots 0.7-1.5%, one-rank block slots 0.4-1.1% faster; design log v54).
// Two ranks load it off the chain, two chunks ahead, and keep the three copies (a form with the
// map there measured -0.4% to +1.9%).
template <int kRanks>
constexpr bool kWsMetaMap = kRanks == 1;

template <class T, int NK, int HP, int kRanks = 1>
struct WsLayout {
  using F = Fused<T, NK, 1>;
  static constexpr int kQ = 128;
  static constexpr bool kBlockSlots = kWsBlockSlots<NK>;
  // block m: C_m, B_m slices, X_m of each head (block slots: X in a ring of its own, below)
  static constexpr int kBlockBytes = (2 * NK + (kBlockSlots ? 0 : HP)) * F::kSlice;
  static constexpr int kMetaBytes = 3 * kQ * 4;                   // a head's cum, dt' (then e), w
  // A slot: blocks 0, 1 and the meta of a chunk; with block slots one block, and the chunks'
  // meta in a ring after both slots, chunk li's at li % kMetaSlots: one rank two (it lands with
  // block 0; block 1's output reads it after block 0's slot has been refilled), two ranks four
  // (on barriers of their own, see kClaims).
  static constexpr int kSlotBytes =
      kBlockSlots ? kBlockBytes : (2 * kBlockBytes + HP * kMetaBytes + 1023) / 1024 * 1024;
  static constexpr int kMetaSlots = kRanks > 1 ? 4 : 2;
  static constexpr int kMetaRing = kBlockSlots ? (kMetaSlots * HP * kMetaBytes + 1023) / 1024 * 1024 : 0;
  static constexpr int kHsBytes = HP * NK * F::kSlice;  // a copy of H_s: head i at i NK slices
  static constexpr int kStageBytes = kM * kN * 2;       // an output block in T
  // Block slots: the X tiles in a ring of three, tile n (2 li + m: block m of the chunk of load
  // index li) at n % 3, so that a block's next X lands while its output still stages in this one.
  static constexpr int kXRing = 2 * kSlotBytes + kMetaRing;
  static constexpr int kXRingBytes = kBlockSlots ? 3 * F::kSlice : 0;
  static constexpr int x_tile(int n) { return kXRing + (n % 3) * F::kSlice; }
  static constexpr uint32_t x_phase(int n) { return static_cast<uint32_t>(n / 3) & 1u; }  // (of its barriers)
  // [slot 0][slot 1]([meta 0][meta 1][X ring])[H_s 0][H_s 1][stage: 2 HP, output warpgroup w head i at
  // HP w + i; none with block slots][D: HP x 64][mbarriers: 8, 14 with block slots; two ranks 24,
  // then the refill claims and the loads' and state stores' origins: 30 words]
  static constexpr int kHs = 2 * kSlotBytes + kMetaRing + kXRingBytes;
  static constexpr int kStage = kHs + 2 * kHsBytes;
  static constexpr int kD = kStage + (kBlockSlots ? 0 : 2 * HP * kStageBytes);
  static_assert(!kBlockSlots || HP == 1, "block slots: one head per CTA");
  static_assert(kRanks == 1 || kBlockSlots, "two ranks: block slots");
  static constexpr int kBars = kD + HP * 64 * 4;
  static constexpr int kBytes = 1024 + kBars + (kBlockSlots ? (kRanks > 1 ? 30 : 14) : 8) * 8;
};

// This thread's lane, read from its special register where it is used.
__device__ __forceinline__ int lane_id_now() {
  int lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
}

// The parts of a chunk's loads: its input tiles and its meta (chunk_cumsum's outputs).
constexpr int kInputTiles = 1, kMetaPart = 2;

// A warpgroup's registers from the launch's 168 (3 x 128 threads in 64K) to N: decreased by the
// roles that give registers up, increased by the others (setmaxnreg.inc waits for them).
constexpr int kWsEntryRegs = 65536 / (3 * kThreads) / 8 * 8;
template <int N>
__device__ __forceinline__ void setmaxnreg_to() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 in 24..256");
  if constexpr (N < kWsEntryRegs) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
  else if constexpr (N > kWsEntryRegs) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
static_assert(kWsStateRegs<1, 1> + 2 * kWsOutRegs<1> <= 3 * kWsEntryRegs &&
                  kWsStateRegs<1, 2> + 2 * kWsOutRegs<1> <= 3 * kWsEntryRegs &&
                  kWsStateRegs<4, 1> + 2 * kWsOutRegs<4> <= 3 * kWsEntryRegs,
              "the warpgroups' registers within the launch's");

template <class T, int NK, int HP, int kRanks>
__global__ void __launch_bounds__(3 * kThreads, 1)
    fused_walk_ws_kernel(const SsdParams p, const __grid_constant__ ChunkInputMaps maps,
                         const __grid_constant__ CUtensorMap out_map) {
  using F = Fused<T, NK, 1>;
  using Tr = typename F::Tr;
  using L = WsLayout<T, NK, HP, kRanks>;
  constexpr int q = L::kQ;
  constexpr bool kBlocks = L::kBlockSlots;
  // Two ranks: B_m is refilled by whichever of its readers releases it last, C_m by its block's
  // warpgroup, the meta apart (below; one rank: the order of every part, measured 4.5-5.6%
  // slower there with this protocol, 1.8-2.3% faster on two ranks, design log v46).
  constexpr bool kClaims = kBlocks && kRanks > 1;
  constexpr bool kStatePairs = kWsStatePairs<T, NK, kRanks>;
  constexpr bool kMetaMap = kWsMetaMap<kRanks>;
  // (kStatePairs: the meta's weights as chunk_cumsum's pairs where it stores them, else fp32)
  const bool pairs_in = kStatePairs && p.wst_pairs != nullptr;
  const float* w_in = pairs_in ? p.wst_pairs : p.wst;
  // The CTA's rank and its first state column (read where used, as in fused_walk_kernel).
  auto rank_now = [&]() { return kRanks == 1 ? 0 : static_cast<int>(tma::cluster_rank()); };
  auto n_base = [&]() { return rank_now() * NK * kN; };
  extern __shared__ __align__(1024) char smem_raw[];
  char* smem = smem_raw + ((1024u - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u);
  const int tid = threadIdx.x, lane = tid % 32, wg = tid / kThreads, wtid = tid % kThreads;
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * HP;  // (heads h0 .. h0 + HP - 1, of one group)
  const FusedCta cta = fused_cta(p, blockIdx.z, gridDim.z / static_cast<unsigned>(p.nseg));
  const int seg = cta.seg;
  const Walk walk = make_walk(p, cta.walk);
  const int64_t grp = h0 / p.heads_per_group;
  bool a_grows[HP];  // (see fused_walk_kernel)
#pragma unroll
  for (int i = 0; i < HP; ++i) a_grows[i] = p.A[(h0 + i) * p.A_s] > 0.0f;
  const SegmentRange range = segment_range(p, seg, walk.nchunks);
  const int64_t c_begin = range.begin, c_end = range.end;
  if (seg > 0 && c_begin >= walk.nchunks) return;
  const int n_local = static_cast<int>(c_end - c_begin);
  // SsdParams::prewalk: the second segment walks the first's chunks state-only first. The chunk
  // buffer's slots and phases count every chunk loaded (li = pre + c_rel), H_s's the walked ones.
  // (one head per CTA: with two, the state warpgroup spilled; chunk slots only, the launch
  // refuses it with block slots)
  const int pre = !kBlocks && HP == 1 && p.prewalk && seg > 0 ? static_cast<int>(c_begin) : 0;
  const int n_total = pre + n_local;
  const int64_t c_first = c_begin - pre;

  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + L::kBars);
  // (every thread arrives where it has read or written: each one's accesses are then ordered
  // before the waiter's by the mbarrier itself)
  // (block slots: slot m holds block m; its phase is the chunk's parity)
  uint64_t* full = bars;          // [slot]: the chunk's tiles and weights landed (TMA bytes)
  uint64_t* empty = bars + 2;     // [slot]: every thread that reads the slot is done with it
  uint64_t* hs_full = bars + 4;   // [slot]: H_s written (the state warpgroup)
  uint64_t* hs_empty = bars + 6;  // [slot]: C H^T has read it (the output warpgroups)
  // Block slots: full and empty are block m's C_m and B_m (block 0's with the chunk's meta). With
  // kClaims they are B_m's alone, full_c and empty_c C_m's, which only block m's warpgroup
  // reads: B_m's readers (the state warpgroup's update, block m's C B^T; with a_grows block 1's
  // C_1 B_0^T) release it by warps, and the warp whose release completes the phase refills it
  // (claim_b: the load index last refilled), so that no warpgroup waits for another's release
  // to issue the load; full_m[li % 4]: chunk li's meta landed in its ring. H_s copy m is
  // released once block m's C H^T has read it (copy 0 once block 1's has too; two ranks: the
  // receiver's once it has read the partial there).
  // Block slots: the X ring's, [n % 3] for tile n: full_x its bytes, empty_x the readers of tile n
  // but its block's warpgroup (the state warpgroup, and the other block's: block 1 reads X_0 with
  // a_grows and arrives either way, block 0 arrives for X_1 without reading it) are done with it;
  // its block's warpgroup then stages the output in it and refills it with tile n + 3.
  uint64_t* full_x = kBlocks ? bars + 8 : nullptr;
  uint64_t* empty_x = kBlocks ? bars + 11 : nullptr;
  // Two ranks: part_full, the other rank's partial of this rank's block landed (its bytes, with one
  // arrival by the receiving warpgroup); part_free, the other rank's warpgroup of the block this
  // rank sends has read the H_s copy that takes it (128 arrivals from there).
  uint64_t* part_full = kRanks > 1 ? bars + 14 : nullptr;
  uint64_t* part_free = kRanks > 1 ? bars + 15 : nullptr;
  uint64_t* full_c = kClaims ? bars + 16 : nullptr;
  uint64_t* empty_c = kClaims ? bars + 18 : nullptr;
  uint64_t* full_m = kClaims ? bars + 20 : nullptr;
  int* claim_b = kClaims ? reinterpret_cast<int*>(bars + 24) : nullptr;
  // (kClaims: the load origin of C_m and B_m, chunk 0's token, the group and the row, and of the
  // meta, chunk 0's offset, read from here by the refills, which then keep no registers for them)
  int* b_origin = kClaims ? reinterpret_cast<int*>(bars + 25) : nullptr;
  int64_t* meta_origin = kClaims ? reinterpret_cast<int64_t*>(bars + 27) : nullptr;
  // (kClaims: the final states' offset, -1 where this CTA stores none, and the chunk states' of
  // chunk c_begin, read by the state warpgroup where it stores them: kept in registers through
  // the walk, values spilled)
  int64_t* fin_origin = kClaims ? reinterpret_cast<int64_t*>(bars + 28) : nullptr;
  int64_t* st_origin = kClaims ? reinterpret_cast<int64_t*>(bars + 29) : nullptr;
  float* s_d = reinterpret_cast<float*>(smem + L::kD);  // [head][p]
  if (tid == 0) {
    for (int s = 0; s < 2; ++s) {
      tma::mbar_init(full + s, 1);
      // (block slots: block 1 not read by block 0's warpgroup; kClaims: by warps, B_0 read by
      // block 1's warpgroup with a_grows only)
      tma::mbar_init(empty + s, kClaims ? (s == 0 && a_grows[0] ? 3 : 2) * 4 : (kBlocks && s == 1 ? 2 : 3) * kThreads);
      tma::mbar_init(hs_full + s, kThreads);
      tma::mbar_init(hs_empty + s, (kBlocks && s == 1 ? 1 : 2) * kThreads);
    }
    if constexpr (kBlocks) {
      for (int s = 0; s < 3; ++s) {
        tma::mbar_init(full_x + s, 1);
        tma::mbar_init(empty_x + s, 2 * kThreads);
      }
    }
    if constexpr (kClaims) {
      for (int s = 0; s < 4; ++s) tma::mbar_init(full_m + s, 1);
      for (int s = 0; s < 2; ++s) {
        tma::mbar_init(full_c + s, 1);
        tma::mbar_init(empty_c + s, kThreads);
        claim_b[s] = 0;
      }
      b_origin[0] = static_cast<int>(walk_chunk(p, walk, c_first).tok0);
      b_origin[1] = static_cast<int>(grp);
      b_origin[2] = static_cast<int>(walk.row);
      *meta_origin = cum_offset(p, walk.row, h0, walk.g0 + c_first);
      *fin_origin = p.final_states != nullptr && c_end == walk.nchunks ? walk.walk * p.fin_sb + h0 * p.fin_sh : -1;
      *st_origin = walk.row * p.st_sb + (walk.g0 + c_begin) * p.st_sc + h0 * p.st_sh;
    }
    if constexpr (kRanks > 1) {
      tma::mbar_init(part_full, 1);
      tma::mbar_init(part_free, kThreads);
    }
    tma::fence_mbar_init();
  }
  if (p.D != nullptr && tid < HP * 64) s_d[tid] = p.D[(h0 + tid / 64) * p.D_sh + (tid % 64) * p.D_sp];
  if constexpr (kRanks > 1) tma::cluster_sync();  // (the other rank's mbarriers are initialised)
  else __syncthreads();
  auto slot_of = [&](int i) { return kBlocks ? smem : smem + (i & 1) * L::kSlotBytes; };
  // Where cum_of finds chunk li's meta: in its slot, or (block slots) in the ring after the slots.
  auto meta_buf = [&](const char* buf, int li) -> const char* {
    return kBlocks ? smem + (li % L::kMetaSlots) * HP * L::kMetaBytes : buf;
  };
  // The parity of chunk li's phase of its slot's barriers (chunk slots: every other chunk's).
  auto slot_ph = [](int li) { return kBlocks ? static_cast<uint32_t>(li) & 1u : static_cast<uint32_t>(li >> 1) & 1u; };
  auto hs_of = [&](int c_rel, int i) { return smem + L::kHs + (c_rel & 1) * L::kHsBytes + i * NK * F::kSlice; };
  // head i's cum, dt' (e) and w of the chunk in `buf`
  auto cum_of = [&](const char* buf, int i) {
    return reinterpret_cast<const float*>(buf + 2 * L::kBlockBytes + i * L::kMetaBytes);
  };
  auto x_of = [&](const char* buf, int mu, int i) { return buf + mu * L::kBlockBytes + (2 * NK + i) * F::kSlice; };

  // Block slots: C_m and B_m of the chunk of load index li into slot m (block 0 with the chunk's
  // meta, into the ring), and its X_m, each on its part's full barrier.
  // (parts: kInputTiles, kMetaPart or both; see the first loads below)
  auto load_cb = [&](int li, int m, int parts = kInputTiles | kMetaPart) {
    const ChunkInfo ci = walk_chunk(p, walk, c_first + li);
    char* blk = smem + m * L::kBlockBytes;
    uint64_t* bar = full + m;
    const int tok = static_cast<int>(ci.tok0) + m * kM, row = static_cast<int>(walk.row), n0 = n_base();
    if (parts & kInputTiles) {
      tma::mbar_arrive_expect(bar, 2 * NK * F::kSlice + (m == 0 ? 3 * q * 4 : 0));
      if (has_slice_maps(p)) {  // (one load for C_m's 4 slices, one for B_m's: see ChunkInputMaps)
        tma::load_5d(&maps.C_slices, bar, blk, 0, tok, n0 / kN, static_cast<int>(grp), row);
        tma::load_5d(&maps.B_slices, bar, blk + NK * F::kSlice, 0, tok, n0 / kN, static_cast<int>(grp), row);
      } else {
#pragma unroll
        for (int ks = 0; ks < NK; ++ks) {
          tma::load_4d(&maps.C, bar, blk + ks * F::kSlice, n0 + ks * kN, tok, static_cast<int>(grp), row);
          tma::load_4d(&maps.B, bar, blk + (NK + ks) * F::kSlice, n0 + ks * kN, tok, static_cast<int>(grp), row);
        }
      }
    }
    if (m == 0 && (parts & kMetaPart)) {
      float* meta = const_cast<float*>(cum_of(meta_buf(nullptr, li), 0));
      if constexpr (kMetaMap) {
        tma::load_3d(&maps.meta, bar, meta, 0, static_cast<int>(carry_offset(p, walk.row, h0, walk.g0 + c_first + li)), 0);
      } else {
        const int64_t off = cum_offset(p, walk.row, h0, walk.g0 + c_first + li);
        tma::load_bulk(meta, p.cum + off, q * 4, bar);
        tma::load_bulk(meta + q, p.dtp + off, q * 4, bar);
        tma::load_bulk(meta + 2 * q, w_in + off, q * 4, bar);
      }
    }
  };
  // kClaims: B_m of the chunk of load index li into slot m on full[m] (its NK slices after C_m's),
  // C_m on full_c[m], the chunk's meta into its ring on full_m.
  // (map: the 4-D map, slices: the same tensor's slice map, ChunkInputMaps)
  auto load_slices = [&](const CUtensorMap* map, const CUtensorMap* slices, uint64_t* bar, int first, int li, int m) {
    const volatile int* o = b_origin;
    char* blk = smem + m * L::kBlockBytes;
    const int tok = o[0] + li * q + m * kM, g = o[1], row = o[2], n0 = n_base();
    tma::mbar_arrive_expect(bar, NK * F::kSlice);
    if (has_slice_maps(p)) {
      tma::load_5d(slices, bar, blk + first * F::kSlice, 0, tok, n0 / kN, g, row);
    } else {
#pragma unroll
      for (int ks = 0; ks < NK; ++ks) tma::load_4d(map, bar, blk + (first + ks) * F::kSlice, n0 + ks * kN, tok, g, row);
    }
  };
  auto load_b = [&](int li, int m) { load_slices(&maps.B, &maps.B_slices, full + m, NK, li, m); };
  auto load_c = [&](int li, int m) { load_slices(&maps.C, &maps.C_slices, full_c + m, 0, li, m); };
  auto load_meta = [&](int li) {
    const int64_t off = *static_cast<const volatile int64_t*>(meta_origin) + static_cast<int64_t>(li) * p.chunk;
    float* meta = const_cast<float*>(cum_of(meta_buf(nullptr, li), 0));
    uint64_t* bar = full_m + li % 4;
    tma::mbar_arrive_expect(bar, 3 * q * 4);
    tma::load_bulk(meta, p.cum + off, q * 4, bar);
    tma::load_bulk(meta + q, p.dtp + off, q * 4, bar);
    tma::load_bulk(meta + 2 * q, w_in + off, q * 4, bar);
  };

  // kClaims: this warp's release of B_m of the chunk of load index li (its lanes' reads
  // done: wgmma waited for, the warp synchronised); the warp whose arrival completes the phase,
  // or one that sees it completed, claims the refill with chunk li + 1's.
  auto release_b = [&](int li, int m) {
    __syncwarp();
    if (lane == 0) {
      tma::mbar_arrive(empty + m);
      if (li + 1 < n_total && tma::mbar_test(empty + m, static_cast<uint32_t>(li) & 1u) &&
          atomicCAS(claim_b + m, li, li + 1) == li) {
        load_b(li + 1, m);
      }
    }
    __syncwarp();
  };
  // kClaims: C_m of chunk li released by its block's warpgroup and refilled with chunk li + 1's.
  auto release_c = [&](int li, int m) {
    tma::mbar_arrive(empty_c + m);
    if (wtid == 0 && li + 1 < n_total) {
      tma::mbar_wait(empty_c + m, static_cast<uint32_t>(li) & 1u);
      load_c(li + 1, m);
      // (block 0: chunk li + 2's meta into the ring slot of chunk li - 2, which every reader is
      // done with: the state warpgroup wrote this chunk's H_s(start) after both output
      // warpgroups' releases of chunk li - 1's, each made after its last read of chunk li - 2's)
      if (m == 0 && li + 2 < n_total) load_meta(li + 2);
    }
    __syncwarp();
  };
  // (tile n: X of block n % 2 of the chunk of load index n / 2, into the ring)
  auto load_x = [&](int n) {
    const ChunkInfo ci = walk_chunk(p, walk, c_first + n / 2);
    uint64_t* bar = full_x + n % 3;
    tma::mbar_arrive_expect(bar, F::kSlice);
    tma::load_4d(&maps.x, bar, smem + L::x_tile(n), 0, static_cast<int>(ci.tok0) + (n % 2) * kM, static_cast<int>(h0),
                 static_cast<int>(walk.row));
  };

  const int row32 = static_cast<int>(walk.row), grp32 = static_cast<int>(grp), h32 = static_cast<int>(h0);
  // Chunk slots: chunk i's tiles and meta into its slot (parts as load_cb's).
  auto issue_chunk = [&](int i, int parts = kInputTiles | kMetaPart) {
    const ChunkInfo ci = walk_chunk(p, walk, c_first + i);
    char* buf = slot_of(i);
    uint64_t* bar = full + (i & 1);
    const int tok = static_cast<int>(ci.tok0);
    if (parts & kInputTiles) {
      tma::mbar_arrive_expect(bar, 2 * L::kBlockBytes + HP * 3 * q * 4);
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        char* blk = buf + m * L::kBlockBytes;
#pragma unroll
        for (int ks = 0; ks < NK; ++ks) {
          tma::load_4d(&maps.C, bar, blk + ks * F::kSlice, ks * kN, tok + m * kM, grp32, row32);
          tma::load_4d(&maps.B, bar, blk + (NK + ks) * F::kSlice, ks * kN, tok + m * kM, grp32, row32);
        }
#pragma unroll
        for (int j = 0; j < HP; ++j) {
          tma::load_4d(&maps.x, bar, const_cast<char*>(x_of(buf, m, j)), 0, tok + m * kM, h32 + j, row32);
        }
      }
    }
    if (parts & kMetaPart) {
      if constexpr (kMetaMap) {
        const int slot0 = static_cast<int>(carry_offset(p, walk.row, h0, walk.g0 + c_first + i));  // (head h0 + j: + j nchunks)
#pragma unroll
        for (int j = 0; j < HP; ++j) {
          tma::load_3d(&maps.meta, bar, const_cast<float*>(cum_of(buf, j)), 0, slot0 + j * static_cast<int>(p.nchunks), 0);
        }
      } else {
        const int64_t off0 = cum_offset(p, walk.row, h0, walk.g0 + c_first + i);  // (head h0 + j: + j nchunks Q)
#pragma unroll
        for (int j = 0; j < HP; ++j) {
          const int64_t off = off0 + j * p.nchunks * q;
          float* meta = const_cast<float*>(cum_of(buf, j));
          tma::load_bulk(meta, p.cum + off, q * 4, bar);
          tma::load_bulk(meta + q, p.dtp + off, q * 4, bar);
          tma::load_bulk(meta + 2 * q, w_in + off, q * 4, bar);
        }
      }
    }
  };
  // The first chunks' loads: the input tiles (C, B, x) before the wait for the kernel before,
  // which does not write them (the segment sums or chunk_cumsum, each started only after its own
  // predecessor had ended), the meta (chunk_cumsum's outputs) after it.
  auto first_loads = [&](int parts) {
    if constexpr (kClaims) {
      if (n_total > 0 && (parts & kInputTiles)) {
        load_b(0, 0);
        load_c(0, 0);
        load_x(0);
        load_b(0, 1);
        load_c(0, 1);
        load_x(1);
      }
      if (parts & kMetaPart) {
        if (n_total > 0) load_meta(0);
        if (n_total > 1) load_meta(1);
      }
      if (n_total > 1 && (parts & kInputTiles)) load_x(2);
    } else if constexpr (kBlocks) {
      if (n_total > 0) {
        load_cb(0, 0, parts);
        if (parts & kInputTiles) load_x(0);
        load_cb(0, 1, parts);
        if (parts & kInputTiles) load_x(1);
      }
      if (n_total > 1 && (parts & kInputTiles)) load_x(2);
    } else {
      if (n_total > 0) issue_chunk(0, parts);
      if (n_total > 1) issue_chunk(1, parts);
    }
  };
  if (tid == 0) first_loads(kInputTiles);
  pdl_wait_primary();  // (launched early behind the segment sums or chunk_cumsum, see fused_walk_kernel)
  if (tid == 0) first_loads(kMetaPart);

  if (wg == 0) {
    // ================= the state warpgroup
    setmaxnreg_to<kWsStateRegs<NK, HP>>();
    typename F::MmaUpd mma_up;
    auto thr_up = mma_up.get_slice(wtid);
    using HAcc = decltype(partition_fragment_C(mma_up, Shape<_64, Int<F::kN_state>>{}));
    HAcc hacc[HP];
#pragma unroll
    for (int i = 0; i < HP; ++i) {
      const int64_t h = h0 + i;
      if ((seg == 0 || pre > 0) && p.init != nullptr) {
        const void* src = static_cast<const char*>(p.init) +
                          (walk.walk * p.init_sb + h * p.init_sh) * (int64_t)dtype_size_dev(p.init_dtype);
        st::load_tile<1>(hacc[i], src, p.init_dtype, p.init_sp, 0, n_base(), p);
      } else if (seg > 0 && pre == 0) {
        // (not unrolled: the state warpgroup's 144 registers)
        state_from_sums<true, 1>(hacc[i], p, (walk.walk * p.nheads + h) * sums_per_walk_head(p), seg * p.sum_split,
                                 rank_now() * NK, wtid);
      } else {
        clear(hacc[i]);
      }
    }
    using XFrag = decltype(make_tensor<T>(partition_shape_A(mma_up, Shape<_64, Int<kM>>{})));
    XFrag xw;
    Tensor x_tok = thr_up.partition_A(make_identity_tensor(Shape<_64, Int<kM>>{}));
    const float* carry_walk = p.carry + carry_offset(p, walk.row, h0, walk.g0);  // (head h0 + i: + i nchunks)
    float carry_next[HP];
#pragma unroll
    for (int i = 0; i < HP; ++i) carry_next[i] = n_local > 0 ? carry_walk[i * p.nchunks + c_begin] : 0.0f;
    // xw *= w of block mu's tokens (w: the chunk's weights, as pairs where kStatePairs)
    auto scale_w = [&](const float* w, int mu) {
      if constexpr (kStatePairs) {
        scale_by_weight_pairs(xw, [&](int e) { return static_cast<int>(get<1>(x_tok(e))); }, w + mu * kM);
      } else {
        scale_xt<T>(xw, x_tok, w + mu * kM);
      }
    };
    // kStatePairs: token wtid's weight w into the chunk's weights (w_chunk) as its pair slot (hi
    // at the even token of the pair, lo at the odd one; the warp's lanes all call it); the
    // warpgroup's barrier before reading.
    auto store_w = [&](float* w_chunk, float w) {
      const float wn = __shfl_xor_sync(0xffffffffu, w, 1);
      const bool odd = (wtid & 1) != 0;
      const float2 hl = weight_pair(odd ? wn : w, odd ? w : wn);
      w_chunk[wtid] = odd ? hl.y : hl.x;
    };
    // The update H = H * s + (X_mu * w)^T B_mu with block mu's tokens for each head in turn (w:
    // the weights' array of block mu, from registers through the transposing ldmatrix; issued and
    // waited for: one operand fragment, as the registers of two heads' states allow).
    auto update = [&](const char* buf, int mu, const float (&s)[HP]) {
      Tensor sBn = make_tensor(
          make_smem_ptr(reinterpret_cast<T*>(const_cast<char*>(buf) + mu * L::kBlockBytes + NK * F::kSlice)),
          typename F::LayoutBn{});
#pragma unroll
      for (int i = 0; i < HP; ++i) {
        warpgroup_fence_operand(hacc[i]);
#pragma unroll
        for (int v = 0; v < F::kAccVals; ++v) hacc[i](v) *= s[i];
        load_xt<T>(mma_up, wtid, xw, x_of(buf, mu, i));
        scale_w(cum_of(buf, i) + 2 * q, mu);
        issue_update_wgmma(mma_up, thr_up, xw, sBn, hacc[i]);
        warpgroup_wait<0>();
        warpgroup_fence_operand(hacc[i]);
      }
    };
    // The same with the block's X tile at `x` and the weights of the chunk's meta at `meta` (block
    // slots: both in their rings).
    auto update_w = [&](const char* buf, const char* x, const float* meta, int mu, const float (&s)[HP]) {
      Tensor sBn = make_tensor(
          make_smem_ptr(reinterpret_cast<T*>(const_cast<char*>(buf) + mu * L::kBlockBytes + NK * F::kSlice)),
          typename F::LayoutBn{});
      warpgroup_fence_operand(hacc[0]);
#pragma unroll
      for (int v = 0; v < F::kAccVals; ++v) hacc[0](v) *= s[0];
      load_xt<T>(mma_up, wtid, xw, x);
      scale_w(meta + 2 * q, mu);
      issue_update_wgmma(mma_up, thr_up, xw, sBn, hacc[0]);
      warpgroup_wait<0>();
      warpgroup_fence_operand(hacc[0]);
    };
    // H_s slot k = H in the compute type, once both output warpgroups' C H^T have read the slot's
    // previous copy (phase: the chunk's parity).
    auto write_hs = [&](int k, uint32_t hph) {
      tma::mbar_wait(hs_empty + k, hph ^ 1u);
#pragma unroll
      for (int i = 0; i < HP; ++i) store_state_copy<T, 1, true>(hacc[i], hs_of(k, i), lane);
      fence_async_shared();
    };
    // The first segment's chunks, state only: H = H * carry + (X_mu * w)^T B_mu with the chunk's
    // own weights w (to its last token, as chunk_cumsum stored them); the refill as below.
#pragma unroll 1
    for (int i = 0; i < pre; ++i) {
      float s_pre[HP], s_one[HP];
#pragma unroll
      for (int j = 0; j < HP; ++j) {
        s_pre[j] = carry_walk[j * p.nchunks + c_first + i];
        s_one[j] = 1.0f;
      }
      const char* buf = slot_of(i);
      tma::mbar_wait(full + (i & 1), (i >> 1) & 1u);
      if (kStatePairs && !pairs_in) {
        float* w_chunk = const_cast<float*>(cum_of(buf, 0)) + 2 * q;  // (one head: see pre)
        store_w(w_chunk, w_chunk[wtid]);
        named_barrier_sync(1, kThreads);
      }
      if (tid == 0 && i >= 1 && i + 1 < n_total) {
        tma::mbar_wait(empty + ((i + 1) & 1), ((i - 1) >> 1) & 1u);
        issue_chunk(i + 1);
      }
      __syncwarp();
      update(buf, 0, s_pre);
      update(buf, 1, s_one);
      fence_async_shared();
      tma::mbar_arrive(empty + (i & 1));
    }
    if constexpr (kBlocks) {
      // Block slots: each block's C_m B_m (kClaims: B_m) and X tile are released after the update
      // with it; the output warpgroups refill them (kClaims: B_m whichever of its readers
      // releases it last). The chunk's meta is in its ring (meta_buf), X in the X ring.
#pragma unroll 1
      for (int c_rel = 0; c_rel < n_local; ++c_rel) {
        const int64_t c = c_begin + c_rel;
        const uint32_t ph = static_cast<uint32_t>(c_rel) & 1u;
        const float carry = carry_next[0];
        if (c_rel + 1 < n_local) carry_next[0] = carry_walk[c + 1];
        float* meta = const_cast<float*>(cum_of(meta_buf(nullptr, c_rel), 0));
        write_hs(0, ph);
        if constexpr (kClaims) tma::mbar_wait(full_m + c_rel % 4, static_cast<uint32_t>(c_rel / 4) & 1u);
        else tma::mbar_wait(full, ph);
        if (!p.walk_meta) {  // (else chunk_cumsum stored them so)
          const float e = (a_grows[0] ? 0.0f : meta[wtid]) - fast_log2(meta[q + wtid]);
          meta[q + wtid] = e;
          const bool mid = !a_grows[0] && wtid < kM;  // (warp-uniform)
          if constexpr (kStatePairs) {
            if (mid || !pairs_in) store_w(meta + 2 * q, mid ? fast_exp2(meta[kM - 1] - e) : meta[2 * q + wtid]);
          } else if (mid) {
            meta[2 * q + wtid] = fast_exp2(meta[kM - 1] - e);
          }
        }
        tma::mbar_arrive(hs_full);
        if (!p.walk_meta) named_barrier_sync(1, kThreads);  // (block 0's weights written)
        const float cum_mid = meta[kM - 1];
        const float s0[1] = {a_grows[0] ? carry : fast_exp2(cum_mid)};
        const int n0 = 2 * c_rel;  // (block 0's X tile)
        if constexpr (kClaims) tma::mbar_wait(full, ph);
        tma::mbar_wait(full_x + n0 % 3, L::x_phase(n0));
        update_w(smem, smem + L::x_tile(n0), meta, 0, s0);
        fence_async_shared();  // (block 0's X read by ldmatrix)
        if constexpr (kClaims) {
          tma::mbar_arrive(empty_x + n0 % 3);
          release_b(c_rel, 0);
        } else {
          tma::mbar_arrive(empty);
          tma::mbar_arrive(empty_x + n0 % 3);
        }
        write_hs(1, ph);
        tma::mbar_arrive(hs_full + 1);
        tma::mbar_wait(full + 1, ph);
        tma::mbar_wait(full_x + (n0 + 1) % 3, L::x_phase(n0 + 1));
        const float s1[1] = {a_grows[0] ? 1.0f : fast_exp2(meta[q - 1] - cum_mid)};
        update_w(smem, smem + L::x_tile(n0 + 1), meta, 1, s1);
        fence_async_shared();
        if constexpr (kClaims) {
          tma::mbar_arrive(empty_x + (n0 + 1) % 3);
          release_b(c_rel, 1);
        } else {
          tma::mbar_arrive(empty + 1);
          tma::mbar_arrive(empty_x + (n0 + 1) % 3);
        }
        if (p.states != nullptr) {
          const int64_t off = kClaims ? *static_cast<const volatile int64_t*>(st_origin) + c_rel * p.st_sc
                                      : walk.row * p.st_sb + (walk.g0 + c) * p.st_sc + h0 * p.st_sh;
          char* dst = static_cast<char*>(p.states) + off * (int64_t)dtype_size_dev(p.state_dtype);
          st::store_tile<1>(hacc[0], dst, p.state_dtype, p.st_sp, 0, n_base(), p);
        }
      }
    } else {
#pragma unroll 1
      for (int c_rel = 0; c_rel < n_local; ++c_rel) {
        const int64_t c = c_begin + c_rel;
        const int li = pre + c_rel;  // (the chunk's load index)
        const uint32_t ph = (li >> 1) & 1u, hph = c_rel & 1u;
        float carry[HP];
#pragma unroll
        for (int i = 0; i < HP; ++i) {
          carry[i] = carry_next[i];
          if (c_rel + 1 < n_local) carry_next[i] = carry_walk[i * p.nchunks + c + 1];
        }
        const char* buf = slot_of(li);
        // ---- H_s(start): the state entering the chunk, for block 0's output
        write_hs(0, hph);
        // e_s = cum_s - log2(dt'_s) in place of dt' (a_grows: cum taken as 0) for the output
        // warpgroups (0.7-0.9% faster than each output warpgroup computing its own copy, v24), and
        // block 0's weights to the middle of the chunk, w'_s = exp2(cum_63 - e_s), in place of w
        // (a_grows: w = dt' stays, see below); kStatePairs: every weight then as its pair slot.
        // SsdParams::walk_meta: chunk_cumsum stored them so (without this step and its barrier the
        // walk was 1.2-2.5% faster, design log v55).
        tma::mbar_wait(full + (li & 1), ph);
        if (!p.walk_meta) {
#pragma unroll
          for (int i = 0; i < HP; ++i) {
            float* meta = const_cast<float*>(cum_of(buf, i));
            const float e = (a_grows[i] ? 0.0f : meta[wtid]) - fast_log2(meta[q + wtid]);
            meta[q + wtid] = e;
            const bool mid = !a_grows[i] && wtid < kM;  // (warp-uniform)
            if constexpr (kStatePairs) {
              if (mid || !pairs_in) store_w(meta + 2 * q, mid ? fast_exp2(meta[kM - 1] - e) : meta[2 * q + wtid]);
            } else if (mid) {
              meta[2 * q + wtid] = fast_exp2(meta[kM - 1] - e);
            }
          }
        }
        tma::mbar_arrive(hs_full);
        if (!p.walk_meta) named_barrier_sync(1, kThreads);  // (block 0's weights written)
        // ---- H at the middle of the chunk: H * exp2(cum_63) + block 0's tokens. a_grows: the
        // decays within a chunk are clamped at 1 (mamba_ssm), which the split cannot express: H *
        // carry + every token with w = dt', and block 1's output works from H_s(start) (see below).
        float cum_mid[HP], s0[HP], s1[HP];
#pragma unroll
        for (int i = 0; i < HP; ++i) {
          cum_mid[i] = cum_of(buf, i)[kM - 1];
          s0[i] = a_grows[i] ? carry[i] : fast_exp2(cum_mid[i]);
        }
        update(buf, 0, s0);
        // ---- H_s(mid), for block 1's output
        write_hs(1, hph);
        tma::mbar_arrive(hs_full + 1);
        // Chunk c + 1 into the slot of chunk c - 1 once every warp is done with that one. (Here,
        // not before block 0's update: block 1's output warpgroup waits for H_s(mid), and its
        // last chunk's release is what this waits for.)
        if (tid == 0 && li >= 1 && li + 1 < n_total) {
          tma::mbar_wait(empty + ((li + 1) & 1), ((li - 1) >> 1) & 1u);
          issue_chunk(li + 1);
        }
        __syncwarp();
#pragma unroll
        for (int i = 0; i < HP; ++i) s1[i] = a_grows[i] ? 1.0f : fast_exp2(cum_of(buf, i)[q - 1] - cum_mid[i]);
        update(buf, 1, s1);
        fence_async_shared();
        tma::mbar_arrive(empty + (li & 1));
        if (p.states != nullptr) {
#pragma unroll
          for (int i = 0; i < HP; ++i) {
            char* dst = static_cast<char*>(p.states) + (walk.row * p.st_sb + (walk.g0 + c) * p.st_sc +
                                                        (h0 + i) * p.st_sh) * (int64_t)dtype_size_dev(p.state_dtype);
            st::store_tile<1>(hacc[i], dst, p.state_dtype, p.st_sp, 0, 0, p);
          }
        }
      }
    }
    if constexpr (kClaims) {
      const int64_t fin = *static_cast<const volatile int64_t*>(fin_origin);
      if (fin >= 0) {
        char* dst = static_cast<char*>(p.final_states) + fin * (int64_t)dtype_size_dev(p.fin_dtype);
        st::store_tile<1>(hacc[0], dst, p.fin_dtype, p.fin_sp, 0, n_base(), p);
      }
    } else if (p.final_states != nullptr && c_end == walk.nchunks) {
#pragma unroll
      for (int i = 0; i < HP; ++i) {
        char* dst = static_cast<char*>(p.final_states) +
                    (walk.walk * p.fin_sb + (h0 + i) * p.fin_sh) * (int64_t)dtype_size_dev(p.fin_dtype);
        st::store_tile<1>(hacc[i], dst, p.fin_dtype, p.fin_sp, 0, n_base(), p);
      }
    }
    return;
  }

  // ================= the output warpgroups
  setmaxnreg_to<kWsOutRegs<NK>>();
  const int ow = wg - 1;
  typename Tr::MmaCB mma_cb;  // (one rank: C_m B_j^T after the first, a_grows' C_1 B_1^T)
  typename Tr::MmaCH mma_ch;  // (two ranks)
  typename Tr::MmaSX mma_sx;
  auto thr_cb = mma_cb.get_slice(wtid);
  auto thr_ch = mma_ch.get_slice(wtid);
  auto thr_sx = mma_sx.get_slice(wtid);
  // One rank: C H^T and the first C_m B_j^T take C_m from registers (RS), each 64-column slice
  // loaded once by ldmatrix for both products (and both heads), rather than read from shared
  // memory by every product: a 64 x 64 SS wgmma reads 4 KB per 32 tensor cycles, the SM's whole
  // shared-memory bandwidth (1-2.3% faster at dstate 64-256, design log v47). Two slices in
  // flight: a slice's registers are reloaded once its products are done. (Two ranks keep both
  // products from shared memory: their output warpgroups spilled with it.)
  using MmaCr = decltype(make_tiled_mma(
      GMMA::rs_op_selector<T, T, float, Shape<Int<kM>, Int<kN>, Int<kN>>, GMMA::Major::K, GMMA::Major::K>()));
  MmaCr mma_cr;
  auto thr_cr = mma_cr.get_slice(wtid);
  using CFrag = decltype(make_tensor<T>(partition_shape_A(mma_cr, Shape<Int<kM>, Int<kN>>{})));
  CFrag cf[2];
  auto c_copy = make_tiled_copy_A(Copy_Atom<SM75_U32x4_LDSM_N, T>{}, mma_cr);
  auto thr_cc = c_copy.get_slice(wtid);
  Tensor cb = partition_fragment_C(mma_cb, Shape<Int<kM>, Int<kN>>{});
  using OAcc = decltype(partition_fragment_C(mma_ch, Shape<Int<kM>, Int<64>>{}));
  OAcc acc[HP];
  using SFrag = decltype(make_tensor<T>(partition_shape_A(mma_sx, Shape<Int<kM>, Int<kN>>{})));
  SFrag sf;
  constexpr int kCbVals = kM * kN / kThreads;
  const int ra = acc_row<3>(0), rb = acc_row<3>(2);
  // Block m = ow of every chunk, from H_s(start) (block 0) or H_s(mid) (block 1): S_mm X_m is the
  // only term within the chunk. a_grows: block 1 from H_s(start), with S_10 X_0 (j_first 0).
  // C_m B_j^T is the heads' own (one group), S_mj X_j each head's.
  const int m = ow;
  bool from_mid[HP];
  int j_first[HP];
  int j_low = m;  // (the least j_first)
#pragma unroll
  for (int i = 0; i < HP; ++i) {
    from_mid[i] = m == 1 && !a_grows[i];
    j_first[i] = m == 1 && a_grows[i] ? 0 : m;
    j_low = min(j_low, j_first[i]);
  }
  const int t0 = m * kM + ra, t1 = m * kM + rb;
  // (the pre-walk's chunks: released once loaded, which orders these arrivals after the
  // previous use of the slot)
#pragma unroll 1
  for (int i = 0; i < pre; ++i) {
    tma::mbar_wait(full + (i & 1), (i >> 1) & 1u);
    tma::mbar_arrive(empty + (i & 1));
  }
#pragma unroll 1
  for (int c_rel = 0; c_rel < n_local; ++c_rel) {
    const ChunkInfo ci = walk_chunk(p, walk, c_begin + c_rel);
    const int li = pre + c_rel;  // (the chunk's load index)
    const uint32_t ph = slot_ph(li), hph = c_rel & 1u;
    char* buf = slot_of(li);
    const char* meta_c = meta_buf(buf, li);
    char* blk = buf + m * L::kBlockBytes;
    auto issue_cb = [&](int j) {
      wgmma_slices<T, NK, typename Tr::LayoutC, typename Tr::LayoutB>(mma_cb, thr_cb, blk,
                                                                       buf + j * L::kBlockBytes + NK * F::kSlice, cb);
    };
    auto issue_ch = [&]() {
#pragma unroll
      for (int i = 0; i < HP; ++i) {
        wgmma_slices<T, NK, typename Tr::LayoutC, typename Tr::LayoutH>(mma_ch, thr_ch, blk,
                                                                         hs_of(from_mid[i] ? 1 : 0, i), acc[i]);
      }
    };
    // One rank: C H^T (each head) and C_m B_j^T slice by slice, C_m's slice in registers (above):
    // a wgmma group per slice; opens and commits its own batches.
    auto issue_ch_cb = [&](int j) {
#pragma unroll
      for (int ks = 0; ks < NK; ++ks) {
        if (ks >= 2) warpgroup_wait<1>();  // (slice ks - 2's products have read its registers)
        CFrag& a = cf[ks % 2];
        Tensor sC = make_tensor(make_smem_ptr(reinterpret_cast<const T*>(blk + ks * F::kSlice)), typename Tr::LayoutC{});
        copy(c_copy, thr_cc.partition_S(sC), thr_cc.retile_D(a));
        warpgroup_fence_operand(a);
        warpgroup_arrive();
#pragma unroll
        for (int i = 0; i < HP; ++i) {
          Tensor sH = make_tensor(make_smem_ptr(reinterpret_cast<const T*>(hs_of(from_mid[i] ? 1 : 0, i) + ks * F::kSlice)),
                                  typename Tr::LayoutH{});
          wgmma_k(mma_cr, a, thr_cr.partition_fragment_B(sH), acc[i], ks == 0);
        }
        Tensor sB = make_tensor(
            make_smem_ptr(reinterpret_cast<const T*>(buf + j * L::kBlockBytes + (NK + ks) * F::kSlice)),
            typename Tr::LayoutB{});
        wgmma_k(mma_cr, a, thr_cr.partition_fragment_B(sB), cb, ks == 0);
        warpgroup_commit_batch();
        warpgroup_fence_operand(a);
      }
    };
    // (each head's cum at the thread's rows, and its factors of C H^T: exp2(cum_t - cum at H_s))
    float ct0[HP], ct1[HP], f0[HP], f1[HP];
    auto factors = [&]() {
#pragma unroll
      for (int i = 0; i < HP; ++i) {
        const float* s_cum = cum_of(meta_c, i);
        const float c_ref = from_mid[i] ? s_cum[kM - 1] : 0.0f;
        ct0[i] = s_cum[t0];
        ct1[i] = s_cum[t1];
        f0[i] = fast_exp2(ct0[i] - c_ref);
        f1[i] = fast_exp2(ct1[i] - c_ref);
      }
    };
    // S_mj = C_m B_j^T * exp2(cum_t - e_s), s <= t on the diagonal block (as fused_walk_kernel)
    float decay[kCbVals];
    auto decay_for = [&](int i, int j) {
      const float* s_e = cum_of(meta_c, i) + q;  // (e_s, written by the state warpgroup before H_s is signalled)
      if (j == m) {
        s_decays<true, false>(decay, s_e + j * kN, a_grows[i], ct0[i], ct1[i], t0 - j * kN, t1 - j * kN, 0, 0, lane);
      } else {
        s_decays<false, false>(decay, s_e + j * kN, a_grows[i], ct0[i], ct1[i], t0 - j * kN, t1 - j * kN, 0, 0, lane);
      }
    };
    auto make_s = [&]() {
#pragma unroll
      for (int v = 0; v < kCbVals; ++v) sf(v) = from_float<T>(cb(v) * decay[v]);
      warpgroup_fence_operand(sf);
    };
    auto issue_sx = [&](int i, int j) {
      const char* x_j = kBlocks ? smem + L::x_tile(2 * li + j) : x_of(buf, j, i);
      Tensor sX = make_tensor(make_smem_ptr(reinterpret_cast<const T*>(x_j)), typename Tr::LayoutX{});
      wgmma_k(mma_sx, sf, thr_sx.partition_fragment_B(sX), acc[i], false);
    };
    // (one head: its first decays under C H^T and C B^T; two: each head's decays right before its
    // S, so that the compiler need not hold all of them with both accumulators)
    // (block slots: S straight from C B^T once it has landed, s_from_cb: the registers of the
    // three-warpgroup split at dstate 256)
    const bool decay_ready = HP == 1 && j_first[0] == j_low && !kBlocks;
    if constexpr (kBlocks) {
      tma::mbar_wait(full + m, ph);
      if constexpr (kClaims) {
        tma::mbar_wait(full_c + m, ph);
        tma::mbar_wait(full_m + li % 4, static_cast<uint32_t>(li / 4) & 1u);
        // Block 1 with a_grows reads B_0, X_0 and H_s(start) too (released below once read);
        // otherwise nothing of block 0's. (Each release follows the wait for what it releases, so
        // that it counts for this chunk's phase.)
        if (m == 1 && j_low == 0) tma::mbar_wait(full, ph);
      } else if (m == 1) {
        // Block 1 reads the chunk's meta, which lands with block 0's C_0 and B_0, and with
        // a_grows B_0, X_0 and H_s(start) (released below once read); otherwise nothing of block
        // 0's. (Each release follows the wait for what it releases, so that it counts for this
        // chunk's phase.)
        tma::mbar_wait(full, ph);
        if (j_low == 1) tma::mbar_arrive(empty);
      }
      // (block 0 for X_1, which it does not read: the ring's previous tile in that slot, X_0 of
      // the chunk before, was waited for by this warpgroup, which orders the arrival after it)
      if (m == 0) tma::mbar_arrive(empty_x + (2 * li + 1) % 3);
      // Block m waits for H_s slot m, block 1 with a_grows too, where it reads H_s(start) (written
      // before H_s(mid), whose signal releases both): its release of H_s(mid) below must follow
      // the state warpgroup's write of this chunk's. (Released earlier, the releases of two chunks
      // could complete H_s(mid)'s phases before the state warpgroup waits for the first, and its
      // parity wait would never return: scripts/ws_barrier_model.py.)
      tma::mbar_wait(hs_full + m, hph);
      // (X_0 landed before the state's update with it, which H_s(mid) follows)
      if (m == 1) {
        tma::mbar_wait(full_x + (2 * li) % 3, L::x_phase(2 * li));
        if (j_low == 1) {
          tma::mbar_arrive(empty_x + (2 * li) % 3);
          tma::mbar_arrive(hs_empty);
        }
      }
#pragma unroll
      for (int i = 0; i < HP; ++i) warpgroup_fence_operand(acc[i]);
      warpgroup_fence_operand(cb);
      // Two ranks: C H^T in a wgmma group of its own, so that H_s copy m is released (the
      // receiver: part_free) once C H^T is done rather than C B^T too (v40; with one rank, the
      // output warpgroups then spilled).
      if constexpr (kRanks > 1) {
        warpgroup_arrive();
        issue_ch();
        warpgroup_commit_batch();
        issue_cb(j_low);
        warpgroup_commit_batch();
      } else {
        issue_ch_cb(j_low);
      }
      factors();
      if constexpr (kRanks > 1) {
        warpgroup_wait<1>();
#pragma unroll
        for (int i = 0; i < HP; ++i) warpgroup_fence_operand(acc[i]);
        if (m == 1 && j_low == 0) {
          tma::mbar_arrive(hs_empty);
          if (rank_now() == 0) named_barrier_arrive(2, 2 * kThreads);  // (block 0 receives there)
        }
        if (m != rank_now()) {
          tma::mbar_arrive(hs_empty + m);
        } else {
          // Slices 1-2 of H_s copy m may take the other rank's partial (block 0 with a_grows: once
          // block 1 has read H_s(start) too).
          if (m == 0 && a_grows[0]) named_barrier_sync(2, 2 * kThreads);
          tma::mbar_arrive_cluster(tma::cluster_addr(part_free, 1 - m));
        }
        warpgroup_wait<0>();
        warpgroup_fence_operand(cb);
        // C B^T has read B_m (a_grows, block 1: B_0; B_1 after C_1 B_1^T below) and C_m (a_grows,
        // block 1: C_1 again below)
        release_b(li, j_low);
        if (m == 0 || j_low == 1) release_c(li, m);
      } else {
        warpgroup_wait<0>();
        warpgroup_fence_operand(cb);
#pragma unroll
        for (int i = 0; i < HP; ++i) warpgroup_fence_operand(acc[i]);
        // C H^T and C B^T have read C_m, B_m (a_grows, block 1: B_0, and C_m again in C_1 B_1^T
        // below) and H_s: the C_m and B_m part refilled, and H_s copy m released (a_grows, block
        // 1: H_s(start) too).
        if (m == 0 || j_low == 1) {
          // (C_m and B_m released, and once every reader has, refilled with the next chunk's)
          tma::mbar_arrive(empty + m);
          if (wtid == 0 && li + 1 < n_total) {
            tma::mbar_wait(empty + m, ph);
            load_cb(li + 1, m);
          }
          __syncwarp();  // (converged again before the next wgmma)
        } else {
          tma::mbar_arrive(empty);
          tma::mbar_arrive(hs_empty);
        }
        tma::mbar_arrive(hs_empty + m);
      }
    } else {
      tma::mbar_wait(full + (li & 1), ph);
      tma::mbar_wait(hs_full + m, hph);
#pragma unroll
      for (int i = 0; i < HP; ++i) warpgroup_fence_operand(acc[i]);
      warpgroup_fence_operand(cb);
      issue_ch_cb(j_low);
      factors();
      if (decay_ready) decay_for(0, j_low);
      warpgroup_wait<0>();
      warpgroup_fence_operand(cb);
#pragma unroll
      for (int i = 0; i < HP; ++i) warpgroup_fence_operand(acc[i]);
      // C H^T has read H_s: both warpgroups release both slots (so a_grows needs no other count),
      // H_s(mid) first: the state warpgroup writes H_s(start) of the next chunk once every thread
      // has released this one's, and the other warpgroup's next release of H_s(mid) must not
      // precede this warpgroup's.
      tma::mbar_arrive(hs_empty + 1);
      tma::mbar_arrive(hs_empty + 0);
    }
#pragma unroll
    for (int i = 0; i < HP; ++i) {
#pragma unroll
      for (int v = 0; v < decltype(size(acc[i]))::value; ++v) acc[i](v) *= ((v >> 1) & 1) ? f1[i] : f0[i];
    }
    // S_ij X_j for each head from j_first (the next head's decays under the last S X; the sf
    // fragment is rewritten once that wgmma has read it), C_m B_{j+1}^T after block j.
#pragma unroll 1
    for (int j = j_low;; ++j) {
#pragma unroll
      for (int i = 0; i < HP; ++i) {
        if (j < j_first[i]) continue;
        if constexpr (kBlocks) {
          if (j == m) tma::mbar_wait(full_x + (2 * li + m) % 3, L::x_phase(2 * li + m));  // (X_0: waited for above)
          warpgroup_wait<0>();
          const float* s_e = cum_of(meta_c, i) + q + j * kN;
          if (j == m) s_from_cb<true, T>(sf, cb, s_e, a_grows[i], ct0[i], ct1[i], t0 - j * kN, t1 - j * kN, lane);
          else s_from_cb<false, T>(sf, cb, s_e, a_grows[i], ct0[i], ct1[i], t0 - j * kN, t1 - j * kN, lane);
          warpgroup_fence_operand(sf);
        } else {
          if (!(decay_ready && i == 0 && j == j_low)) decay_for(i, j);
          warpgroup_wait<0>();
          make_s();
        }
        warpgroup_fence_operand(acc[i]);
        warpgroup_arrive();
        issue_sx(i, j);
        warpgroup_commit_batch();
      }
      if (j == m) break;
      warpgroup_wait<0>();
      if constexpr (kBlocks) tma::mbar_arrive(empty_x + (2 * li) % 3);  // (a_grows: S_10 X_0 read X_0)
      warpgroup_fence_operand(cb);
      warpgroup_arrive();
      issue_cb(j + 1);
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(cb);
      if constexpr (kClaims) {  // (a_grows: C_1 B_1^T read C_1 and B_1)
        release_b(li, m);
        release_c(li, m);
      } else if constexpr (kBlocks) {
        tma::mbar_arrive(empty + m);
        if (wtid == 0 && li + 1 < n_total) {
          tma::mbar_wait(empty + m, ph);
          load_cb(li + 1, m);
        }
        __syncwarp();
      }
    }
    warpgroup_wait<0>();
#pragma unroll
    for (int i = 0; i < HP; ++i) warpgroup_fence_operand(acc[i]);
    if constexpr (kBlocks) {
      // The output staged in place in the block's X tile (the epilogue reads each value of X for
      // D x before it writes the output there), once the tile's other readers are done with it
      // (empty_x); the tile refilled with tile n + 3 once the stores have read it.
      const int n = 2 * li + m;
      char* x_m = smem + L::x_tile(n);
      auto refill_x = [&]() {
        if (wtid == 0 && (n + 3) / 2 < n_total) load_x(n + 3);
        __syncwarp();
      };
      if constexpr (kRanks > 1) {
        // Block m is rank m's: the other rank's warpgroup sends its partial, this rank's adds it
        // (fragment order) before the epilogue and then releases its H_s copy m. (The send waits
        // for the receiver's part_free arrival of this chunk: its slices 1-2 of copy m free.)
        float* s_part = reinterpret_cast<float*>(hs_of(m, 0) + F::kSlice);
        if (m != rank_now()) {
          tma::mbar_wait<true>(part_free, ph);
          const uint32_t dst = tma::cluster_addr(s_part, m), bar = tma::cluster_addr(part_full, m);
          send_partial(acc[0], dst, bar, wtid);
          tma::mbar_wait(empty_x + n % 3, L::x_phase(n));  // (S X has read it here)
          refill_x();
          continue;
        }
        // (the expected bytes may post after some have landed)
        if (wtid == 0) tma::mbar_arrive_expect(part_full, kM * 64 * 4);
        tma::mbar_wait<true>(part_full, ph);
        add_partial(acc[0], s_part, wtid);
        tma::mbar_arrive(hs_empty + m);
      }
      tma::mbar_wait(empty_x + n % 3, L::x_phase(n));
      epilogue_tma_store<T, 3>(acc[0], x_m, x_m, s_d, p.D != nullptr, &out_map, static_cast<int>(ci.tok0) + m * kM,
                               static_cast<int>(h0), row32);
      if (lane == 0) tma::bulk_wait_all();
      named_barrier_sync(3 + m, kThreads);  // (every warp's stores have read the tile)
      refill_x();
      continue;
    }
    // (staged in C_m's tile instead, the stores' reads were waited for here, before the slot's
    // release: 0.6-1.2% slower, v26)
    if (lane == 0) tma::bulk_wait_all();  // (this warp's stores of the last chunk have read its rows)
    __syncwarp();
#pragma unroll
    for (int i = 0; i < HP; ++i) {
      epilogue_tma_store<T, 3>(acc[i], smem + L::kStage + (HP * ow + i) * L::kStageBytes, x_of(buf, m, i),
                               s_d + 64 * i, p.D != nullptr, &out_map, static_cast<int>(ci.tok0) + m * kM,
                               static_cast<int>(h0) + i, row32);
    }
    tma::mbar_arrive(empty + (li & 1));
  }
  // (the output stores are done; kClaims: the lane read again, its register spilled otherwise)
  if ((kClaims ? lane_id_now() : lane) == 0) tma::bulk_wait_all<true>();
}

// maps.meta for the kernel's params `p`: chunk_cumsum's cum, dt' and the weights the kernel reads
// (its pairs where kStatePairs and given, else the fp32 ones) as the three arrays of a 3-D map,
// which needs them at equal distances (the workspace's cum, dt' and wst regions). Where the pairs
// lie elsewhere (both kinds of weights stored) `p` drops them and the kernel makes its own from
// the fp32 weights, as it does where none are given.
template <class T, int NK, int kRanks>
void add_meta_map(SsdParams& p, ChunkInputMaps& maps) {
  const int64_t gap = p.dtp - p.cum;
  const float* third = p.dtp + gap;
  if (kWsStatePairs<T, NK, kRanks> && p.wst_pairs != nullptr && p.wst_pairs != third && p.wst == third) p.wst_pairs = nullptr;
  const float* w = kWsStatePairs<T, NK, kRanks> && p.wst_pairs != nullptr ? p.wst_pairs : p.wst;
  const int64_t slots = p.batch * p.nheads * p.nchunks;
  if (gap <= 0 || w != third || slots > INT32_MAX) {
    throw_launch_error("fused_walk: the specialised variant reads chunk_cumsum's cum, dt' and weights as one map of "
                       "three equally spaced arrays, got distances " + std::to_string(gap) + " and " +
                       std::to_string(w - p.dtp) + " floats over " + std::to_string(slots) + " chunk slots");
  }
  const int64_t dims[3] = {p.chunk, slots, 3};
  const int64_t strides[2] = {4 * static_cast<int64_t>(p.chunk), 4 * gap};
  const uint32_t box[3] = {static_cast<uint32_t>(p.chunk), 1, 3};
  maps.meta = make_plain_map_f32(p.cum, 3, dims, strides, box, "fused_walk (specialised) meta");
}

template <class T, int NK, int HP, int kRanks = 1>
void launch_ws_typed(const SsdParams& p_in, const ChunkInputMaps& maps_in, const CUtensorMap& out_map, int64_t walks,
                     cudaStream_t stream) {
  SsdParams p = p_in;
  ChunkInputMaps maps = maps_in;
  if (p.walk_meta) {
    if (p.walk_pairs != kWsStatePairs<T, NK, kRanks> || p.prewalk || p.wst == nullptr) {
      throw_launch_error(std::string("fused_walk: the specialised variant at dstate ") + std::to_string(p.dstate) +
                         " reads chunk_cumsum's walk meta (SsdParams::walk_meta) with its weights in wst, as " +
                         (kWsStatePairs<T, NK, kRanks> ? "bf16 pairs" : "fp32") + " and without a pre-walk, got " +
                         (p.wst == nullptr ? "no wst" : p.walk_pairs ? "pairs" : "fp32 weights") +
                         (p.prewalk ? " and a pre-walk" : ""));
    }
    // (its weights are in wst's region, beside cum and e: as the pairs the kernel reads, or fp32)
    p.wst_pairs = p.walk_pairs ? p.wst : nullptr;
    if (p.walk_pairs) p.wst = nullptr;
  }
  if (p.wst == nullptr && !(kWsStatePairs<T, NK, kRanks> && p.wst_pairs != nullptr)) {
    throw_launch_error("fused_walk: the specialised variant at dstate " + std::to_string(p.dstate) +
                       " reads chunk_cumsum's fp32 weights (SsdParams::wst), got none");
  }
  if constexpr (kWsMetaMap<kRanks>) add_meta_map<T, NK, kRanks>(p, maps);
  auto kernel = fused_walk_ws_kernel<T, NK, HP, kRanks>;
  constexpr int smem = WsLayout<T, NK, HP, kRanks>::kBytes;
  static_assert(smem <= 227 * 1024, "shared memory of the specialised walk");
  raise_smem_limit(reinterpret_cast<const void*>(kernel), smem, false, "cudaFuncSetAttribute(fused_walk specialised)");
  const dim3 grid(kRanks, static_cast<unsigned>(p.nheads / HP), static_cast<unsigned>(walks * p.nseg));
  launch_kernel(kernel, grid, dim3(3 * kThreads), smem, stream, true, kRanks,
                kRanks == 1 ? "launch fused_walk (specialised)" : "launch fused_walk (specialised, clusters of two)", p,
                maps, out_map);
}

}  // namespace

namespace fused_walk_parts {

void launch_fused_walk_specialized(const SsdParams& p, const ChunkInputMaps& maps, const CUtensorMap& out_map,
                                   int64_t walks, cudaStream_t stream) {
  if (p.dstate <= 64) {  // (one slice; dstate below 64: zero columns past it, as the TMA fills)
    if (p.ws_heads == 2) {
      if (p.fp16) launch_ws_typed<cutlass::half_t, 1, 2>(p, maps, out_map, walks, stream);
      else launch_ws_typed<cutlass::bfloat16_t, 1, 2>(p, maps, out_map, walks, stream);
      return;
    }
    if (p.fp16) launch_ws_typed<cutlass::half_t, 1, 1>(p, maps, out_map, walks, stream);
    else launch_ws_typed<cutlass::bfloat16_t, 1, 1>(p, maps, out_map, walks, stream);
    return;
  }
  if (p.dstate <= 128) {
    if (p.fp16) launch_ws_typed<cutlass::half_t, 2, 1>(p, maps, out_map, walks, stream);
    else launch_ws_typed<cutlass::bfloat16_t, 2, 1>(p, maps, out_map, walks, stream);
    return;
  }
  // (dstate 129-512: four slices in block slots, above 256 on two ranks, with zero columns past
  // dstate; one head per CTA and no pre-walk)
  if (p.ws_heads != 1 || p.prewalk) {
    throw_launch_error("fused_walk: the specialised variant at dstate " + std::to_string(p.dstate) +
                       " walks one head per CTA without a pre-walk, got " + std::to_string(p.ws_heads) +
                       " heads per CTA" + (p.prewalk ? " and a pre-walk" : ""));
  }
  ChunkInputMaps block_maps = maps;
  add_slice_maps(block_maps, p, "fused_walk (specialised)");
  if (p.dstate > 256) {
    if (p.fp16) launch_ws_typed<cutlass::half_t, 4, 1, 2>(p, block_maps, out_map, walks, stream);
    else launch_ws_typed<cutlass::bfloat16_t, 4, 1, 2>(p, block_maps, out_map, walks, stream);
    return;
  }
  if (p.fp16) launch_ws_typed<cutlass::half_t, 4, 1>(p, block_maps, out_map, walks, stream);
  else launch_ws_typed<cutlass::bfloat16_t, 4, 1>(p, block_maps, out_map, walks, stream);
}

}  // namespace fused_walk_parts

bool fused_walk_specialized_reads_pairs(const SsdParams& p) {
  if (p.fp16) return false;
  using Bf = cutlass::bfloat16_t;
  return p.dstate <= 64    ? kWsStatePairs<Bf, 1, 1>
         : p.dstate <= 128 ? kWsStatePairs<Bf, 2, 1>
         : p.dstate <= 256 ? kWsStatePairs<Bf, 4, 1>
                           : kWsStatePairs<Bf, 4, 2>;
}

}  // namespace mamba2_ssd::kernels
