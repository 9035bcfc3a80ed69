"""The study's names for the positional schemes it compares: the report names (a run record's label) and
the words its prose uses for them. Shared by claims.py and paper_claims.py."""

LOG, POWER, ALIBI, T5, T5_128, ROTARY, SIN = ("kerple_log", "kerple_power_ap_", "alibi", "rpe (max distance L)", "rpe",
                                              "rotary", "sinusoidal")
PAPER_SIX = (LOG, POWER, ALIBI, T5, ROTARY, SIN)  # the schemes of the paper's Table 3 (T5: every bucket trained)
NAMES = {LOG: "KERPLE-log", POWER: "KERPLE-power", ALIBI: "ALiBi", T5: "T5", ROTARY: "rotary", SIN: "sinusoidal",
         T5_128: "T5 (max distance 128)"}
DOMAINS = ("code", "latex", "web")  # v2's groups, train length 64
V2_L = 64


def window(train_length: int) -> str:
    """The report name of kerple_log scored with a window of its train length (the paper's windowed@L)."""
    return f"{LOG} (window {train_length})"
