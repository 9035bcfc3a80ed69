"""JSON from elsewhere (a downloaded model's config.json, its sharded index and tokenizer.json, a
checkpoint's manifest) read with limits and one message, the JSON sibling of untrusted_yaml.py.

json itself has no size or depth limit: a multi-GiB file is read whole, a value nested a few
thousand levels deep overflows the parser's recursion (a RecursionError traceback), and a file
cut short or with a flipped byte raises ValueError/UnicodeDecodeError with no file named. Here:

- the file is read up to `max_bytes` + 1 (a device or a huge file is refused without reading it);
- any parse failure, the recursion included, is ONE error naming the file and what it should be;
- `expect_type` checks the top-level value (a list where a mapping belongs is refused here, not
  as an AttributeError further on). Deeper values are each reader's schema to check.
"""
from __future__ import annotations

import json

from megatron.errors import UserError


def read_json(path: str, what: str, max_bytes: int, error=UserError, fix: str = "", expect_type=dict):
    """The JSON value in `path` (`what`: "a checkpoint manifest", ...), or `error` naming the file,
    the problem and `fix`. OSError (a missing file) is left to the caller, which knows what it means."""
    with open(path, "rb") as f:
        raw = f.read(max_bytes + 1)
    tail = f"; {fix}" if fix else ""
    if len(raw) > max_bytes:
        raise error(f"{path} is over {max_bytes >> 20} MiB, far more than {what} holds (the limit): is it the "
                    f"file you meant?{tail}")
    try:
        value = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise error(f"{path} is not readable as {what}: values nested thousands of levels deep "
                    f"(RecursionError){tail}") from None
    except UnicodeDecodeError as e:
        raise error(f"{path} is not readable as {what}: byte {e.start} is not UTF-8 text (a damaged or binary "
                    f"file){tail}") from None
    except ValueError as e:  # json.JSONDecodeError: cut short, a flipped byte, not JSON at all
        raise error(f"{path} is not readable as {what}: not valid JSON ({e}){tail}") from None
    if expect_type is not None and not isinstance(value, expect_type):
        raise error(f"{path} is not {what}: its top level is {json_type(value)}, not {json_type(expect_type())}"
                    f"{tail}")
    return value


_JSON_NAMES = ((type(None), "null"), (bool, "a boolean"), (int, "an integer"), (float, "a number"),
               (str, "a string"), (list, "an array"), (dict, "an object"))  # bool before int: a bool is an int


def json_type(value) -> str:
    """The JSON name of a parsed value's type, for messages ('a string', 'an object', ...)."""
    return next((name for kind, name in _JSON_NAMES if isinstance(value, kind)), type(value).__name__)
