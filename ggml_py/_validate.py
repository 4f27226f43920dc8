"""Field checks for the JSON formats of SCHED_CASES.md.

Each check raises CaseFormatError with a message that starts with `where`
(the tensor, backend or field being read) and says what is wrong.
"""

from ggml_py.errors import CaseFormatError

MAX_NAME_BYTES = 63     # GGML_MAX_NAME - 1
INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
SIZE_MAX = 2**64 - 1


def is_int(x):
    # JSON true/false load as bool, which Python counts as int
    return isinstance(x, int) and not isinstance(x, bool)


def fail(where, message):
    raise CaseFormatError(f"{where}: {message}")


def check_keys(d, required, optional, where):
    """`d` is an object with every required key and no unknown one."""
    if not isinstance(d, dict):
        fail(where, f"expected an object, got {type(d).__name__}")
    missing = [k for k in required if k not in d]
    if missing:
        fail(where, f"missing key{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}")
    unknown = [k for k in d if k not in required and k not in optional]
    if unknown:
        fail(where, f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}")


def check_int(value, where, field, minimum=None, maximum=None):
    """An integer in [minimum, maximum]; the bounds are those of the C field it goes to."""
    if not is_int(value):
        fail(where, f"{field} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        fail(where, f"{field} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        fail(where, f"{field} must be <= {maximum}, got {value}")
    return value


def check_bool(value, where, field):
    if not isinstance(value, bool):
        fail(where, f"{field} must be true or false, got {value!r}")
    return value


def check_str(value, where, field):
    if not isinstance(value, str):
        fail(where, f"{field} must be a string, got {value!r}")
    try:
        value.encode()
    except UnicodeEncodeError:
        fail(where, f"{field} {value!r} is not valid Unicode (a lone surrogate)")
    return value


def check_name(value, where, field, allow_empty=False):
    """A string that fits ggml's 64-byte name fields."""
    check_str(value, where, field)
    if not value and not allow_empty:
        fail(where, f"{field} must not be empty")
    if len(value.encode()) > MAX_NAME_BYTES:
        fail(where, f"{field} {value!r} is longer than {MAX_NAME_BYTES} bytes")
    return value


def check_list(value, where, field):
    if not isinstance(value, list):
        fail(where, f"{field} must be a list, got {value!r}")
    return value


def check_choice(value, choices, where, field):
    if not isinstance(value, str) or value not in choices:
        # list the choices only where there are few (not the ~100 ops)
        known = f"; expected one of {', '.join(sorted(choices))}" if len(choices) <= 30 else ""
        fail(where, f"unknown {field} {value!r}{known}")
    return value
