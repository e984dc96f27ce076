#!/usr/bin/env python3
"""A model of the mbarrier protocol of fused_walk's specialised kernel (src/kernels/fused_walk_ws.cu),
checked for deadlock over every interleaving of its three warpgroups. No GPU needed. Two forms:
chunk slots (dstate <= 128: two chunks' tiles, refilled by the state warpgroup) and block slots
(dstate 129-256: the chunk's two 64-token blocks, each in two parts, C_m B_m and X_m, that block
m's output warpgroup refills once the state warpgroup, and for block 0 block 1's, are done with
them too; the output staged in the block's H_s copy, released after the stores).

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
import sys
from collections import deque

# arrivals that complete a phase: the tiles (one TMA arrival), a slot's release (the warpgroups
# that read it: all three, block slots' block 1 two), H_s written (the state warpgroup), H_s read
# (both output warpgroups)
def need(blocks):
    if not blocks:
        return {"full0": 1, "full1": 1, "empty0": 3, "empty1": 3, "hs_full0": 1, "hs_full1": 1, "hs_empty0": 2,
                "hs_empty1": 2}
    # (full/empty: the C_m B_m parts, fullx/emptyx the X_m parts; nb2: named barrier 2 of the two
    # output warpgroups, a_grows only)
    return {"full0": 1, "full1": 1, "empty0": 3, "empty1": 2, "hs_full0": 1, "hs_full1": 1, "hs_empty0": 2,
            "hs_empty1": 1, "fullx0": 1, "fullx1": 1, "emptyx0": 3, "emptyx1": 2, "nb2": 2}


NAMES = list(need(True))
LANDS = {"cb0": "full0", "cb1": "full1", "x0": "fullx0", "x1": "fullx1", 0: "full0", 1: "full1"}


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


def state_program_blocks(n_chunks):
    """Block slots, warpgroup 0: loads both parts of both blocks of chunk 0, then per chunk
    H_s(start), block 0's update and the release of its parts, H_s(mid), block 1's update and
    the release of its parts."""
    ops = [("issue", "cb0"), ("issue", "x0"), ("issue", "cb1"), ("issue", "x1")] if n_chunks > 0 else []
    for c in range(n_chunks):
        ph = c & 1
        ops += [("wait", "hs_empty0", ph ^ 1), ("wait", "full0", ph), ("arrive", "hs_full0"), ("wait", "fullx0", ph),
                ("arrive", "empty0"), ("arrive", "emptyx0"), ("wait", "hs_empty1", ph ^ 1), ("arrive", "hs_full1"),
                ("wait", "full1", ph), ("wait", "fullx1", ph), ("arrive", "empty1"), ("arrive", "emptyx1")]
    return ops


def output_program_blocks(n_chunks, m, a_grows):
    """Block slots, warpgroup 1 + m: block m of every chunk. Each part is released once read,
    after the wait for it (so that the arrival counts for this chunk's phase), and refilled by
    this warpgroup once every reader has released it: C_m B_m after C H^T and C B^T, X_m after the
    epilogue; H_s copy m after the stores staged in it. Block 1 also reads block 0's meta (with
    its C_0 B_0 part) and with a_grows its B_0, X_0 and H_s(start), else releases them at once;
    block 0 then stages in H_s(start) only after block 1's C H^T (named barrier 2)."""
    ops = []
    for c in range(n_chunks):
        ph = c & 1
        more = c + 1 < n_chunks

        def refill(part, bar):
            return [("wait", bar, ph), ("issue", part)] if more else []

        if m == 0:
            ops += [("wait", "full0", ph), ("wait", "hs_full0", ph), ("arrive", "empty0")] + refill("cb0", "empty0")
            ops += [("wait", "fullx0", ph)]
            if a_grows:
                ops += [("arrive", "nb2"), ("wait", "nb2", ph)]
            ops += [("arrive", "emptyx0")] + refill("x0", "emptyx0") + [("arrive", "hs_empty0")]
        else:
            ops += [("wait", "full1", ph), ("wait", "full0", ph)] + ([] if a_grows else [("arrive", "empty0")])
            ops += [("wait", "hs_full1", ph), ("wait", "fullx0", ph)]
            if not a_grows:
                ops += [("arrive", "emptyx0"), ("arrive", "hs_empty0"), ("arrive", "empty1")] + refill("cb1", "empty1")
            else:
                ops += [("arrive", "empty0"), ("arrive", "hs_empty0"), ("arrive", "nb2"), ("arrive", "emptyx0"),
                        ("arrive", "empty1")] + refill("cb1", "empty1")
            ops += [("wait", "fullx1", ph), ("arrive", "emptyx1")] + refill("x1", "emptyx1") + [("arrive", "hs_empty1")]
    return ops


def find_deadlock(n_chunks, a_grows, block1_waits_mid=True, blocks=False):
    """None if every interleaving finishes, else a description of a state where no actor can move."""
    if blocks:
        progs = [state_program_blocks(n_chunks)] + [output_program_blocks(n_chunks, m, a_grows) for m in (0, 1)]
    else:
        progs = [state_program(n_chunks)] + [output_program(n_chunks, m, a_grows, block1_waits_mid) for m in (0, 1)]
    needs = need(blocks)
    start = (tuple(0 for _ in progs), tuple((0, 0) for _ in NAMES), frozenset())  # program counters, barriers, loads in flight
    seen = {start}
    todo = deque([start])
    while todo:
        pcs, bars, loads = todo.popleft()
        moves = []
        for a, prog in enumerate(progs):
            if pcs[a] == len(prog):
                continue
            op = prog[pcs[a]]
            nb, nl = list(bars), set(loads)
            if op[0] == "wait":
                if bars[NAMES.index(op[1])][0] % 2 == op[2]:
                    continue  # blocked
            elif op[0] == "arrive":
                i = NAMES.index(op[1])
                k, count = nb[i]
                nb[i] = (k + 1, 0) if count + 1 == needs[op[1]] else (k, count + 1)
            else:
                nl.add(op[1])
            npcs = list(pcs)
            npcs[a] += 1
            moves.append((tuple(npcs), tuple(nb), frozenset(nl)))
        for slot in loads:  # a load in flight lands
            nb = list(bars)
            i = NAMES.index(LANDS[slot])
            nb[i] = (nb[i][0] + 1, 0)
            moves.append((pcs, tuple(nb), loads - {slot}))
        if not moves and any(pcs[a] < len(p) for a, p in enumerate(progs)):
            return "stuck at " + ", ".join(
                "%s %s" % (who, progs[a][pcs[a]] if pcs[a] < len(progs[a]) else "done")
                for a, who in enumerate(("state:", "block 0:", "block 1:")))
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
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
