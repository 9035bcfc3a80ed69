"""One file per multi-node launcher (how DeepSpeed's runner reaches other hosts, and how the
processes it starts learn their rank): see registry.py. Torch-free and importing nothing of ours
but errors.py, so the config (its `launcher` choices), the process group (ranks) and deepy.py
(the runner's command line and environment) all read the same files."""
from .base import Launcher, LaunchRanks
from .registry import launcher, launcher_names, launchers, register_launcher

__all__ = ["LaunchRanks", "Launcher", "launcher", "launcher_names", "launchers", "register_launcher"]
