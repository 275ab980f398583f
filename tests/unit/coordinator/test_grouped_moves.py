"""A plan's moves to one server go as one migration (``ServerManager._grouped``): each
migration costs a round trip and both stores' rebuild whatever it carries."""

from types import SimpleNamespace

from equipoise.coordinator.arrivals import JoinServer
from equipoise.coordinator.pool import ServerPool
from equipoise.coordinator.server_manager import ServerManager, _as_list
from equipoise.policy.psld import AddServer, MoveBlock, RemoveServer


def grouped(actions, blocks=8, serving=(0, 1, 2)):
    pool = ServerPool.__new__(ServerPool)  # no transport: only the table and who serves
    pool.table, pool.serving = [0] * blocks, lambda: list(serving)
    return ServerManager._grouped(SimpleNamespace(pool=pool), actions)


def test_moves_to_one_server_become_one_migration_in_the_order_first_named():
    moves = [MoveBlock(1, 0, 2), MoveBlock(3, 1, 1), MoveBlock(5, 0, 2), MoveBlock(6, 0, 1)]
    assert grouped(moves) == [([1, 5], 2), ([3, 6], 1)]


def test_a_move_the_pool_would_refuse_stays_alone_and_splits_the_run():
    # block 9 does not exist, server 7 is not running: each is refused on its own (and
    # recorded as refused), the moves around it still carried out
    bad_block, bad_server = MoveBlock(9, 0, 1), MoveBlock(2, 0, 7)
    out = grouped([MoveBlock(1, 0, 1), bad_block, MoveBlock(2, 0, 1), bad_server, MoveBlock(4, 0, 1)])
    assert out == [([1], 1), bad_block, ([2], 1), bad_server, ([4], 1)]


def test_a_block_named_twice_and_other_actions_keep_their_order():
    join, add, remove = JoinServer(3, "ipc://x"), AddServer(), RemoveServer(2)
    out = grouped([MoveBlock(1, 0, 1), MoveBlock(1, 1, 2), add, MoveBlock(2, 0, 1), remove, join,
                   MoveBlock(4, 0, 3)], serving=(0, 1, 2))
    # block 1 again starts a new run; a move to server 3, joining in this list, is
    # checked (and so carried out) only after the join
    assert out == [([1], 1), ([1], 2), add, ([2], 1), remove, join, MoveBlock(4, 0, 3)]


def test_a_refused_migration_is_recorded_with_its_blocks():
    assert _as_list(([1, 5], 2)) == ["move", [1, 5], None, 2]
    assert _as_list(MoveBlock(1, 0, 2)) == ["move", 1, 0, 2]
