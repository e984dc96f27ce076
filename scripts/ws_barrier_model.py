#!/usr/bin/env python3
"""A model of the mbarrier protocol of fused_walk's specialised kernel (src/kernels/fused_walk_ws.cu),
checked for deadlock over every interleaving of its three warpgroups. No GPU needed. Three forms:
chunk slots (dstate <= 128: two chunks' tiles, refilled by the state warpgroup), block slots
(dstate 129-256: the chunk's two 64-token blocks' C_m B_m, each refilled by its block's output
warpgroup once the state warpgroup, and for block 0 block 1's, are done with them too, and a
ring of three X tiles, in which each block's output is staged in place before the tile is
refilled), and block slots on two ranks (dstate 257-512: two CTAs of a cluster, each rank
finishing one block with the other's partial; B_m refilled by whichever of its readers releases
it last, C_m by its block's warpgroup, the meta in a ring of four; random schedules).

Each warpgroup is one actor whose program is the kernel's sequence of mbarrier waits, arrivals
and load issues per chunk (its 128 threads' arrivals count as one arrival here; the kernel's
per-thread order of the two H_s releases is argued in its comments). A TMA load lands at any
later step. An mbarrier is a phase number k and the arrivals of phase k; a wait for parity p
returns once k % 2 != p, as `mbarrier.try_wait.parity` does: a wait two phases behind never
returns. Keep the programs below in step with the kernel when its synchronisation changes.

  scripts/ws_barrier_model.py        # every case; exit status 1 if the kernel's protocol deadlocks

The model found the hang that design log v25 describes: with A > 0 (a_grows) block 1 read
H_s(start) and released H_s(mid) without waiting for it, so the output warpgroups could complete
H_s(mid)'s phase before the state warpgroup's first wait for it.
"""
import random
import sys
from collections import deque

# arrivals that complete a phase: the tiles (one TMA arrival), a slot's release (the warpgroups
# that read it: all three, block slots' block 1 two), H_s written (the state warpgroup), H_s read
# (both output warpgroups)
def need(blocks, claims=False, a_grows=False):
    if claims:
        # (two ranks: empty0/empty1 B_m's readers, block 1's of B_0 with a_grows only; fullc/emptyc
        # C_m's bytes and its block's release; fullm0-3 the meta ring's bytes)
        d = need(True)
        d.update({"empty0": 3 if a_grows else 2, "empty1": 2, "fullc0": 1, "fullc1": 1, "emptyc0": 1, "emptyc1": 1,
                  "fullm0": 1, "fullm1": 1, "fullm2": 1, "fullm3": 1})
        return d
    if not blocks:
        return {"full0": 1, "full1": 1, "empty0": 3, "empty1": 3, "hs_full0": 1, "hs_full1": 1, "hs_empty0": 2,
                "hs_empty1": 2}
    # (full/empty: the C_m B_m parts; fullx/emptyx: the X ring's three tiles, emptyx counting the
    # readers but the tile's own block; two ranks: the partial's barriers, pfull its bytes and the
    # receiver's arrival, pfree the receiver's; nb2: named barrier 2, a_grows on rank 0 of two)
    return {"full0": 1, "full1": 1, "empty0": 3, "empty1": 2, "hs_full0": 1, "hs_full1": 1, "hs_empty0": 2,
            "hs_empty1": 1, "fullx0": 1, "fullx1": 1, "fullx2": 1, "emptyx0": 2, "emptyx1": 2, "emptyx2": 2,
            "pfull": 2, "pfree": 1, "nb2": 2}


NAMES = list(need(True))
LANDS = {"cb0": "full0", "cb1": "full1", "x0": "fullx0", "x1": "fullx1", "x2": "fullx2", 0: "full0", 1: "full1",
         "b0": "full0", "b1": "full1", "c0": "fullc0", "c1": "fullc1", "m0": "fullm0", "m1": "fullm1", "m2": "fullm2",
         "m3": "fullm3"}


def state_program(n_chunks):
    """Warpgroup 0: loads chunks 0 and 1, then per chunk H_s(start), H_s(mid), the refill of chunk
    c + 1 into the slot of chunk c - 1, and the release of chunk c's slot."""
    ops = [("issue", c & 1) for c in range(min(2, n_chunks))]
    for c in range(n_chunks):
        ops += [("wait", "hs_empty0", (c & 1) ^ 1), ("wait", "full%d" % (c & 1), (c >> 1) & 1), ("arrive", "hs_full0"),
                ("wait", "hs_empty1", (c & 1) ^ 1), ("arrive", "hs_full1")]
        if 1 <= c < n_chunks - 1:
            ops += [("wait", "empty%d" % ((c + 1) & 1), ((c - 1) >> 1) & 1), ("issue", (c + 1) & 1)]
        ops += [("arrive", "empty%d" % (c & 1))]
    return ops


def output_program(n_chunks, m, a_grows, block1_waits_mid):
    """Warpgroup 1 + m: block m of every chunk. block1_waits_mid: the kernel now (block m waits for
    H_s slot m, block 1 for H_s(mid) whichever H_s it reads); False: the kernel of 0e3d67e."""
    from_mid = m == 1 and not a_grows
    ops = []
    for c in range(n_chunks):
        ops += [("wait", "full%d" % (c & 1), (c >> 1) & 1)]
        if block1_waits_mid:
            ops += [("wait", "hs_full%d" % m, c & 1)]
        else:
            ops += [("wait", "hs_full1" if from_mid else "hs_full0", c & 1)]
        ops += [("arrive", "hs_empty1"), ("arrive", "hs_empty0"), ("arrive", "empty%d" % (c & 1))]
    return ops


def x_ring(n):
    """Tile n's slot (its barriers fullx / emptyx and its load tag) and the phase parity there."""
    return str(n % 3), (n // 3) & 1


def state_program_blocks(n_chunks):
    """Block slots, warpgroup 0: loads C_m B_m of both blocks of chunk 0 and X tiles 0-2, then per
    chunk H_s(start), block 0's update and the release of its C_0 B_0 and X tile, H_s(mid), block
    1's update and the release of its."""
    ops = [("issue", "cb0"), ("issue", "x0"), ("issue", "cb1"), ("issue", "x1")] if n_chunks > 0 else []
    if n_chunks > 1:
        ops += [("issue", "x2")]
    for c in range(n_chunks):
        ph = c & 1
        (s0, p0), (s1, p1) = x_ring(2 * c), x_ring(2 * c + 1)
        ops += [("wait", "hs_empty0", ph ^ 1), ("wait", "full0", ph), ("arrive", "hs_full0"), ("wait", "fullx" + s0, p0),
                ("arrive", "empty0"), ("arrive", "emptyx" + s0), ("wait", "hs_empty1", ph ^ 1), ("arrive", "hs_full1"),
                ("wait", "full1", ph), ("wait", "fullx" + s1, p1), ("arrive", "empty1"), ("arrive", "emptyx" + s1)]
    return ops


def output_program_blocks(n_chunks, m, a_grows):
    """Block slots on one rank, warpgroup 1 + m: block m of every chunk. Each part is released
    once read, after the wait for it (so that the arrival counts for this chunk's phase), and
    refilled by this warpgroup once every reader has released it: C_m B_m after C H^T and C B^T;
    its X tile (n = 2 c + m) once the other readers have (emptyx), after the output staged in it
    has been stored, with tile n + 3. H_s copy m after the C_m B_m refill. Block 1 also reads
    block 0's meta (with its C_0 B_0) and with a_grows its B_0, X_0 and H_s(start), else releases
    them at once; block 0 releases X_1 without reading it. (Two ranks: output_program_claims.)"""
    ops = []
    for c in range(n_chunks):
        ph = c & 1
        more = c + 1 < n_chunks
        n = 2 * c + m
        sx, px = x_ring(n)

        def refill(part, bar):
            return [("wait", bar, ph), ("issue", part)] if more else []

        if m == 0:
            ops += [("wait", "full0", ph), ("arrive", "emptyx" + x_ring(n + 1)[0]), ("wait", "hs_full0", ph)]
            ops += [("arrive", "empty0")] + refill("cb0", "empty0") + [("arrive", "hs_empty0")]
        else:
            s0, p0 = x_ring(n - 1)
            ops += [("wait", "full1", ph), ("wait", "full0", ph)] + ([] if a_grows else [("arrive", "empty0")])
            ops += [("wait", "hs_full1", ph), ("wait", "fullx" + s0, p0)]
            if not a_grows:
                ops += [("arrive", "emptyx" + s0), ("arrive", "hs_empty0")]
                ops += [("arrive", "empty1")] + refill("cb1", "empty1") + [("arrive", "hs_empty1")]
            else:
                ops += [("arrive", "empty0"), ("arrive", "hs_empty0"), ("arrive", "hs_empty1")]
                ops += [("arrive", "emptyx" + s0), ("arrive", "empty1")] + refill("cb1", "empty1")
        ops += [("wait", "fullx" + sx, px), ("wait", "emptyx" + sx, px)]
        if (n + 3) // 2 < n_chunks:
            ops += [("issue", "x" + x_ring(n + 3)[0])]
    return ops


def state_program_claims(n_chunks):
    """Two ranks, warpgroup 0: loads B_m and C_m of both blocks of chunk 0, X tiles 0-2 and the
    meta of chunks 0-1, then per chunk H_s(start) once the chunk's meta has landed, block 0's
    update and the release of its B_0 and X tile, H_s(mid), block 1's update and the release of
    its. A release ("release", barrier, load) is an arrival that issues the load if it completes
    the phase (the kernel's last arriving warp claims the refill)."""
    ops = []
    if n_chunks > 0:
        ops = [("issue", "b0"), ("issue", "c0"), ("issue", "x0"), ("issue", "b1"), ("issue", "c1"), ("issue", "x1"),
               ("issue", "m0")]
    if n_chunks > 1:
        ops += [("issue", "m1"), ("issue", "x2")]
    for c in range(n_chunks):
        ph = c & 1
        more = c + 1 < n_chunks
        (s0, p0), (s1, p1) = x_ring(2 * c), x_ring(2 * c + 1)
        ops += [("wait", "hs_empty0", ph ^ 1), ("wait", "fullm%d" % (c % 4), (c // 4) & 1), ("arrive", "hs_full0"),
                ("wait", "full0", ph), ("wait", "fullx" + s0, p0), ("arrive", "emptyx" + s0),
                ("release", "empty0", "b0" if more else None), ("wait", "hs_empty1", ph ^ 1), ("arrive", "hs_full1"),
                ("wait", "full1", ph), ("wait", "fullx" + s1, p1), ("arrive", "emptyx" + s1),
                ("release", "empty1", "b1" if more else None)]
    return ops


def output_program_claims(n_chunks, m, a_grows, rank, other):
    """Two ranks, warpgroup 1 + m: block m of every chunk, as output_program_blocks, but B_m is
    released after C B^T (a_grows, block 1: B_0 there, B_1 after C_1 B_1^T) for whichever reader
    is last to refill, C_m refilled by this warpgroup after it (block 0 with the meta of chunk
    c + 2, into the ring slot of chunk c - 2), and block 1 reads the meta in its ring."""
    ops = []
    sends = m != rank
    for c in range(n_chunks):
        ph = c & 1
        more = c + 1 < n_chunks
        n = 2 * c + m
        sx, px = x_ring(n)

        def refill_c():
            out = [("arrive", "emptyc%d" % m)]
            if more:
                out += [("wait", "emptyc%d" % m, ph), ("issue", "c%d" % m)]
                if m == 0 and c + 2 < n_chunks:
                    out += [("issue", "m%d" % ((c + 2) % 4))]
            return out

        ops += [("wait", "full%d" % m, ph), ("wait", "fullc%d" % m, ph), ("wait", "fullm%d" % (c % 4), (c // 4) & 1)]
        if m == 1 and a_grows:
            ops += [("wait", "full0", ph)]
        if m == 0:
            ops += [("arrive", "emptyx" + x_ring(n + 1)[0])]
        ops += [("wait", "hs_full%d" % m, ph)]
        if m == 1:
            s0, p0 = x_ring(n - 1)
            ops += [("wait", "fullx" + s0, p0)]
            if not a_grows:
                ops += [("arrive", "emptyx" + s0), ("arrive", "hs_empty0")]
        # C H^T done: H_s copy m released (the receiver: the sender's pfree)
        if m == 1 and a_grows:
            ops += [("arrive", "hs_empty0")] + ([("arrive", "nb2")] if rank == 0 else [])
        if sends:
            ops += [("arrive", "hs_empty%d" % m)]
        else:
            ops += ([("arrive", "nb2"), ("wait", "nb2", ph)] if (m == 0 and a_grows) else []) + [("arrive", other["pfree"])]
        # C B^T done
        if m == 1 and a_grows:
            ops += [("release", "empty0", "b0" if more else None)]
            ops += [("arrive", "emptyx" + s0), ("release", "empty1", "b1" if more else None)] + refill_c()
        else:
            ops += [("release", "empty%d" % m, "b%d" % m if more else None)] + refill_c()
        ops += [("wait", "fullx" + sx, px)]
        if sends:
            ops += [("wait", "pfree", ph), ("send", other["pfull"])]
        else:
            ops += [("arrive", "pfull"), ("wait", "pfull", ph), ("arrive", "hs_empty%d" % m)]
        ops += [("wait", "emptyx" + sx, px)]
        if (n + 3) // 2 < n_chunks:
            ops += [("issue", "x" + x_ring(n + 3)[0])]
    return ops


def qualified(ops, prefix):
    """The program's barrier names and load tags with its rank's prefix (names with a ':' are
    another rank's already)."""
    def q(x):
        return x if not isinstance(x, str) or ":" in x else prefix + x
    return [(op[0], q(op[1])) + ((q(op[2]),) if op[0] == "release" else tuple(op[2:])) for op in ops]


def find_deadlock(n_chunks, a_grows, block1_waits_mid=True, blocks=False, ranks=1, runs=0, seed=1, mutate=None):
    """None if every interleaving finishes, else a description of a state where no actor can move.
    ranks 2 (block slots): the two CTAs of a cluster, each of three warpgroups; their interleavings
    are too many to visit (with the refill claims, even those of one chunk), so with runs > 0 that
    many random schedules are run to their end instead (each move, load landing included, equally likely at every step). mutate:
    applied to the list of programs (and their names) before the search, for testing the checker."""
    if ranks == 2:
        progs, who = [], []
        for r in (0, 1):
            other = {"pfull": "r%d:pfull" % (1 - r), "pfree": "r%d:pfree" % (1 - r)}
            progs.append(qualified(state_program_claims(n_chunks), "r%d:" % r))
            progs += [qualified(output_program_claims(n_chunks, m, a_grows, r, other), "r%d:" % r) for m in (0, 1)]
            who += ["rank %d state:" % r, "rank %d block 0:" % r, "rank %d block 1:" % r]
        needs = {"r%d:%s" % (r, k): v for r in (0, 1) for k, v in need(True, True, a_grows).items()}
    elif blocks:
        progs = [state_program_blocks(n_chunks)] + [output_program_blocks(n_chunks, m, a_grows) for m in (0, 1)]
        needs, who = need(True), ["state:", "block 0:", "block 1:"]
    else:
        progs = [state_program(n_chunks)] + [output_program(n_chunks, m, a_grows, block1_waits_mid) for m in (0, 1)]
        needs, who = need(False), ["state:", "block 0:", "block 1:"]
    if mutate is not None:
        progs = mutate(progs)
    names = list(needs)
    index = {k: i for i, k in enumerate(names)}
    start = (tuple(0 for _ in progs), tuple((0, 0) for _ in names), frozenset())  # program counters, barriers, loads in flight
    seen = {start}
    todo = deque([start])
    rng = random.Random(seed)
    while todo:
        pcs, bars, loads = todo.popleft()
        moves = []
        for a, prog in enumerate(progs):
            if pcs[a] == len(prog):
                continue
            op = prog[pcs[a]]
            nb, nl = list(bars), set(loads)
            if op[0] == "wait":
                if bars[index[op[1]]][0] % 2 == op[2]:
                    continue  # blocked
            elif op[0] in ("arrive", "release"):
                i = index[op[1]]
                k, count = nb[i]
                nb[i] = (k + 1, 0) if count + 1 == needs[op[1]] else (k, count + 1)
                if op[0] == "release" and count + 1 == needs[op[1]] and op[2] is not None:
                    nl.add(op[2])  # (the last reader's release issues the refill)
            else:  # a TMA load or a partial sent: in flight until it lands
                nl.add(op[1])
            npcs = list(pcs)
            npcs[a] += 1
            moves.append((tuple(npcs), tuple(nb), frozenset(nl)))
        for tag in loads:  # a load in flight lands (its bytes: one arrival)
            nb = list(bars)
            pre, _, base = tag.rpartition(":") if isinstance(tag, str) else ("", "", tag)
            bar = (pre + ":" if pre else "") + (LANDS[base] if base in LANDS else base)
            i = index[bar]
            k, count = nb[i]
            nb[i] = (k + 1, 0) if count + 1 == needs[bar] else (k, count + 1)
            moves.append((pcs, tuple(nb), loads - {tag}))
        if not moves and any(pcs[a] < len(p) for a, p in enumerate(progs)):
            return "stuck at " + ", ".join(
                "%s %s" % (w, progs[a][pcs[a]] if pcs[a] < len(progs[a]) else "done") for a, w in enumerate(who))
        if runs > 0:  # one random step; a finished run starts the next
            if moves:
                todo.append(rng.choice(moves))
            else:
                runs -= 1
                if runs > 0:
                    todo.append(start)
            continue
        for nxt in moves:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return None


def main():
    bad = False
    for n in (1, 2, 3, 4, 5):
        for a_grows in (False, True):
            for fixed in (True, False):
                d = find_deadlock(n, a_grows, fixed)
                print("chunks %d, A %s 0, %s: %s" % (n, ">" if a_grows else "<=", "kernel" if fixed else "0e3d67e",
                                                     d or "no deadlock"))
                bad |= fixed and d is not None
            d = find_deadlock(n, a_grows, blocks=True)
            print("chunks %d, A %s 0, block slots: %s" % (n, ">" if a_grows else "<=", d or "no deadlock"))
            bad |= d is not None
            # (two CTAs of six warpgroups: random interleavings; with the claims' barriers even one
            # chunk's are too many to visit)
            d = find_deadlock(n, a_grows, ranks=2, runs=3000)
            print("chunks %d, A %s 0, block slots on two ranks (3000 random schedules): %s" %
                  (n, ">" if a_grows else "<=", d or "no deadlock"))
            bad |= d is not None
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
