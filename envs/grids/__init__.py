"""Grid worlds: Sokoban (with its room generator and exact solver), FrozenLake and 2048."""
