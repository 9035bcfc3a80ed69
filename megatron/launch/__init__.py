"""What `deepy.py` does, on the launching host: resolve and check the config, find the hosts, start
`train.py`/`eval.py` here or through DeepSpeed's runner, and supervise the launch (signals forwarded
to the workers, a remote launcher's output relayed, the shared-memory buffers it leaves removed).

The top of the package: it imports the trainer's and the evaluation's own checks so that a launch
refuses before any process starts; nothing imports it back. What every worker process needs at run
time (its process group, the run's lock, the heartbeat) is in megatron/process/, below both.
"""
