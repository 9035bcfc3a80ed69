"""pdsh (NeoX's default): the runner starts one DeepSpeed launcher per host over ssh, which sets
RANK/WORLD_SIZE/LOCAL_RANK for every process; nothing more to say."""
from .base import Launcher
from .registry import register_launcher


@register_launcher
class Pdsh(Launcher):
    name = "pdsh"
    summary = "ssh to every host through pdsh (NeoX's default)"
