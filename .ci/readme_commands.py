"""Print the README's set-up commands, one per line: the fenced ```sh blocks of the
section "## Set-up: two commands", in order. CI runs exactly these (.ci/run), so the
README cannot drift from what is tested.

    python3 .ci/readme_commands.py [README.md]
"""

import re
import sys

HEADING = "## Set-up: two commands"


def setup_commands(text: str) -> list[str]:
    start = text.find(HEADING + "\n")
    if start < 0:
        raise SystemExit(f"README: no section {HEADING!r}")
    body = text[start + len(HEADING):]
    end = re.search(r"^## ", body, re.M)
    body = body[:end.start()] if end else body
    blocks = re.findall(r"^```sh\n(.*?)^```", body, re.M | re.S)
    commands = [b.strip() for b in blocks]
    if len(commands) != 2 or any("\n" in c or not c for c in commands):
        raise SystemExit(f"README: {HEADING!r} must hold two one-line ```sh blocks, "
                         f"found {commands}")
    return commands


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else "README.md"
    with open(path, encoding="utf-8") as f:
        print("\n".join(setup_commands(f.read())))
