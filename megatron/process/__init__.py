"""What every process of a run needs around its work, for training and evaluation alike: the
process group (`distributed.py`, ranks from the launcher or Slurm in `ranks.py`, DeepSpeed's op
cache in `op_cache.py`), the heartbeat that ends every rank when one is lost, the stop that every
rank agrees on (`stop_signals.py`), the run's lock and the disk-room checks.

Below training/ and evaluation/ (both import it) and below launch/ (the launcher checks the same
locks and disk before it starts anything); it imports none of them.
"""
