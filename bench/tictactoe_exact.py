"""Tic-tac-toe exactly: a trained policy's greedy play against a uniformly random player, per
seat, from the whole game tree instead of sampled games; and where it gives wins away.

400 sampled games (`impalajob evaluate --opponent random`) measure a win rate to about +-2
points; walking every line a random player can take, each weighted by its probability, has no
sampling error. Beside it, the best a player can do against a random one (a win-maximising
search, 99.5% first and 93.9% second) and the policy's costliest departures from it: the
position (the moves so far, PettingZoo's square numbers), its move, and the win probability the
move gives away times the probability of getting there.

    python bench/tictactoe_exact.py --run-dir runs/tictactoe
    python bench/tictactoe_exact.py --run-dir runs/tictactoe --checkpoint best --top 12 --json
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

Board = tuple[int, ...]
"""Nine squares in PettingZoo's numbering: 0 empty, 1 the first player's, 2 the second's."""
Moves = tuple[int, ...]
LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
EMPTY: Board = (0,) * 9


def winner(board: Board) -> int:
    """The player with three in a line, else 0."""
    for a, b, c in LINES:
        if board[a] and board[a] == board[b] == board[c]:
            return board[a]
    return 0


def play(board: Board, square: int, player: int) -> Board:
    return (*board[:square], player, *board[square + 1 :])


def free(board: Board) -> list[int]:
    return [i for i, s in enumerate(board) if not s]


@functools.cache
def best_win(board: Board, turn: int, me: int) -> float:
    """The highest probability `me` can win from here against a uniformly random opponent."""
    won = winner(board)
    if won or all(board):
        return float(won == me)
    values = [best_win(play(board, i, turn), 3 - turn, me) for i in free(board)]
    return max(values) if turn == me else sum(values) / len(values)


@dataclass
class Walk:
    """The policy's games from one seat against every line of a random player's."""

    policy: Any
    me: int
    regret: dict[tuple[Moves, int], float] = field(default_factory=dict)
    _rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))

    def outcome(self, moves: Moves, board: Board, turn: int, p: float) -> np.ndarray:
        """(win, draw, loss) probabilities from here, reached with probability `p`."""
        won = winner(board)
        if won:
            return p * np.array([won == self.me, 0, won != self.me], float)
        if all(board):
            return np.array([0.0, p, 0.0])
        if turn != self.me:
            squares = free(board)
            return sum(
                (self.outcome((*moves, i), play(board, i, turn), 3 - turn, p / len(squares))
                 for i in squares),
                np.zeros(3),
            )  # fmt: skip
        square = self._greedy(moves)
        best = max(best_win(play(board, i, turn), 3 - turn, self.me) for i in free(board))
        got = best_win(play(board, square, turn), 3 - turn, self.me)
        if got < best - 1e-12:
            self.regret[(moves, square)] = p * (best - got)
        return self.outcome((*moves, square), play(board, square, turn), 3 - turn, p)

    def _greedy(self, moves: Moves) -> int:
        action, _ = self.policy.act(_observation(moves), self._rng, explore=False)
        return int(action)


@functools.cache
def _observation(moves: Moves) -> Any:
    """What the player to move observes after `moves`, from PettingZoo's own env (its planes and
    action mask, whatever their layout)."""
    from pettingzoo.classic import tictactoe_v3

    env = tictactoe_v3.env()
    env.reset(seed=0)
    for m in moves:
        env.step(m)
    obs, *_ = env.last()
    env.close()
    return obs


def exact(policy: Any, top: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for me, seat in ((1, "first"), (2, "second")):
        walk = Walk(policy, me)
        win, draw, loss = walk.outcome((), EMPTY, 1, 1.0)
        worst = sorted(walk.regret.items(), key=lambda kv: -kv[1])[:top]
        out[seat] = {
            "win": win, "draw": draw, "loss": loss, "best_win": best_win(EMPTY, 1, me),
            "given_away": sum(walk.regret.values()),
            "costliest": [{"moves": list(m), "plays": s, "given_away": r} for (m, s), r in worst],
        }  # fmt: skip
    out["win"] = (out["first"]["win"] + out["second"]["win"]) / 2
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="a tic-tac-toe run")
    parser.add_argument("--checkpoint", default=None, help="e.g. best (default: the newest)")
    parser.add_argument("--policy", default=None, help="the policy (default: the run's first)")
    parser.add_argument("--top", type=int, default=8, help="costliest moves to list")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    from impala_trainer.policy.games import load_game_policies

    policies = load_game_policies(args.run_dir, args.checkpoint)
    policy = policies[args.policy] if args.policy else next(iter(policies.values()))
    result = exact(policy, args.top)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"greedy against a random player, both seats: {result['win']:.1%} won")
    for seat in ("first", "second"):
        r = result[seat]
        print(f"{seat}: won {r['win']:.1%}, drawn {r['draw']:.1%}, lost {r['loss']:.1%} "
              f"(the best possible wins {r['best_win']:.1%}; its moves give away "
              f"{r['given_away']:.1%})")  # fmt: skip
        for c in r["costliest"]:
            print(f"   {c['given_away']:.2%} after {c['moves']} plays {c['plays']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
