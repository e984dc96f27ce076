// Device side of the TMA loads: shared-memory mbarriers and tiled tensor loads (sm90).
// One thread issues a tile load of many kilobytes with a single instruction; the mbarrier
// completes when the expected bytes have landed, and the waiting threads then see them.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace mamba2_ssd::kernels::tma {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// Makes the initialisations visible to the async proxy (the TMA unit); a barrier must follow.
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// Arrives once and expects `bytes` more bytes of TMA loads in the current phase.
__device__ __forceinline__ void mbar_arrive_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
// Arrives once (release: this thread's earlier shared-memory accesses happen before the phase completes).
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
// Waits until the phase with parity `parity` has completed. kCluster: the wait also acquires what
// threads of the cluster's other CTAs released when they arrived (mbar_arrive_cluster).
// (SEM: the try_wait's semantics qualifiers, spliced into the instruction.)
#define MAMBA2_SSD_MBAR_WAIT_LOOP(SEM)                                 \
  "{\n"                                                                \
  ".reg .pred done;\n"                                                 \
  "wait_%=:\n"                                                         \
  "mbarrier.try_wait.parity" SEM ".shared::cta.b64 done, [%0], %1;\n" \
  "@!done bra wait_%=;\n"                                              \
  "}\n"
template <bool kCluster = false>
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  if constexpr (kCluster) {
    asm volatile(MAMBA2_SSD_MBAR_WAIT_LOOP(".acquire.cluster")::"r"(smem_addr(bar)), "r"(parity) : "memory");
  } else {
    asm volatile(MAMBA2_SSD_MBAR_WAIT_LOOP("")::"r"(smem_addr(bar)), "r"(parity) : "memory");
  }
}
#undef MAMBA2_SSD_MBAR_WAIT_LOOP
// Whether the phase with parity `parity` has completed, without waiting (acquire, as the wait).
__device__ __forceinline__ bool mbar_test(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
// Orders this thread's earlier generic-proxy accesses of global memory (and what it acquired from
// other threads) before its later TMA reads.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// Tiled loads: box at element coordinates (c0 innermost, ...) into `dst` (1024-byte aligned for
// the 128-byte swizzle); completion is counted on `bar`.
__device__ __forceinline__ void load_3d(const CUtensorMap* map, uint64_t* bar, void* dst, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void load_4d(const CUtensorMap* map, uint64_t* bar, void* dst, int c0, int c1, int c2,
                                        int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void load_5d(const CUtensorMap* map, uint64_t* bar, void* dst, int c0, int c1, int c2,
                                        int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6, "
      "%7}], [%2];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
}

// A contiguous copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) into shared
// memory, completion counted on `bar`.
__device__ __forceinline__ void load_bulk(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// ---- Tiled stores: shared memory to global memory, tracked in bulk groups per issuing thread.

// Stores the box at element coordinates (c0 innermost, ...) from `src` (1024-byte aligned for the
// 128-byte swizzle); elements past the end of a dim are not written. The writing threads' stores
// into `src` must be fenced first (fence.proxy.async.shared::cta) and synchronised with this one.
__device__ __forceinline__ void store_4d(const CUtensorMap* map, const void* src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
// Closes this thread's stores issued since the last commit into one bulk group.
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Waits until this thread's bulk groups have read their shared memory (which may then be
// overwritten), or with kWrites until their writes are done.
template <bool kWrites = false>
__device__ __forceinline__ void bulk_wait_all() {
  if constexpr (kWrites) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  else asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

// ---- Clusters: the CTAs of a cluster reach each other's shared memory (DSMEM).

// The CTA's rank in its cluster (read each time: volatile, so not kept in a register).
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// This CTA's shared-memory address of `p`, as the address of the same offset in CTA `rank` of the
// cluster.
__device__ __forceinline__ uint32_t cluster_addr(const void* p, int rank) {
  uint32_t a;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(smem_addr(p)), "r"(rank));
  return a;
}
// Stores v at `addr` of another CTA of the cluster (cluster_addr) without waiting, counting its 16
// bytes on that CTA's mbarrier `bar` (cluster_addr) as transaction bytes.
__device__ __forceinline__ void cluster_store_async(uint32_t addr, float4 v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(addr),
               "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(bar)
               : "memory");
}
// Arrives on an mbarrier of the cluster (cluster_addr), releasing this thread's earlier accesses
// (its reads of a buffer the other CTA then overwrites).
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Every thread of the cluster: a barrier across its CTAs (what each did before is visible after).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

}  // namespace mamba2_ssd::kernels::tma
