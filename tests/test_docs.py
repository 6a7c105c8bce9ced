"""The README and docs/ say what is there: every ``resumeq`` command and option they show
exists in the CLI, every TOML example parses and is a config the settings model takes,
every config key they name exists (and configuration.md names every one), every relative
link resolves, docs/jobspec.md is what the generator writes from the model, and the
README's five minutes run as it says."""

from __future__ import annotations

import difflib
import json
import re
import shlex
import tomllib
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
import redis
from pydantic import BaseModel
from worker_support import attempt_runner, run_to_rest

from resumeq import docs
from resumeq.cli import cli
from resumeq.core.settings import ConfigFile, ServerSettings, ServerToken
from resumeq.fake import FakeProvider
from resumeq.producer.client import Client
from resumeq.testing import RedisServer

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = (README, *sorted((ROOT / "docs").glob("*.md")))


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


@dataclass(frozen=True)
class Page:
    path: Path
    blocks: tuple[Block, ...]
    #: The text outside fenced blocks, with each block's lines left empty (lines keep
    #: their numbers).
    prose: str

    def spans(self) -> Iterator[tuple[int, str]]:
        """Inline code spans of the prose, white space runs made one space."""
        for m in re.finditer(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", self.prose, re.DOTALL):
            if "\n\n" not in m.group(2):
                yield self.prose.count("\n", 0, m.start()) + 1, " ".join(m.group(2).split())


def read(path: Path) -> Page:
    return parse(path, path.read_text(encoding="utf-8"))


def parse(path: Path, text: str) -> Page:
    lines = text.splitlines()
    blocks, prose, opened, body = [], [], None, []
    for number, line in enumerate(lines, 1):
        fence = re.match(r"^```(\S*)\s*$", line)
        if opened is None and fence:
            opened, body = (number, fence.group(1)), []
        elif opened is not None and line.startswith("```"):
            blocks.append(Block(path, opened[0], opened[1], "\n".join(body)))
            opened = None
        elif opened is not None:
            body.append(line)
        else:
            prose.append((number, line))
            continue
        prose.append((number, ""))
    assert opened is None, f"{path}: a code block opened at line {opened[0]} is never closed"
    return Page(path, tuple(blocks), "\n".join(line for _, line in prose))


def pages() -> list[Page]:
    return [read(path) for path in PAGES]


def where(page: Page, line: int) -> str:
    return f"{page.path.relative_to(ROOT)}:{line}"


# -- commands and options -------------------------------------------------------------------


def logical_lines(text: str) -> Iterator[str]:
    """A shell block's commands: lines joined where they end in a backslash or a quote is
    still open."""
    pending = ""
    for line in text.splitlines():
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # no closing quotation yet
            pending += "\n"
            continue
        yield pending
        pending = ""
    if pending:
        yield pending


_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def invocations(command_line: str) -> Iterator[list[str]]:
    """The arguments of every ``resumeq`` the line runs (also inside ``$(...)``, after
    ``|`` or ``;``; not as a word of another command, such as ``--queue resumeq``)."""
    lexer = shlex.shlex(command_line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words: list[str] = []
    for token in [*lexer, ";"]:
        if token and all(c in "();<>|&" for c in token):
            while words and _ASSIGNMENT.match(words[0]):
                words.pop(0)
            if words and words[0] == "resumeq":
                yield words[1:]
            words = []
        else:
            words.append(token)


def _option(params: list[click.Parameter], name: str) -> click.Option | None:
    for param in params:
        if isinstance(param, click.Option) and name in (*param.opts, *param.secondary_opts):
            return param
    return None


def check_invocation(args: list[str]) -> list[str]:
    """What is wrong with ``resumeq ARGS``: commands and options the CLI does not have."""
    command: click.Command = cli
    path, params, problems = ["resumeq"], list(cli.params), []
    i = 0
    while i < len(args):
        word = args[i]
        if word.startswith("-") and len(word) > 1:
            name = word.split("=", 1)[0]
            option = _option(params, name)
            if option is None and name != "--help":
                problems.append(f"`{' '.join(path)}` has no option {name}")
            elif option is not None and not option.is_flag and not option.count:
                i += 0 if "=" in word else 1  # its value
        elif isinstance(command, click.Group):
            sub = command.commands.get(word)
            if sub is None:
                problems.append(f"`{' '.join(path)}` has no command {word!r}")
                break
            command, params = sub, [*params, *sub.params]
            path.append(word)
        i += 1
    return problems


def every_option() -> set[str]:
    def walk(command: click.Command) -> Iterator[str]:
        for param in command.params:
            if isinstance(param, click.Option):
                yield from (*param.opts, *param.secondary_opts)
        if isinstance(command, click.Group):
            for sub in command.commands.values():
                yield from walk(sub)

    return {*walk(cli), "--help"}


def command_problems(page: Page) -> list[str]:
    return [*_block_problems(page), *_span_problems(page)]


def _block_problems(page: Page) -> Iterator[str]:
    for block in page.blocks:
        if block.lang not in ("sh", "bash", "shell", "console"):
            continue
        for command_line in logical_lines(block.text):
            for args in invocations(command_line):
                yield from (f"{block.where}: {p}" for p in check_invocation(args))


def _span_problems(page: Page) -> Iterator[str]:
    options = every_option()
    for line, span in page.spans():
        words = span.split()
        if words[0] == "resumeq":
            try:
                args = shlex.split(span)[1:]
            except ValueError:
                args = words[1:]
            yield from (f"{where(page, line)}: {p}" for p in check_invocation(args))
        elif re.match(r"^--?[a-z]", words[0]):
            for name in words[0].split("/"):  # `--droppable/--no-droppable`
                if name.split("=", 1)[0] not in options:
                    yield f"{where(page, line)}: no resumeq command has {name}"


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_and_option_shown_exists(path: Path) -> None:
    problems = command_problems(read(path))
    assert not problems, "\n".join(problems)


def test_the_command_check_sees_commands_in_every_place_a_page_puts_them() -> None:
    """Shell lines, ``$(...)``, pipes, continuations and inline spans are all read; another
    command's word ``resumeq`` is not taken for one."""
    page = parse(
        ROOT / "x.md",
        "```sh\n"
        "id=$(resumeq enqueue --provider p --model m --budget 9 --prompt 'x --nope')\n"
        "resumeq spill export --reason floor > out.jsonl   # resumeq bogus --in-a-comment\n"
        "resumeq jobs --state queued --queue resumeq --limit 2 \\\n"
        "  --wrong-option\n"
        "resumeq spil list\n"
        "```\n"
        "Prose: `resumeq status ID --json`, `resumeq cancel --budget 3`, `--older-then`.\n",
    )
    assert sorted(command_problems(page)) == sorted(
        [
            "x.md:1: `resumeq jobs` has no option --wrong-option",
            "x.md:1: `resumeq` has no command 'spil'",
            "x.md:8: `resumeq cancel` has no option --budget",
            "x.md:8: no resumeq command has --older-then",
        ]
    )


# -- configuration ----------------------------------------------------------------------------


def unknown_keys(data: Mapping[str, Any], model: type[BaseModel], at: str = "") -> list[str]:
    """The keys of ``data`` (a TOML table) that ``model`` has no field for, at any depth."""
    out = []
    for key, value in data.items():
        field = model.model_fields.get(key)
        if field is None:
            out.append(f"{at}{key}")
        else:
            out += _unknown_in(value, field.annotation, f"{at}{key}.")
    return out


def _unknown_in(value: Any, annotation: Any, at: str) -> list[str]:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return unknown_keys(value, annotation, at) if isinstance(value, Mapping) else []
    if origin in (typing.Union, types.UnionType):
        return next(
            (found for a in args if a is not type(None) for found in [_unknown_in(value, a, at)]),
            [],
        )
    if origin is dict and isinstance(value, Mapping):
        return [k for name, v in value.items() for k in _unknown_in(v, args[1], f"{at}{name}.")]
    if origin is tuple and isinstance(value, list):
        return [k for n, v in enumerate(value) for k in _unknown_in(v, args[0], f"{at}[{n}].")]
    return []


def toml_blocks() -> list[Block]:
    return [b for page in pages() for b in page.blocks if b.lang == "toml"]


@pytest.mark.parametrize("block", toml_blocks(), ids=lambda b: b.where)
def test_every_toml_example_is_a_config_the_settings_take(block: Block) -> None:
    """Every key exists, and the block as a whole is a valid config file (a file of one
    section is one: every other section has its defaults)."""
    try:
        data = tomllib.loads(block.text)
    except tomllib.TOMLDecodeError as exc:
        pytest.fail(f"{block.where}: not TOML: {exc}")
    unknown = unknown_keys(data, ConfigFile)
    assert not unknown, f"{block.where}: no such config key: {', '.join(unknown)}"
    ConfigFile.model_validate(data)


def test_the_key_check_names_a_key_the_settings_lack() -> None:
    data = tomllib.loads(
        '[providers.p]\nkind = "fake"\nbase_url = "http://h"\nprices = { input = 1, outptu = 2 }\n'
        '[server]\ntokens = [{ sha256 = "0", role = "viewer", nme = "x" }]\n[wroker]\n'
    )
    assert unknown_keys(data, ConfigFile) == [
        "providers.p.prices.outptu",
        "server.tokens.[0].nme",
        "wroker",
    ]


#: ``[section] key`` in prose: a key of a section of the config file.
_KEY_SPAN = re.compile(r"^\[([a-z_]+)\](?: ([a-z_]+))?")


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_config_key_named_in_prose_exists(path: Path) -> None:
    page, problems = read(path), []
    sections = ConfigFile.model_fields
    for line, span in page.spans():
        m = _KEY_SPAN.match(span)
        if m is None:
            continue
        section, key = m.groups()
        field = sections.get(section)
        model = field.annotation if field is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            problems.append(f"{where(page, line)}: no config section [{section}]")
        elif key is not None and key not in model.model_fields:
            problems.append(f"{where(page, line)}: [{section}] has no key {key}")
    assert not problems, "\n".join(problems)


def documented_keys() -> dict[str, set[str]]:
    """configuration.md's keys: each ``## `[section]` `` heading's tables' first column."""
    out: dict[str, set[str]] = {}
    section = None
    for line in (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8").splitlines():
        heading = re.match(r"^## `\[(\w+)(?:\.NAME)?\]`", line)
        if heading:
            section = heading.group(1)
            out[section] = set()
        elif line.startswith("## "):
            section = None
        elif section is not None and (cell := re.match(r"^\| `(\w+)` \|", line)):
            out[section].add(cell.group(1))
    return out


def test_configuration_md_names_every_key_of_every_section() -> None:
    expected: dict[str, set[str]] = {}
    for name, field in ConfigFile.model_fields.items():
        annotation = field.annotation
        if name == "providers":
            annotation = typing.get_args(annotation)[1]
        assert isinstance(annotation, type) and issubclass(annotation, BaseModel)
        expected[name] = set(annotation.model_fields)
    expected["server"] = set(ServerSettings.model_fields) | set(ServerToken.model_fields)
    documented, problems = documented_keys(), []
    for section in sorted(expected.keys() | documented.keys()):
        have, want = documented.get(section, set()), expected.get(section, set())
        problems += [f"[{section}] {key}: not in docs/configuration.md" for key in want - have]
        problems += [f"[{section}] {key}: the settings have no such key" for key in have - want]
    assert not problems, "\n".join(sorted(problems))


# -- links ------------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(page: Page) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in page.prose.splitlines():
        m = re.match(r"^#{1,6} (.+)$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    page, problems = read(path), []
    prose = re.sub(r"(`+)(?!`).+?(?<!`)\1(?!`)", "", page.prose)  # not inside code spans
    for m in re.finditer(r"!?\[[^\]]*\]\(([^)\s]+)\)", prose):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        line = prose.count("\n", 0, m.start()) + 1
        if not resolved.is_file():
            problems.append(f"{where(page, line)}: {target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(read(resolved)):
            problems.append(f"{where(page, line)}: {target}: no such heading")
    assert not problems, "\n".join(problems)


def test_the_readme_links_every_page_of_docs() -> None:
    linked = set(re.findall(r"\]\(docs/([^)#]+\.md)", README.read_text(encoding="utf-8")))
    assert linked == {p.name for p in PAGES if p.parent.name == "docs"}


# -- the README -------------------------------------------------------------------------------


def test_the_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 200, f"README.md is {lines} lines: move the detail to docs/"


def test_ci_runs_what_the_readme_tells_a_newcomer_to_run() -> None:
    two_commands = read(README).blocks[0].text
    assert "make test" in two_commands
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    assert script[-1] == "make test"


def test_the_readmes_five_minutes_go_as_it_says(
    redis_server: RedisServer, fake: FakeProvider
) -> None:
    """The README's profile, pasted, against the fake; its cut stream (the fault it queues)
    and what it says `status --json` then shows: the attempts, their cuts and counts."""
    page = read(README)
    profile = next(b for b in page.blocks if b.lang == "toml" and 'kind = "fake"' in b.text)
    providers = tomllib.loads(profile.text)["providers"]
    (name,) = providers
    served = re.search(r"^resumeq fake-provider --port (\d+)", README.read_text(), re.MULTILINE)
    assert served is not None
    assert providers[name]["base_url"] == f"http://127.0.0.1:{served.group(1)}/v1"
    providers[name]["base_url"] = fake.openai_base_url
    cut = next(b for b in page.blocks if "/_fake/faults" in b.text)
    fault = re.search(r"-d '(\[.*?\])'", cut.text, re.DOTALL)
    assert fault is not None
    fake.add_faults(json.loads(fault.group(1)))
    shown = [
        line[2:].split() for line in cut.text.splitlines() if re.match(r"^# \w+ \w+ \d+$", line)
    ]
    enqueue = next(args for line in logical_lines(cut.text) for args in invocations(line))
    options = dict(zip(enqueue[1::2], enqueue[2::2], strict=False))
    spec = {
        "provider": options["--provider"],
        "model": options["--model"],
        "budget_tokens": int(options["--budget"]),
        "prompt": options["--prompt"],
    }
    assert spec["provider"] == name
    redis.Redis.from_url(redis_server.url).flushall()
    with attempt_runner(redis_server.url, providers) as runner:
        job_id = Client(runner.store.redis).enqueue(spec)
        record = run_to_rest(runner, job_id)
        attempts = runner.store.ledger(job_id)
        text = runner.store.snapshot(job_id)[1]
    assert record.state.value == "done"
    assert [[a["kind"], a["cut"], str(a["output_tokens"])] for a in attempts] == shown
    assert text == fake.canonical_text([{"role": "user", "content": spec["prompt"]}])


# -- the generated reference ------------------------------------------------------------------


def test_jobspec_md_is_what_the_generator_writes() -> None:
    written = (ROOT / "docs" / "jobspec.md").read_text(encoding="utf-8")
    now = docs.jobspec_reference()
    diff = "".join(
        list(
            difflib.unified_diff(
                written.splitlines(keepends=True),
                now.splitlines(keepends=True),
                "docs/jobspec.md",
                "resumeq.docs.jobspec_reference()",
            )
        )[:40]
    )
    assert written == now, (
        "docs/jobspec.md differs from what the model says: write it again with `make docs` "
        f"(python -m resumeq.docs > docs/jobspec.md)\n{diff}"
    )


def test_the_reference_has_every_field_of_every_model() -> None:
    text = docs.jobspec_reference()
    for model, _ in docs.MODELS:
        for name, field in model.model_fields.items():  # by the name JSON spells it
            assert f"### `{field.alias or name}`" in text, f"{model.__name__}.{name}"
    assert "`[limits] max_budget_tokens` (65536 by default)" in text
    assert "`[limits] max_schema_bytes` (65536 by default)" in " ".join(text.split())


def test_a_validated_field_with_no_written_rule_stops_the_generator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rules = {key: value for key, value in docs.RULES.items() if key[1] != "model"}
    monkeypatch.setattr(docs, "RULES", rules)
    with pytest.raises(RuntimeError, match="JobSpec: write the rules of model"):
        docs.jobspec_reference()
