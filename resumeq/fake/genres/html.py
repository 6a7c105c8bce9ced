"""HTML, as a model writes it when asked for a web page: markup with inline scripts, event
handler attributes, entities and fences — the text a console must show as text, never run.

Sections recur (a card, a list item, a ``<script>`` block, an ``<img onerror>``), each
close to what models repeat when they build a page out of the same component.
"""

from __future__ import annotations

from collections.abc import Iterator

from resumeq.fake.genres.draws import Draws

OPENING = "Here is the page you asked for:\n\n```html\n<!doctype html>\n<html>\n<body>\n"


def _card(draws: Draws) -> str:
    title, word = draws.word().capitalize(), draws.word()
    return (
        f'<div class="card" id="{word}">\n'
        f"  <h2>{title} &amp; {draws.word()}</h2>\n"
        f"  <p>{draws.sentence(6, 12)} &lt;{word}&gt;</p>\n"
        "</div>\n"
    )


def _script(draws: Draws) -> str:
    return (
        f"<script>\n  document.title = \"{draws.word()}\";\n  alert('{draws.word()}');\n</script>\n"
    )


def _image(draws: Draws) -> str:
    word = draws.word()
    return f'<img src="{word}.png" onerror="alert(\'{word}\')" alt="{draws.word()}">\n'


def _list(draws: Draws) -> str:
    items = "".join(
        f'  <li><a href="javascript:alert(1)">{draws.word()}</a></li>\n'
        for _ in range(draws.between(2, 4))
    )
    return f"<ul>\n{items}</ul>\n"


def sections(draws: Draws) -> Iterator[str]:
    yield OPENING
    yield _script(draws)
    yield _image(draws)
    yield _card(draws)
    yield _list(draws)
    yield _script(draws)
    yield _image(draws)
    while True:
        kind = draws.between(0, 3)
        yield (_card, _script, _image, _list)[kind](draws)
