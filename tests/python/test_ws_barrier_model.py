"""scripts/ws_barrier_model.py: the specialised fused_walk kernel's mbarrier protocol has no
deadlock in any interleaving of its warpgroups, in both of its forms (CPU only); the checker finds
the one of 0e3d67e."""
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


def test_checker_finds_the_a_grows_hang_of_0e3d67e():
    # block 1 reading H_s(start) released H_s(mid) without waiting for it (design log v25)
    stuck = model.find_deadlock(3, True, block1_waits_mid=False)
    assert stuck is not None and "hs_empty1" in stuck
    assert model.find_deadlock(3, False, block1_waits_mid=False) is None
