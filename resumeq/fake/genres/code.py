"""Python-like code: imports, then functions built from a small pool of statement blocks.

The blocks recur verbatim from function to function (``if item is None:`` / ``continue``,
``return None``), every function writes one of its lines twice in a row, and functions are
apart by two blank lines, as a model's code is.
"""

from __future__ import annotations

from collections.abc import Iterator

from resumeq.fake.genres.draws import Draws

INDENT = "    "
IMPORTS = "import os\nimport sys\nimport time\n\n"

_BLOCKS: tuple[tuple[str, ...], ...] = (
    ("for item in {x}:", "    if item is None:", "        continue", "    {v}.append(item)"),
    ("if not {y}:", "    return None"),
    ("try:", "    {v}.sort()", "except ValueError:", "    pass"),
    ('logger.debug("{w}")',),
    ("time.sleep(0.1)",),
    ("count += 1",),
    ("with open({x}) as handle:", "    data = handle.read()"),
    ("print({v})",),
)


def function(draws: Draws) -> list[str]:
    x, y, v = draws.word(), draws.word(), draws.word()
    lines = [f"def {draws.word()}_{draws.word()}({x}, {y}):"]
    if draws.chance(2):
        lines.append(INDENT + f'"""{draws.sentence(3, 7)}"""')
    lines.append(INDENT + f"{v} = []")
    for _ in range(draws.between(2, 4)):
        block = draws.choice(_BLOCKS)
        lines.extend(INDENT + line.format(x=x, y=y, v=v, w=draws.word()) for line in block)
    lines.append(INDENT + draws.choice((f"return {v}", "return None")))
    simple = [i for i, line in enumerate(lines) if i and not line.endswith(":")]
    doubled = draws.choice(simple)
    lines.insert(doubled, lines[doubled])
    return lines


def _class(draws: Draws) -> list[str]:
    attribute = draws.word()
    return [
        f"class {draws.word().capitalize()}:",
        INDENT + "def __init__(self):",
        INDENT * 2 + f"self.{attribute} = None",
        INDENT * 2 + f"self.{attribute} = None",
        INDENT * 2 + "self.count = 0",
    ]


def sections(draws: Draws) -> Iterator[str]:
    yield IMPORTS
    while True:
        lines = _class(draws) if draws.chance(5) else function(draws)
        yield "\n" + "\n".join(lines) + "\n\n"
