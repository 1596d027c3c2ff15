"""Puzzles with one right answer: the bandit, Countdown (with its expression solver) and
Sudoku (with its generator and solver)."""
