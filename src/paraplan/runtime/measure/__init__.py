"""What a run measured and what it is held against: the timeline of actions, memory per rank, the
comparison with the simulator's prediction and the measured overheads, the single-process reference."""
