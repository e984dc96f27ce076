"""scripts/ws_barrier_model.py: the specialised fused_walk kernel's mbarrier protocol has no
deadlock in any interleaving of its warpgroups, in both of its forms, and none in random
schedules of the block slots on two ranks (CPU only); the checker finds the hang of 0e3d67e and
those of two broken variants of the block-slot protocol."""
import importlib.util
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("ws_barrier_model", os.path.join(REPO, "scripts", "ws_barrier_model.py"))
model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(model)


@pytest.mark.parametrize("n_chunks", [1, 2, 3, 5])
@pytest.mark.parametrize("a_grows", [False, True])
def test_kernel_protocol_has_no_deadlock(n_chunks, a_grows):
    assert model.find_deadlock(n_chunks, a_grows) is None


@pytest.mark.parametrize("n_chunks", [1, 2, 3, 5])
@pytest.mark.parametrize("a_grows", [False, True])
def test_block_slot_protocol_has_no_deadlock(n_chunks, a_grows):
    # dstate 129-256: the chunk's two blocks as the slots, each refilled by its output warpgroup
    assert model.find_deadlock(n_chunks, a_grows, blocks=True) is None


@pytest.mark.parametrize("n_chunks", [1, 3])
@pytest.mark.parametrize("a_grows", [False, True])
def test_two_rank_protocol_has_no_deadlock(n_chunks, a_grows):
    # dstate 257-512: two CTAs of a cluster, in random schedules (too many interleavings to visit)
    assert model.find_deadlock(n_chunks, a_grows, ranks=2, runs=300) is None


def drop(prog_index, op):
    """A mutation: the first `op` of program prog_index removed."""
    def mutate(progs):
        progs = [list(p) for p in progs]
        progs[prog_index].remove(op)
        return progs
    return mutate


def test_checker_finds_broken_block_slot_protocols():
    # block 0 not arriving for X_1 (which it does not read): X_1's slot is never refilled
    stuck = model.find_deadlock(3, False, blocks=True, mutate=drop(1, ("arrive", "emptyx1")))
    assert stuck is not None and "emptyx" in stuck
    # two ranks, rank 0's receiver of block 0 releasing the sender only after the partial has
    # landed: both wait for each other in the first chunk
    def late_pfree(progs):
        progs = [list(p) for p in progs]
        recv = progs[1]
        recv.remove(("arrive", "r1:pfree"))
        recv.insert(recv.index(("wait", "r0:pfull", 0)) + 1, ("arrive", "r1:pfree"))
        return progs
    stuck = model.find_deadlock(1, False, ranks=2, runs=20, mutate=late_pfree)
    assert stuck is not None and "pfree" in stuck
    # two ranks, rank 0's state warpgroup not releasing B_0 of the first chunk: when it would be
    # the last reader, nobody refills B_0, and every schedule of three chunks gets stuck
    def no_b0_release(progs):
        progs = [list(p) for p in progs]
        state = progs[0]
        state.remove(next(op for op in state if op[0] == "release" and op[1] == "r0:empty0"))
        return progs
    stuck = model.find_deadlock(3, False, ranks=2, runs=20, mutate=no_b0_release)
    assert stuck is not None and "full0" in stuck


def test_checker_finds_the_a_grows_hang_of_0e3d67e():
    # block 1 reading H_s(start) released H_s(mid) without waiting for it (design log v25)
    stuck = model.find_deadlock(3, True, block1_waits_mid=False)
    assert stuck is not None and "hs_empty1" in stuck
    assert model.find_deadlock(3, False, block1_waits_mid=False) is None
